"""One forward over several sequences (codespec/ragged.py): each sequence's logits are the same
bits as its forward alone, whatever shares the batch, and a failed forward leaves every cache
as it was."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from codespec.core.linear import onednn_available

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="oneDNN's packed linear is not in this torch build")


def _step_plans(target, seed: int, count: int) -> list[tuple[list[int], list[list[int]]]]:
    """Per sequence: a prompt and the inputs of its next steps (drafts of 0-9 tokens)."""
    rng = random.Random(seed)
    vocab = target.vocab_size - 1
    plans = []
    for _ in range(count):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 160))]
        steps = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 11))] for _ in range(4)]
        plans.append((prompt, steps))
    return plans


def _alone(target, prompt, steps):
    cache = target.new_cache()
    logits = [target.forward(prompt, cache, keep_last=1)]
    for ids in steps:
        logits.append(target.forward(ids, cache, keep_last=len(ids)))
        cache.rollback(len(cache) - len(ids) // 2)  # a partial rejection, as verification does
    return logits, cache.token_ids


def _batched(target, plans):
    caches = [target.new_cache() for _ in plans]
    logits = [[row] for row in target.forward_many([p for p, _ in plans], caches, [1] * len(plans))]
    for step in range(len(plans[0][1])):
        inputs = [steps[step] for _, steps in plans]
        for index, row in enumerate(target.forward_many(inputs, caches, [len(ids) for ids in inputs])):
            logits[index].append(row)
        for cache, ids in zip(caches, inputs):
            cache.rollback(len(cache) - len(ids) // 2)
    return logits, [cache.token_ids for cache in caches]


@needs_onednn
def test_a_batch_gives_each_sequence_its_alone_logits_bit_for_bit(tiny_target):
    assert tiny_target.batch_invariant
    plans = _step_plans(tiny_target, seed=5, count=5)
    together, ids = _batched(tiny_target, plans)
    for index, (prompt, steps) in enumerate(plans):
        alone, alone_ids = _alone(tiny_target, prompt, steps)
        assert ids[index] == alone_ids
        for step, (batched_row, single_row) in enumerate(zip(together[index], alone, strict=True)):
            assert torch.equal(batched_row, single_row), f"sequence {index} step {step}"


def test_a_failed_forward_leaves_every_cache_as_it_was(tiny_target):
    prompts = [tiny_target.encode("def add(a, b):\n"), tiny_target.encode("import os\n")]
    caches = [tiny_target.new_cache() for _ in prompts]
    tiny_target.forward_many(prompts, caches, [1, 1])
    held = [list(cache.token_ids) for cache in caches]
    layer = tiny_target.model.model.layers[1]

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault in layer 1")

    layer.forward = broken  # layer 0 writes both caches, then the forward fails
    try:
        with pytest.raises(RuntimeError, match="injected fault"):
            tiny_target.forward_many([[5, 6, 7], [8]], caches, [3, 1])
    finally:
        del layer.forward
    assert [cache.token_ids for cache in caches] == held
    for cache in caches:
        assert all(layer.get_seq_length() == len(cache) for layer in cache.hf_cache.layers)
    after = tiny_target.forward_many([[5, 6, 7], [8]], caches, [3, 1])
    fresh = [tiny_target.new_cache() for _ in prompts]
    expected = tiny_target.forward_many([[*held[0], 5, 6, 7], [*held[1], 8]], fresh, [3, 1])
    for got, want in zip(after, expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_forward_many_refuses_an_empty_sequence(tiny_target):
    with pytest.raises(ValueError, match="needs >= 1 new token"):
        tiny_target.forward_many([[1, 2], []], [tiny_target.new_cache(), tiny_target.new_cache()], [1, 1])


@needs_onednn
def test_packed_fp32_products_give_a_row_the_same_bits_in_any_batch():
    from codespec.core.linear import pack_linears

    torch.manual_seed(0)
    for rows_in, rows_out in ((64, 32), (896, 128), (4864, 896)):
        layer = torch.nn.Linear(rows_in, rows_out)
        pack_linears(layer)
        inputs = torch.randn(300, rows_in)
        with torch.inference_mode():
            alone = [layer(inputs[i : i + 1]) for i in (0, 7, 299)]
            for count in (2, 9, 64, 65, 300):
                together = layer(inputs[:count])
                assert torch.equal(together[:1], alone[0])
                if count > 7:
                    assert torch.equal(together[7:8], alone[1])
            assert torch.equal(layer(inputs)[299:], alone[2])
            torch.testing.assert_close(layer(inputs), F.linear(inputs, layer.weight, layer.bias), rtol=1e-5, atol=1e-4)


def test_the_causal_mask_follows_the_cache_and_the_window():
    from codespec.core.ragged import causal_mask

    assert causal_mask(1, 9, None, torch.device("cpu")) is None  # one query sees everything
    assert causal_mask(7, 0, None, torch.device("cpu")) is None  # a fresh prompt: SDPA's causal kernel
    assert causal_mask(7, 0, 4, torch.device("cpu")) is not None  # ... unless a window hides keys
    mask = causal_mask(3, 2, None, torch.device("cpu"))[0, 0]
    assert mask.tolist() == [[True, True, True, False, False], [True] * 4 + [False], [True] * 5]
    window = causal_mask(2, 3, 2, torch.device("cpu"))[0, 0]  # positions 3, 4 over keys 0-4, window 2
    assert window.tolist() == [[False, False, True, True, False], [False, False, False, True, True]]
    assert causal_mask(1, 4, 2, torch.device("cpu")) is not None  # one query past the window
