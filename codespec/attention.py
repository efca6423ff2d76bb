"""The attention codespec's own forwards use: PyTorch SDPA with native grouped-query attention on CPU,
and for verification forwards large enough to pay, two oneDNN products per K/V head.

transformers' ``sdpa`` repeats every K/V head for its query group (a copy of the whole cache, per
layer, per forward) whenever a mask is present, which is every multi-token verification forward;
it does so because on CUDA a masked GQA call falls back to the slow math kernel. On CPU PyTorch's
kernel takes GQA natively with the same results bit for bit (tests/test_attention.py), and a
drafted forward over a ~1,000-token cache gets 10-18% cheaper (30M Llama, one thread: 8 drafted
tokens 20.0 -> 16.5 ms, 32 tokens 37.9 -> 34.1 ms).

With a mask, that fused kernel is still slow on this CPU class; ``grouped_attention`` computes
several queries over a long cache (rows x keys x width x heads >= ``GROUPED_MIN_WORK``) as two
matrix products per K/V head, about twice as fast, equal to SDPA within float rounding rather than
bit for bit (the small shapes of tests/test_attention.py stay on SDPA). Anywhere else (CUDA, no GQA,
old torch, extra attention features) it is transformers' function unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

NAME = "codespec_sdpa"
STOCK = "sdpa"
_NATIVE_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def sdpa_native_gqa(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [B, Hq, T, D], key / value [B, Hkv, S, D] -> output [B, T, Hq, D] (transformers' layout).

    In a ragged forward (``codespec.ragged``: ``codespec_ragged`` in the kwargs) the batch's
    sequences are attended one by one, each through this same function over its own cache."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    ragged = kwargs.pop("codespec_ragged", None)
    if ragged is not None:
        sliding_window = kwargs.pop("sliding_window", None)
        output = ragged.attend(
            sdpa_native_gqa,
            module,
            query,
            sliding_window,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
        return output, None

    extras = any(kwargs.get(name) for name in ("position_bias", "softcap", "output_attentions"))
    if not _NATIVE_GQA or query.device.type != "cpu" or extras or getattr(module, "num_key_value_groups", 1) <= 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = query.shape[2] > 1 and attention_mask is None and causal  # a mask says it all
    if grouped_pays(query, key, attention_mask, dropout, causal):
        keys = key.shape[2]
        wide_key, wide_value = bucketed(key), bucketed(value)
        if wide_key is not None and wide_value is not None:
            return grouped_attention(query, wide_key, wide_value, attention_mask, scaling, keys), None
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal, enable_gqa=True
    )  # [B, Hq, T, D]
    return output.transpose(1, 2).contiguous(), None


# query positions x cached keys x head width x query heads below which SDPA's fused kernel is cheaper
# than two oneDNN matrix products per K/V head (each ~10 us of fixed cost)
GROUPED_MIN_WORK = 1 << 20
GROUPED_MAX_QUERIES = 128  # a verification forward's rows; longer (prefill) blocks keep SDPA's tiling
_ONEDNN = hasattr(torch.ops, "mkldnn") and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# oneDNN builds (JIT-compiles) a kernel for every new product shape, ~0.6 ms each: with the key
# count growing every step, exact shapes would pay that in every layer of every forward. The
# products therefore run over the keys rounded up to this many rows, read from the spare capacity
# of the cache buffer (codespec.cache_layer: zero-initialised, rows past the length stale but
# finite) and masked out, so a kernel serves KEY_BUCKET consecutive steps.
KEY_BUCKET = 128


def bucketed(tensor: torch.Tensor) -> torch.Tensor | None:
    """``tensor`` [1, H, S, D] widened to the next multiple of KEY_BUCKET rows over the buffer it is a
    view of; None when that buffer has no such spare rows (then SDPA serves the call)."""
    batch, heads, keys, width = tensor.shape
    padded = -(-keys // KEY_BUCKET) * KEY_BUCKET
    stride = tensor.stride()
    if stride[3] != 1 or stride[2] != width or (heads > 1 and stride[1] < padded * width):
        return None  # not a [capacity, D] block per head with room for the padded rows
    size = (batch, heads, padded, width)
    last = tensor.storage_offset() + sum((n - 1) * step for n, step in zip(size, stride))
    if last >= tensor.untyped_storage().nbytes() // tensor.element_size():
        return None
    return tensor.as_strided(size, stride, tensor.storage_offset())


def grouped_pays(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, dropout: float, causal: bool
) -> bool:
    """The grouped path serves verification forwards (several queries over a long cache, with a mask),
    and in bf16 one-query forwards too (qwen2.5-coder-0.5b, 1,000 cached keys: SDPA 31 ms a forward,
    grouped 3 ms)."""
    batch, heads, positions, width = query.shape
    # one query: SDPA's fp32 kernel is as fast; its bf16 one is ~10x slower (no fused one-row path)
    single_ok = positions > 1 or query.dtype != torch.float32
    return (
        _ONEDNN
        and batch == 1
        and positions <= GROUPED_MAX_QUERIES
        and single_ok
        and dropout == 0.0
        and not causal
        and (mask is None or mask.dtype == torch.bool)
        and query.dtype in (torch.float32, torch.bfloat16)
        and positions * key.shape[2] * width * heads >= GROUPED_MIN_WORK
    )


def grouped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    keys: int | None = None,
) -> torch.Tensor:
    """Attention of T queries over S keys as two matrix products per K/V head, the head's G query
    heads stacked as G*T rows (no K/V copies): query [1, Hq, T, D], key / value [1, Hkv, P, D] of
    which the first ``keys`` = S rows are real (P >= S: ``bucketed``; the rest is masked out), mask
    [1, 1, T, S] bool (True: attend) or None -> [1, T, Hq, D].

    On this CPU class the fused SDPA kernel with a mask runs a verification forward's attention at
    ~70 GFLOP/s (qwen2.5-coder-0.5b, 17 queries over 1,017 keys: 21 ms per forward, 24 layers);
    oneDNN's products of a [G*T, D] block with the [S, D] keys and of the [G*T, S] weights with the
    values take 12 ms (2 queries: 4.9 -> 3.6 ms; 33: 40 -> 20 ms). Same arithmetic, another summation
    order: equal to SDPA within float rounding (tests/test_forward_cost_kernels.py)."""
    _, heads, positions, width = query.shape
    kv_heads, padded = key.shape[1], key.shape[2]
    keys = padded if keys is None else keys
    groups = heads // kv_heads
    scale = scaling if scaling is not None else width**-0.5
    rows = (query * scale).reshape(kv_heads, groups * positions, width)  # [Hkv, G*T, D]; head h reads K/V h // G
    # A verification mask hides nothing in the cached part (every query sees the whole cache) and is
    # causal over the T new keys: mask only the columns where something is hidden (and the padding).
    blocked = ~mask[0, 0] if mask is not None else torch.zeros(positions, keys, dtype=torch.bool)  # [T, S]
    start = 0
    cached = keys - positions
    if cached > 0 and not bool(blocked[:, :cached].any()):
        start = cached
    hidden = torch.ones(positions, padded - start, dtype=torch.bool)  # [T, P - start]
    hidden[:, : keys - start] = blocked[:, start:]
    outputs = []
    for head in range(kv_heads):
        scores = torch.ops.mkldnn._linear_pointwise(rows[head], key[0, head], None, "none", [], "")  # [G*T, P]
        scores = scores.view(groups, positions, padded)  # [G, T, P]
        scores[..., start:].masked_fill_(hidden, float("-inf"))
        weights = torch.softmax(scores, dim=-1).view(groups * positions, padded)  # [G*T, P]
        outputs.append(
            torch.ops.mkldnn._linear_pointwise(weights, value[0, head].t(), None, "none", [], "")
        )  # [G*T, D]
    output = torch.stack(outputs)  # [Hkv, G*T, D]
    return output.view(1, heads, positions, width).transpose(1, 2).contiguous()  # [1, T, Hq, D]


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
