"""One target forward over several sequences, each with its own KV cache (a ragged batch).

A scheduler cycle verifies the drafts of every active request at once (docs/architecture.md,
"Batching"): their input rows are packed into one [1, N] row of tokens (N = the sum of each
sequence's new tokens, no padding), so every linear layer, the norms and the LM head read their
weights once for all of them, which is what a forward on a CPU or GPU mostly costs at few rows.
Only attention is per sequence: each sequence's queries attend to its own cache and its own new
keys, at its own positions. ``RaggedBatch`` is the cache transformers' attention modules update
(it writes each sequence's slice of the new keys / values into that sequence's cache layer) and
the attention function ``codespec.attention`` runs for each sequence in turn, with the same code
a one-sequence forward runs, so a sequence's attention is bit for bit what it would be alone.

With the linear layers batch invariant too (``codespec.linear``: fp32 oneDNN products give each
row the same bits whatever the other rows), a request's logits do not depend on what shares its
batch: greedy output is token-identical to the request served alone (tests/test_ragged.py; bf16
and CUDA kernels are not invariant, docs/architecture.md measures how often that changes a token).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# Architectures whose attention is transformers' standard block (q/k/v projections, rotary
# positions from ``position_ids``, ``cache.update`` then the attention function): checked here.
RAGGED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "starcoder2"})


class RaggedBatch:
    """The caches of one ragged forward, seen by transformers' attention modules as one cache."""

    def __init__(self, caches: Sequence[Any], lengths: Sequence[int], device: torch.device) -> None:
        self.caches = list(caches)  # codespec.model.KVCache, one per sequence
        self.lengths = list(lengths)  # new tokens of each sequence this forward
        self.starts = [sum(self.lengths[:i]) for i in range(len(self.lengths))]
        self.cached = [len(cache) for cache in self.caches]  # positions each held before the forward
        self.device = device
        self._views: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._masks: dict[tuple[int, int | None], torch.Tensor | None] = {}

    def position_ids(self) -> torch.Tensor:
        """[1, N]: each sequence's new tokens at its own positions after its cache."""
        ranges = [torch.arange(held, held + length) for held, length in zip(self.cached, self.lengths)]
        return torch.cat(ranges).unsqueeze(0).to(self.device)

    def kept_rows(self, keep_last: Sequence[int]) -> torch.Tensor:
        """[sum(keep_last)]: the packed rows whose logits are kept (each sequence's last ones)."""
        rows = [
            torch.arange(start + length - keep, start + length)
            for start, length, keep in zip(self.starts, self.lengths, keep_last)
        ]
        return torch.cat(rows).to(self.device)

    # ---- transformers' Cache, as far as its attention modules use it -------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key_states / value_states [1, Hkv, N, D]: each sequence's slice goes into its own cache
        layer; the attention function reads the sequences' whole keys / values from ``views``."""
        views = []
        for cache, start, length in zip(self.caches, self.starts, self.lengths):
            layer = cache.hf_cache.layers[layer_idx]
            views.append(
                layer.update(key_states[:, :, start : start + length], value_states[:, :, start : start + length])
            )
        self._views[layer_idx] = views
        return key_states, value_states

    # ---- the attention function's side -------------------------------------------------------
    def attend(self, attention, module, query: torch.Tensor, sliding_window: int | None, **kwargs) -> torch.Tensor:
        """query [1, Hq, N, D] -> [1, N, Hq, D]: ``attention`` (one sequence's attention function)
        over each sequence's own keys, values and causal mask."""
        views = self._views[module.layer_idx]
        outputs = []
        for index, (start, length) in enumerate(zip(self.starts, self.lengths)):
            key, value = views[index]  # [1, Hkv, S, D]
            mask = self.mask(index, sliding_window)
            queries = query[:, :, start : start + length].contiguous()  # the same layout alone or batched
            output, _ = attention(module, queries, key, value, mask, **kwargs)
            outputs.append(output)  # [1, T_i, Hq, D]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)

    def mask(self, index: int, sliding_window: int | None) -> torch.Tensor | None:
        """[1, 1, T, S] bool (True: attend) for sequence ``index``: causal after its cache, within the
        window; None for one query that sees every key (no mask needed)."""
        key = (index, sliding_window)
        if key not in self._masks:
            self._masks[key] = causal_mask(self.lengths[index], self.cached[index], sliding_window, self.device)
        return self._masks[key]


def causal_mask(queries: int, cached: int, sliding_window: int | None, device: torch.device) -> torch.Tensor | None:
    """[1, 1, T, S] bool: query t (position cached + t) sees key j when j <= cached + t and, with a
    window, cached + t - j < window (transformers' convention). None where the attention function
    needs no mask: one query that sees every key, or a prompt with nothing cached inside the window
    (then SDPA's causal kernel runs, faster than a masked one: a prefill's attention)."""
    keys = cached + queries
    if (queries == 1 or cached == 0) and (sliding_window is None or keys <= sliding_window):
        return None
    query_pos = torch.arange(cached, keys, device=device)[:, None]  # [T, 1]
    key_pos = torch.arange(keys, device=device)[None, :]  # [1, S]
    allowed = key_pos <= query_pos
    if sliding_window is not None:
        allowed &= query_pos - key_pos < sliding_window
    return allowed[None, None]  # [1, 1, T, S]


def supports_ragged(model, caches: Sequence[Any]) -> bool:
    """True when one ragged forward can serve these caches on this model: a known architecture on
    codespec's attention function, every cache layer one that writes in place."""
    from codespec.core.attention import NAME
    from codespec.core.cache_layer import GrowingLayer

    config = model.config
    if (
        getattr(config, "model_type", None) not in RAGGED_MODEL_TYPES
        or getattr(config, "_attn_implementation", None) != NAME
    ):
        return False
    return all(type(layer) is GrowingLayer for cache in caches for layer in cache.hf_cache.layers)


# A 4-D mask makes transformers' mask builders return it as it is (no work, no cache queries);
# the attention function ignores it in a ragged forward and builds each sequence's own.
_PLACEHOLDER_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)


@torch.inference_mode()
def ragged_forward(
    model, inputs: Sequence[Sequence[int]], caches: Sequence[Any], keep_last: Sequence[int], device: torch.device
) -> list[torch.Tensor]:
    """One forward of ``model`` over every sequence (``Target.forward_many``'s contract): item i is
    float32 logits [keep_last[i], V] for sequence i; each cache records its new tokens."""
    if not len(inputs) == len(caches) == len(keep_last):
        raise ValueError(f"forward_many got {len(inputs)} inputs, {len(caches)} caches, {len(keep_last)} keep_last")
    lengths = [len(ids) for ids in inputs]
    if any(length < 1 for length in lengths) or any(
        not 1 <= keep <= length for keep, length in zip(keep_last, lengths)
    ):
        raise ValueError(
            f"each sequence needs >= 1 new token and 1 <= keep_last <= its tokens: {lengths}, {list(keep_last)}"
        )
    batch = RaggedBatch(caches, lengths, device)
    ids = torch.tensor(
        [[token for sequence in inputs for token in sequence]], dtype=torch.long, device=device
    )  # [1, N]
    output = model(
        input_ids=ids,
        position_ids=batch.position_ids(),
        attention_mask=_PLACEHOLDER_MASK.to(device),
        cache=batch,
        use_cache=True,
        logits_to_keep=batch.kept_rows(keep_last),
        codespec_ragged=batch,
    )
    for cache, sequence in zip(caches, inputs):
        cache.appended(sequence)
    logits = output.logits[0].float()  # [sum(keep_last), V]
    return list(torch.split(logits, list(keep_last)))
