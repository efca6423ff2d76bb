"""The attention codespec's own forwards use on CPU: two matrix products per K/V head in fp32 (every
forward), PyTorch SDPA with native grouped-query attention otherwise.

transformers' ``sdpa`` repeats every K/V head for its query group (a copy of the whole cache, per
layer, per forward) whenever a mask is present, which is every multi-token verification forward;
it does so because on CUDA a masked GQA call falls back to the slow math kernel. On CPU PyTorch's
kernel takes GQA natively with the same results bit for bit (tests/test_attention.py), and a
drafted forward over a ~1,000-token cache gets 10-18% cheaper (30M Llama, one thread: 8 drafted
tokens 20.0 -> 16.5 ms, 32 tokens 37.9 -> 34.1 ms).

SDPA's fused kernel sums in an order that depends on how many queries a call holds, so the same
position got other last bits decoded alone (one query) than verified in a draft (several) or
prefilled with the draft appended: greedy output matched plain decoding only while no near tie
met that rounding. ``grouped_attention`` computes a query's scores and output with products that
give a row the same bits whatever the other rows, and a per-row softmax, so in fp32 every forward
takes it and a position's logits are the same bits however it was computed (docs/architecture.md,
"Exactness"). It is also about twice as fast as the masked fused kernel at verification sizes;
equal to SDPA within float rounding. In bf16 (not batch invariant anyway) it serves the forwards
where it is faster. Anywhere else (CUDA, extra attention features, bf16 without GQA or on old torch,
a cache that is not codespec's) it is transformers' function unchanged.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from codespec.core.cache_layer import KEY_BUCKET  # the cache's buffers hold whole buckets

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
    # native GQA (the fused kernel without K/V copies) for a model with query groups; fp32 takes the
    # grouped path with or without groups (one query head per K/V head is a group of one): exactness
    native = _NATIVE_GQA and getattr(module, "num_key_value_groups", 1) > 1
    if query.device.type != "cpu" or extras or not (native or query.dtype == torch.float32):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = query.shape[2] > 1 and attention_mask is None and causal  # a mask says it all
    if grouped_pays(query, key, attention_mask, dropout, causal):
        keys = key.shape[2]
        wide_key, wide_value = bucketed(key), bucketed(value)
        if wide_key is not None and wide_value is not None:
            mask = causal_mask(query.shape[2], keys) if causal else attention_mask
            return grouped_blocks(query, wide_key, wide_value, mask, scaling, keys), None
    if not native:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal, enable_gqa=True
    )  # [B, Hq, T, D]
    return output.transpose(1, 2).contiguous(), None


# query positions x cached keys x head width x query heads below which SDPA's fused kernel is cheaper
# than two oneDNN matrix products per K/V head (each ~10 us of fixed cost); bf16 only (fp32 always
# takes the grouped path: exactness, ``grouped_pays``)
GROUPED_MIN_WORK = 1 << 20
GROUPED_MAX_QUERIES = 128  # queries of one grouped call; a longer block (a prefill chunk) runs in such blocks
QUERY_PAD = 32  # a block of more than QUERY_PAD queries is padded to a multiple of it (bounded kernel shapes)
SCORE_BUDGET = 1 << 23  # scores a grouped call holds at once (32 MB in fp32): fewer queries a call over long caches
_ONEDNN = hasattr(torch.ops, "mkldnn") and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# oneDNN builds (JIT-compiles) a kernel for every new product shape, ~0.6 ms each: with the key
# count growing every step, exact shapes would pay that in every layer of every forward. The
# products therefore run over the keys rounded up to this many rows, read from the spare capacity
# of the cache buffer (codespec.cache_layer: zero-initialised, rows past the length stale but
# finite) and masked out, so a kernel serves KEY_BUCKET consecutive steps (its capacity comes in
# whole buckets).


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
    """In fp32, every forward (one query, a verification, a prefill chunk) takes the grouped path:
    its products give a query row the same bits whatever the other rows (codespec/linear.py), and its
    softmax is per row, so a position's attention is the same whether it is decoded alone, verified
    in a draft, or prefilled with the draft appended. SDPA's kernel sums in an order that depends on
    the number of queries (one query and a block of five differ in the last bits), which made a
    verified position's logits differ from plain decoding's in the last bits (docs/architecture.md,
    "Exactness"). In bf16 (not batch invariant anyway) it serves verification forwards large enough
    to pay, and one-query forwards (qwen2.5-coder-0.5b, 1,000 cached keys: SDPA 31 ms a forward,
    grouped 3 ms)."""
    batch, heads, positions, width = query.shape
    if not (
        _ONEDNN
        and batch == 1
        and dropout == 0.0
        and (mask is None or mask.dtype == torch.bool)
        and query.dtype in (torch.float32, torch.bfloat16)
    ):
        return False
    if query.dtype == torch.float32:
        return True
    return (
        not causal and positions <= GROUPED_MAX_QUERIES and positions * key.shape[2] * width * heads >= GROUPED_MIN_WORK
    )


def causal_mask(queries: int, keys: int) -> torch.Tensor:
    """[1, 1, T, S] bool (True: attend): the T new queries are the last T of the S positions."""
    cached = keys - queries
    rows = torch.arange(queries).unsqueeze(1) + cached  # [T, 1]: each query's own position
    return (torch.arange(keys).unsqueeze(0) <= rows)[None, None]  # [1, 1, T, S]


def grouped_blocks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    keys: int,
) -> torch.Tensor:
    """``grouped_attention`` over blocks of at most GROUPED_MAX_QUERIES queries (fewer where the
    scores of a block would pass SCORE_BUDGET), each over the keys its queries see (a causal
    prompt's later positions left out, as SDPA's causal kernel skips them), rounded up to whole key
    buckets. A block never mixes rows whose keys round up to different widths: a row's products
    then run over the width they run over when its position is decoded alone (a product's inner
    width can change its sums' order; a draft that crosses a bucket boundary split its rows so).
    Where the products are oneDNN's, a block of more than QUERY_PAD is padded to a multiple of it
    (zero queries, dropped), so they meet a bounded set of shapes whatever the prompt lengths.
    query [1, Hq, T, D], key / value [1, Hkv, P, D] (``bucketed``) -> [1, T, Hq, D]."""
    positions, heads = query.shape[2], query.shape[1]
    onednn = query.dtype != torch.float32 or key.shape[1] == 1  # ``row_products``' path: a kernel per shape
    per_block = max(1, min(GROUPED_MAX_QUERIES, SCORE_BUDGET // (heads * key.shape[2])))  # long caches: fewer
    if mask is None:
        runs = [(start, min(start + per_block, positions), keys) for start in range(0, positions, per_block)]
    else:
        last = torch.where(mask[0, 0], key_numbers(mask.shape[-1]), 0).amax(1)  # [T]: last visible key + 1
        runs = block_runs([n or keys for n in last.tolist()], per_block)  # a row that sees nothing: every key
    outputs = []
    for start, stop, seen in runs:
        size = stop - start
        block = query[:, :, start:stop]  # [1, Hq, size, D]
        block_mask = None if mask is None else mask[:, :, start:stop, :seen]  # [1, 1, size, seen]
        wide = -(-seen // KEY_BUCKET) * KEY_BUCKET
        padded = size if size <= QUERY_PAD or not onednn else -(-size // QUERY_PAD) * QUERY_PAD
        if padded != size:
            block = F.pad(block, (0, 0, 0, padded - size))
            if block_mask is not None:
                block_mask = F.pad(block_mask, (0, 0, 0, padded - size), value=True)
        output = grouped_attention(block, key[:, :, :wide], value[:, :, :wide], block_mask, scaling, seen)
        outputs.append(output[:, :size])
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


@functools.lru_cache(maxsize=8)
def key_numbers(count: int) -> torch.Tensor:
    """1..count [S] int32: a mask row's visible keys numbered, for its last one (every layer of a
    forward asks with the same count)."""
    return torch.arange(1, count + 1, dtype=torch.int32)


def block_runs(last: list[int], most: int) -> list[tuple[int, int, int]]:
    """(start, stop, seen) blocks over rows whose last visible key + 1 is ``last``: consecutive rows
    whose keys round up to one bucket width, at most ``most`` a block; ``seen``: the block's widest
    row. One pass in Python: for the few dozen rows of a draft, cheaper than tensor operations."""
    runs = []
    start, width, seen = 0, -(-last[0] // KEY_BUCKET), 0
    for row, count in enumerate(last):
        bucket = -(-count // KEY_BUCKET)
        if bucket != width or row - start == most:
            runs.append((start, row, seen))
            start, width, seen = row, bucket, 0
        if count > seen:
            seen = count
    runs.append((start, len(last), seen))
    return runs


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
    two products per K/V head take 12 ms (2 queries: 4.9 -> 3.6 ms; 33: 40 -> 20 ms). Same
    arithmetic, another summation order: equal to SDPA within float rounding
    (tests/test_forward_cost_kernels.py). The products give a row the same bits whatever the other
    rows (``row_products``) and the softmax is per row, so a query's output does not depend on how
    many queries share the call."""
    _, heads, positions, width = query.shape
    kv_heads, padded = key.shape[1], key.shape[2]
    keys = padded if keys is None else keys
    groups = heads // kv_heads
    scale = scaling if scaling is not None else width**-0.5
    count = groups * positions
    rows = (query * scale).reshape(kv_heads, count, width)  # [Hkv, G*T, D]; head h reads K/V h // G
    scores = row_products(rows, key[0], transposed=True)  # [Hkv, G*T, P]
    scores[..., keys:] = float("-inf")  # the bucket's padding
    if mask is not None:
        # A verification mask hides nothing in the cached part (every query sees the whole cache)
        # and is causal over the T new keys: mask only the columns where something is hidden.
        blocked = ~mask[0, 0]  # [T, S]
        cached = keys - positions
        start = cached if cached > 0 and not bool(blocked[:, :cached].any()) else 0
        real = scores.view(kv_heads, groups, positions, padded)  # [Hkv, G, T, P]
        real[..., start:keys].masked_fill_(blocked[:, start:], float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # [Hkv, G*T, P]
    output = row_products(weights, value[0])  # [Hkv, G*T, D]
    return output.reshape(1, heads, positions, width).transpose(1, 2).contiguous()  # [1, T, Hq, D]


# Batched fp32 matrix products (MKL's) give a row the same bits in a product of any 4+ rows when
# two or more heads share the call (fewer rows: padded); one head, or bf16, runs as oneDNN products
# one head at a time (row invariant from 2 rows, padded likewise; ~25 us of fixed cost a call).
# tests/test_forward_cost_kernels.py checks both on the machine it runs on.
MIN_PRODUCT_ROWS = 4


def row_products(left: torch.Tensor, right: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """Per head h: left[h] @ right[h] (or right[h].T when ``transposed``): left [H, M, K], right
    [H, K, N] or [H, N, K] -> [H, M, N], each row's bits independent of the other rows."""
    count = left.shape[1]
    if count < MIN_PRODUCT_ROWS:
        left = F.pad(left, (0, 0, 0, MIN_PRODUCT_ROWS - count))  # zero rows, dropped below
    if left.dtype == torch.float32 and left.shape[0] > 1:
        product = torch.matmul(left, right.transpose(1, 2) if transposed else right)
    else:
        op = torch.ops.mkldnn._linear_pointwise  # weight [N, K]: the keys as they are, the values transposed
        product = torch.stack(
            [op(side, right[h] if transposed else right[h].t(), None, "none", [], "") for h, side in enumerate(left)]
        )
    return product[:, :count]


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
