"""The context lookup's n-gram table: a prompt indexed at once (numpy) keys every n-gram exactly as
the per-token loop does, latest end kept, so drafts do not depend on how the tokens arrived."""

import random

import pytest

from codespec.core.draft import ProposeContext
from codespec.proposers import context
from codespec.proposers.context import ContextLookup


@pytest.mark.parametrize("min_ngram", [2, 1])
@pytest.mark.parametrize("seed", range(40))
def test_indexing_at_once_and_token_by_token_build_the_same_table(seed, min_ngram, monkeypatch):
    """A prompt left unindexed (searched as bytes) and then indexed at once drafts as the per-token
    loop does at every step, and ends with the loop's tables."""
    rng = random.Random(seed)
    prompt = rng.randrange(2, 400)
    grown = prompt + rng.randrange(1, 120)
    steps = 18
    # a cheap index, so that the searched prompt is indexed at varying steps of the run (or at once)
    monkeypatch.setattr(context, "INDEX_SCANS", rng.choice([0, 10, 40]))
    tokens = [rng.randrange(6) for _ in range(grown + steps)]
    views = [tokens[:prompt], *(tokens[:end] for end in range(grown, grown + steps + 1))]
    looped, at_once = ContextLookup(min_ngram=min_ngram), ContextLookup(min_ngram=min_ngram)
    for lookup, vector_from in ((looped, 10**9), (at_once, 1)):
        monkeypatch.setattr(context, "VECTOR_FROM", vector_from)
        lookup.drafts = [lookup.propose(ProposeContext(view, 0, 8)) for view in views]
    left_unindexed = at_once._unindexed_upto
    if left_unindexed:  # every draft came from the tables: the search never had to run
        at_once._index_unindexed()
    assert at_once._latest_end == looped._latest_end
    assert at_once.drafts == looped.drafts
    assert any(len(d) for d in looped.drafts) or prompt < 20  # six symbols repeat: there are matches


def test_a_prompt_is_searched_until_its_searches_have_cost_what_indexing_it_does():
    """Rent or buy: a short request never pays for indexing its prompt; a long one indexes it once
    its searches have scanned as much as indexing costs."""
    rng = random.Random(7)
    tokens = [rng.randrange(40) for _ in range(300)]
    lookup = ContextLookup()
    lookup.propose(ProposeContext(tokens, 0, 8))
    assert lookup._unindexed_upto == 299 and not any(lookup._latest_end)  # the first step indexes nothing
    budget = context.INDEX_SCANS * 299
    steps = 0
    while lookup._unindexed_upto and steps < 1000:
        spent = lookup._search_scans
        tokens = tokens + [rng.randrange(40)]
        lookup.propose(ProposeContext(tokens, 0, 8))
        steps += 1
        assert lookup._unindexed_upto == 0 or spent < budget  # not indexed before it has paid for it
    assert spent >= budget and len(lookup._latest_end[2]) > 250  # indexed once it had
    assert 30 < steps < 200  # a search costs SEARCH_SCANS and a scan of at most the prompt


def test_numpy_token_ids_draft_like_python_ints():
    """A caller may hand the sequence as numpy ints (a vLLM row's slice): the keys are Python ints."""
    import numpy as np

    tokens = [5, 6, 7, 8, 1, 2, 5, 6, 7] * 10
    plain = ContextLookup().propose(ProposeContext(tokens, 0, 8))
    numpy_ids = ContextLookup().propose(ProposeContext(list(np.array(tokens, dtype=np.int64)), 0, 8))
    assert plain == numpy_ids and len(plain) == 8


def longest_latest(tokens, first, max_len, low=2, high=8):
    """The context rule by its definition: the longest suffix (``low``..``high`` tokens) that occurred
    before, wholly at or after ``first``, its latest occurrence's continuation (a loop continued)."""
    length = len(tokens)
    for n in range(min(high, length - first - 1), low - 1, -1):
        suffix = tokens[length - n :]
        for end in range(length - 1, first + n - 1, -1):
            if tokens[end - n : end] == suffix:
                return context.periodic_continuation(tokens, end, max_len), n
    return (), None


@pytest.mark.parametrize("seed", range(30))
def test_drafts_follow_the_rule_however_the_tokens_arrive(seed):
    """Whatever the alphabet (few symbols: long matches; many: short ones) and however the tokens
    arrive (one, a few, a long stretch indexed at once), each draft is the rule's, from anywhere
    and from the output only (the copy pointer's inserted text)."""
    rng = random.Random(seed)
    symbols = rng.choice([4, 12, 40])
    tokens = [rng.randrange(symbols) for _ in range(rng.randrange(2, 300))]
    prompt_len = len(tokens)
    lookup = ContextLookup()
    for _ in range(40):
        for whole, first in ((True, 0), (False, prompt_len)):
            if whole:
                draft = lookup.propose(ProposeContext(tokens, prompt_len, 8))
            else:
                draft = lookup.propose_within(tokens, first, 8)
            expected, match_len = longest_latest(tokens, first, 8)
            assert draft.token_ids == expected
            assert (draft.match.match_len if draft.match is not None else None) == match_len
        tokens = tokens + [rng.randrange(symbols) for _ in range(rng.choice([1, 1, 3, 60]))]


def test_a_byte_match_across_token_boundaries_is_no_occurrence():
    """In the unindexed prompt's bytes, [256, 0] holds the bytes of [1, 0] one byte in: not a match."""
    filler = list(range(1000, 1060))
    tokens = [256, 0, 0, 7, *filler, 1, 0]  # [1, 0] occurs only as the tail itself
    draft = ContextLookup().propose(ProposeContext(tokens, 0, 8))
    assert draft.token_ids == () and draft.match is None
    tokens = [1, 0, 9, 256, 0, 0, 7, *filler, 1, 0]  # a true occurrence before the false one
    draft = ContextLookup().propose(ProposeContext(tokens, 0, 4))
    assert draft.token_ids == (9, 256, 0, 0) and draft.match.match_len == 2
