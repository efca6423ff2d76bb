"""The outputs lookup (proposers/outputs.py): the context rule over the session's earlier outputs."""

from __future__ import annotations

from codespec.core.draft import ProposeContext
from codespec.proposers.outputs import OutputsLookup, RecentOutputs
from codespec.proposers.setup import ProposerSetup, RequestContext


def propose(outputs: RecentOutputs, tokens: list[int], max_len: int = 8):
    return OutputsLookup(outputs).propose(ProposeContext(tokens, len(tokens), max_len))


def test_drafts_what_followed_the_longest_match_in_the_newest_output_holding_it():
    outputs = RecentOutputs()
    outputs.add([1, 2, 3, 4, 5, 6])
    outputs.add([7, 2, 3, 9, 9])
    draft = propose(outputs, [0, 2, 3])  # "2 3" is in both: the newest wins
    assert draft.token_ids == (9, 9) and draft.proposer == "outputs"
    assert draft.match.match_len == 2 and draft.match.source == "outputs"
    assert propose(outputs, [0, 1, 2, 3]).token_ids == (4, 5, 6)  # the longer match wins over the newer
    assert propose(outputs, [0, 1, 2, 3], max_len=2).token_ids == (4, 5)


def test_a_draft_stops_at_its_output_s_end_and_no_match_crosses_two_outputs():
    outputs = RecentOutputs()
    outputs.add([1, 2, 3, 4])
    outputs.add([5, 6, 7, 8])
    assert propose(outputs, [2, 3]).token_ids == (4,)
    assert not len(propose(outputs, [3, 4]))  # nothing followed it: the next output is not its continuation
    assert not len(propose(outputs, [4, 5]))  # an n-gram across two outputs was never written


def test_the_store_keeps_the_newest_outputs_within_its_bound():
    outputs = RecentOutputs(max_tokens=60)
    for n in range(40):
        outputs.add([1000 + n, 2000 + n, 3000 + n, 4000 + n, 5000 + n])
        assert outputs.tokens <= 90  # rebuilt down to the bound once half as many again is kept
    assert propose(outputs, [1039, 2039]).token_ids == (3039, 4039, 5039)
    assert not len(propose(outputs, [1000, 2000]))  # dropped
    assert outputs.added == 40 and len(outputs) <= 15


def test_outputs_too_short_to_draft_from_are_not_kept():
    outputs = RecentOutputs()
    outputs.add([1, 2])
    assert outputs.added == 0 and outputs.tokens == 0


def test_auto_adds_it_when_the_session_keeps_outputs():
    from codespec.proposers.auto import build_auto

    setup = ProposerSetup(None).for_request(RequestContext(outputs=RecentOutputs()))
    assert [sub.name for sub in build_auto(setup, models=[]).subs] == ["context", "outputs"]


def test_clearing_forgets_every_output():
    outputs = RecentOutputs()
    outputs.add([1, 2, 3, 4])
    outputs.clear()
    assert len(outputs) == 0 and outputs.tokens == 0 and not len(propose(outputs, [1, 2]))
    outputs.add([5, 6, 7])
    assert propose(outputs, [5, 6]).token_ids == (7,)
