"""The Target contract (codespec/target.py): every target the product and bench use satisfies it,
and ``forward_many`` is ``forward`` item by item."""

from __future__ import annotations

import pytest
import torch

from codespec.core.target import Cache, Target


def test_the_targets_in_use_satisfy_the_contract(tiny_target):
    from bench.micro import TimedTarget
    from bench.replay import ReplayTarget

    for target in (tiny_target, ReplayTarget(tiny_target), TimedTarget(tiny_target)):
        assert isinstance(target, Target), type(target).__name__
        assert isinstance(target.new_cache(), Cache)


def test_forward_many_is_forward_item_by_item(tiny_target):
    inputs = [tiny_target.encode("def add(a, b):\n"), tiny_target.encode("import os\nimport sys\n")]
    keep_last = [3, 1]
    alone = [tiny_target.forward(ids, tiny_target.new_cache(), keep) for ids, keep in zip(inputs, keep_last)]
    caches = [tiny_target.new_cache(), tiny_target.new_cache()]
    together = tiny_target.forward_many(inputs, caches, keep_last)
    for single, batched, keep in zip(alone, together, keep_last, strict=True):
        assert batched.shape == (keep, tiny_target.vocab_size)
        torch.testing.assert_close(batched, single, atol=1e-5, rtol=0)
    assert [cache.token_ids for cache in caches] == inputs


def test_forward_many_refuses_mismatched_lengths(tiny_target):
    with pytest.raises(ValueError, match="forward_many got 1 inputs, 2 caches"):
        tiny_target.forward_many([[1]], [tiny_target.new_cache(), tiny_target.new_cache()], [1])


def test_early_exit_goes_through_the_layered_capability(tiny_target):
    from codespec.core.target import LayeredTarget, TokenizerTarget
    from codespec.proposers.models import supports_early_exit

    assert isinstance(tiny_target, LayeredTarget) and tiny_target.num_layers == 2
    prompt = tiny_target.encode("def add(a, b):\n    return a + b\n")
    full = tiny_target.forward(prompt, tiny_target.new_cache(), keep_last=1)
    with tiny_target.first_layers(1):
        first = tiny_target.forward(prompt, tiny_target.new_cache(), keep_last=1)
    assert tiny_target.num_layers == 2  # restored
    assert not torch.allclose(first, full)
    torch.testing.assert_close(tiny_target.forward(prompt, tiny_target.new_cache(), keep_last=1), full)
    tokenizer_only = TokenizerTarget(tiny_target.tokenizer)
    assert not isinstance(tokenizer_only, Target) and not supports_early_exit(tokenizer_only)
