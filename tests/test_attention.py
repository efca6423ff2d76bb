"""codespec's attention on CPU: native GQA in SDPA gives transformers' sdpa results bit for bit; the
grouped products fp32 forwards take give them within rounding."""

from __future__ import annotations

import torch

from bench.shapes import random_llama
from codespec.core.attention import NAME, STOCK, stock_attention, use_native_gqa
from codespec.core.model import KVCache


def logits_of(model, prompt: list[int], drafts: list[list[int]]) -> list[torch.Tensor]:
    """A prefill, then verification-style forwards of several tokens (each rolled back)."""
    cache = KVCache(model.config)
    with torch.inference_mode():
        out = [model(input_ids=torch.tensor([prompt]), cache=cache.hf_cache, use_cache=True).logits[0, -1]]
        cache.appended(prompt)
        for draft in drafts:
            out.append(
                model(
                    input_ids=torch.tensor([draft]), cache=cache.hf_cache, use_cache=True, logits_to_keep=len(draft)
                ).logits[0]
            )
            cache.appended(draft)
            cache.rollback(len(prompt))
    return out


def test_native_gqa_matches_transformers_sdpa_exactly():
    # float64: SDPA's native GQA serves every forward (fp32 takes the grouped products, below)
    model = random_llama((64, 2, 4, 2, 128), vocab_size=97, init_std=0.2).to(torch.float64)
    assert model.config._attn_implementation == STOCK
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 97, (300,), generator=generator).tolist()
    drafts = [torch.randint(0, 97, (k,), generator=generator).tolist() for k in (1, 2, 7, 33)]
    stock = logits_of(model, prompt, drafts)
    use_native_gqa(model)
    assert model.config._attn_implementation == NAME
    ours = logits_of(model, prompt, drafts)
    assert all(torch.equal(a, b) for a, b in zip(stock, ours))
    with stock_attention(model):  # the benchmark's transformers peers run transformers' own attention
        assert model.config._attn_implementation == STOCK
    assert model.config._attn_implementation == NAME


def test_fp32_attention_equals_transformers_sdpa_within_rounding():
    model = random_llama((64, 2, 4, 2, 128), vocab_size=97, init_std=0.2)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 97, (300,), generator=generator).tolist()
    drafts = [torch.randint(0, 97, (k,), generator=generator).tolist() for k in (1, 2, 7, 33)]
    stock = logits_of(model, prompt, drafts)
    use_native_gqa(model)
    ours = logits_of(model, prompt, drafts)
    for a, b in zip(stock, ours, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_other_attention_implementations_are_left_alone():
    model = random_llama((32, 1, 2, 1, 64), vocab_size=50)
    model.config._attn_implementation = "eager"
    use_native_gqa(model)
    assert model.config._attn_implementation == "eager"
    with stock_attention(model):
        assert model.config._attn_implementation == "eager"
