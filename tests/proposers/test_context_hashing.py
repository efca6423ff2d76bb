"""The context lookup's n-gram table: a prompt indexed at once (numpy) keys every n-gram exactly as
the per-token loop does, latest end kept, so drafts do not depend on how the tokens arrived."""

import random

import pytest

from codespec.core.draft import ProposeContext
from codespec.proposers import context
from codespec.proposers.context import ContextLookup


@pytest.mark.parametrize("seed", range(40))
def test_indexing_at_once_and_token_by_token_build_the_same_table(seed, monkeypatch):
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(rng.randrange(2, 400))]
    grown = tokens + [rng.randrange(6) for _ in range(rng.randrange(1, 120))]
    looped, at_once = ContextLookup(), ContextLookup()
    for lookup, vector_from in ((looped, 10**9), (at_once, 1)):
        monkeypatch.setattr(context, "VECTOR_FROM", vector_from)
        first = lookup.propose(ProposeContext(tokens, 0, 8))
        then = lookup.propose(ProposeContext(grown, 0, 8))
        lookup.drafts = (first, then)
    assert at_once._latest_end == looped._latest_end
    assert at_once.drafts == looped.drafts
    assert any(len(d) for d in looped.drafts) or len(tokens) < 20  # six symbols repeat: there are matches


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
