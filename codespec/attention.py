"""The attention codespec's own forwards use: PyTorch SDPA with native grouped-query attention on CPU.

transformers' ``sdpa`` repeats every K/V head for its query group (a copy of the whole cache, per
layer, per forward) whenever a mask is present, which is every multi-token verification forward;
it does so because on CUDA a masked GQA call falls back to the slow math kernel. On CPU PyTorch's
kernel takes GQA natively with the same results bit for bit (tests/test_attention.py), and a
drafted forward over a ~1,000-token cache gets 10-18% cheaper (30M Llama, one thread: 8 drafted
tokens 20.0 -> 16.5 ms, 32 tokens 37.9 -> 34.1 ms). Anywhere else (CUDA, no GQA, old torch, extra
attention features) it is transformers' function unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

NAME = "codespec_sdpa"
STOCK = "sdpa"
_NATIVE_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def sdpa_native_gqa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, Hq, T, D], key / value [B, Hkv, S, D] -> output [B, T, Hq, D] (transformers' layout)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    extras = any(kwargs.get(name) for name in ("position_bias", "softcap", "output_attentions"))
    if (not _NATIVE_GQA or query.device.type != "cpu" or extras
            or getattr(module, "num_key_value_groups", 1) <= 1):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = query.shape[2] > 1 and attention_mask is None and causal  # a mask says it all
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                            scale=scaling, is_causal=causal, enable_gqa=True)  # [B, Hq, T, D]
    return output.transpose(1, 2).contiguous(), None


_registered = False


def register() -> None:
    """Make ``NAME`` known to transformers (attention and its mask builder: the same as sdpa's)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sdpa_native_gqa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    _registered = True


def use_native_gqa(model) -> None:
    """Switch a model that runs transformers' sdpa to ``NAME`` (others are left alone)."""
    if getattr(model.config, "_attn_implementation", None) == STOCK:
        register()
        model.config._attn_implementation = NAME


@contextmanager
def stock_attention(*models):
    """Run ``models`` with transformers' own sdpa for a while (the benchmark's transformers peers)."""
    switched = [m for m in models if m is not None and getattr(m.config, "_attn_implementation", None) == NAME]
    for model in switched:
        model.config._attn_implementation = STOCK
    try:
        yield
    finally:
        for model in switched:
            model.config._attn_implementation = NAME
