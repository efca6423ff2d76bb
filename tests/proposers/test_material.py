"""The material lookup (proposers/material.py): the context rule over chunks a request carries."""

from __future__ import annotations

from codespec.core.draft import ProposeContext
from codespec.proposers.material import ChunkTables, MaterialLookup
from codespec.proposers.setup import ProposerSetup, RequestContext


def propose(lookup: MaterialLookup, tokens: list[int], max_len: int = 8):
    return lookup.propose(ProposeContext(tokens, len(tokens), max_len))


def test_drafts_what_followed_the_longest_match_in_a_chunk():
    lookup = MaterialLookup([(1, 2, 3, 4, 5, 6), (9, 3, 4, 7, 8)], tables=ChunkTables())
    draft = propose(lookup, [0, 2, 3, 4])  # "2 3 4" occurs in the first chunk only: the longest match wins
    assert draft.token_ids == (5, 6) and draft.proposer == "material"
    assert draft.match.match_len == 3 and draft.match.source == "material"


def test_the_newest_chunk_wins_among_equal_matches_and_drafts_are_capped():
    lookup = MaterialLookup([(3, 4, 5, 5, 5), (3, 4, 6, 6, 6)], tables=ChunkTables())
    assert propose(lookup, [3, 4]).token_ids == (6, 6, 6)
    assert propose(lookup, [3, 4], max_len=2).token_ids == (6, 6)


def test_no_match_and_no_material_draft_nothing():
    assert not len(propose(MaterialLookup([(1, 2, 3)], tables=ChunkTables()), [7, 8]))
    assert not len(propose(MaterialLookup([], tables=ChunkTables()), [1, 2]))


def test_a_chunks_table_is_built_once_and_the_cache_is_bounded():
    tables = ChunkTables(max_chunks=2)
    chunk = (1, 2, 3, 4)
    assert tables.table(chunk, 2, 8) is tables.table(chunk, 2, 8)
    tables.table((5, 6, 7), 2, 8)
    tables.table((8, 9, 10), 2, 8)
    assert len(tables._tables) == 2


def test_auto_adds_it_when_the_request_carries_material():
    from codespec.proposers.auto import build_auto

    setup = ProposerSetup(None).for_request(RequestContext(material=((1, 2, 3),)))
    names = [sub.name for sub in build_auto(setup, models=[]).subs]
    assert names == ["context", "material"]
    assert [sub.name for sub in build_auto(ProposerSetup(None), models=[]).subs] == ["context"]
