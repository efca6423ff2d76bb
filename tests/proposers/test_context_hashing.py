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
