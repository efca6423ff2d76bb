"""Ragged batches on every family's layout (codespec/ragged.py): the logits of a sequence in a batch
are its logits alone bit for bit, and both are transformers' own forward over the whole sequence
within float rounding (so the per-sequence causal and sliding-window masks are right, also past
a window).

Bit for bit needs the layer widths to be multiples of 32 floats, as in every published shape:
PyTorch runs an elementwise op's last partial vector in scalar code (another rounding of exp in
SiLU), and where that tail falls depends on the batch. deepseek-coder's test layout has an MLP
172 wide: there a batch equals alone within float rounding (docs/architecture.md, "Batching")."""

from __future__ import annotations

import random

import pytest
import torch
from family_layouts import ALL_FAMILIES, corpus

from codespec.core.ragged import supports_ragged


@pytest.mark.parametrize("name", ALL_FAMILIES)
def test_a_batch_equals_each_sequence_alone_and_transformers_forward(family_checkpoints, loaded, name):
    target = loaded(family_checkpoints(name).target)
    text = corpus()[2]
    rng = random.Random(name)
    prompts = [target.encode(text[start : start + rng.randrange(40, 400)]) for start in (0, 2000, 5000, 9000)]
    steps = [[target.encode(text[s : s + rng.randrange(1, 40)]) for s in (100, 3100, 6100, 9100)] for _ in range(3)]
    assert supports_ragged(target.model, [target.new_cache()])
    config = target.model.config
    exact = config.hidden_size % 32 == 0 and config.intermediate_size % 32 == 0
    caches = [target.new_cache() for _ in prompts]
    target.forward_many(prompts, caches, [1] * len(prompts))
    alone_caches = [target.new_cache() for _ in prompts]
    for cache, prompt in zip(alone_caches, prompts):
        target.forward(prompt, cache)
    for inputs in steps:
        keep = [len(ids) for ids in inputs]
        together = target.forward_many(inputs, caches, keep)
        for index, ids in enumerate(inputs):
            alone = target.forward(ids, alone_caches[index], keep_last=len(ids))
            if exact:
                assert torch.equal(together[index], alone), f"{name}: sequence {index}"
            else:
                torch.testing.assert_close(together[index], alone, atol=1e-5, rtol=0)
            full = caches[index].token_ids
            with torch.inference_mode():
                reference = target.model(input_ids=torch.tensor([full])).logits[0, -len(ids) :].float()
            torch.testing.assert_close(together[index], reference, atol=2e-4, rtol=1e-4)
        for cache, alone_cache, ids in zip(caches, alone_caches, inputs):  # a partial rejection
            cache.rollback(len(cache) - len(ids) // 3)
            alone_cache.rollback(len(alone_cache) - len(ids) // 3)
