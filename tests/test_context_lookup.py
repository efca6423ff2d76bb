"""Context lookup on literal token sequences."""

from __future__ import annotations

from codespec.core.draft import ProposeContext
from codespec.proposers.context import ContextLookup


def propose(proposer, tokens, max_len=4):
    return proposer.propose(ProposeContext(tokens, prompt_len=len(tokens), max_len=max_len))


def test_longest_suffix_match_wins():
    proposer = ContextLookup(max_ngram=4, min_ngram=1)
    # "1 2" occurs followed by 9; "7 1 2" (longer) occurs followed by 5.
    tokens = [7, 1, 2, 5, 6, 0, 1, 2, 9, 3, 7, 1, 2]
    draft = propose(proposer, tokens)
    assert draft.token_ids == (5, 6, 0, 1) and draft.match.match_len == 3


def test_most_recent_occurrence_preferred():
    proposer = ContextLookup(max_ngram=2, min_ngram=2)
    tokens = [1, 2, 3, 0, 1, 2, 4, 0, 1, 2]
    assert propose(proposer, tokens, 2).token_ids == (4, 0)


def test_no_match_means_no_draft_and_min_ngram_is_respected():
    proposer = ContextLookup(max_ngram=4, min_ngram=2)
    assert propose(proposer, [1, 2, 3, 4, 5]).is_empty
    assert propose(ContextLookup(max_ngram=4, min_ngram=2), [1, 9, 3, 1]).is_empty  # only a 1-gram match


def test_incremental_growth_matches_fresh_proposer():
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    growing = ContextLookup(max_ngram=3, min_ngram=1)
    growing.begin(tokens[:2])
    for end in range(2, len(tokens) + 1):
        fresh = ContextLookup(max_ngram=3, min_ngram=1)
        assert propose(growing, tokens[:end]) == propose(fresh, tokens[:end])


def test_a_loop_is_drafted_to_full_length():
    proposer = ContextLookup(max_ngram=3, min_ngram=2)
    tokens = [9, 1, 2, 3, 1, 2, 3, 1, 2]  # period-3 loop: the latest "1 2" ends one token from the end
    assert propose(proposer, tokens, 7).token_ids == (3, 1, 2, 3, 1, 2, 3)
