"""A request's KV cache and its rollback contract.

Storage: transformers' DynamicCache whose full-attention layers are ``codespec.cache_layer``'s
``GrowingLayer`` (a buffer with spare capacity, written in place; a rollback moves a length).

Contract: the cache holds keys/values for exactly ``token_ids`` (the invariant
``hf_cache.get_seq_length() == len(token_ids)`` is checked on every change). Verification writes
K+1 positions; ``rollback(n)`` then drops everything past the accepted sequence, so the next
forward sees exactly the state a fresh prefill of ``token_ids[:n]`` would give. The same object is
used for a draft model's cache, rolled back in step with the target's. Keeping the ids also lets a
later request reuse the longest common prefix (prompt caching).

Sliding-window layers (Starcoder2, Mistral, Qwen2 with ``use_sliding_window``) keep every position
too: transformers' ``DynamicSlidingWindowLayer`` drops keys older than the window, after which it
cannot be cropped (a rollback raises once the window is full) and could not return to an earlier
length anyway (the dropped keys would be needed again). With a full layer the model's own
sliding-window mask still limits what each query sees, so the attention is the same; the cost
is memory for positions outside the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def common_prefix_len(left: Sequence[int], right: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    limit = min(len(left), len(right))
    index = 0
    while index < limit and left[index] == right[index]:
        index += 1
    return index


class KVCache:
    """transformers' DynamicCache plus the token ids it covers."""

    def __init__(self, model_config) -> None:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        from codespec.cache_layer import GrowingLayer

        self.hf_cache = DynamicCache(config=model_config)
        _keep_every_position(self.hf_cache)  # sliding-window layers become full ones first
        # full-attention layers write in place
        self.hf_cache.layers = [
            GrowingLayer() if type(layer) is DynamicLayer else layer for layer in self.hf_cache.layers
        ]
        self.token_ids: list[int] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    def appended(self, token_ids: Sequence[int]) -> None:
        """Record that a forward just wrote these positions."""
        self.token_ids.extend(token_ids)
        self._check()

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` positions, drop the rest (transformers 5.x: negative crop)."""
        if length < 0:
            raise ValueError(f"cannot roll back to a negative length ({length})")
        excess = len(self.token_ids) - length
        if excess <= 0:
            return
        self.hf_cache.crop(-excess)
        del self.token_ids[length:]
        self._check()

    def reset(self) -> None:
        self.rollback(0)

    def resync(self) -> None:
        """After a forward that failed part way (some layers wrote positions, ``appended`` never ran):
        drop what any layer holds past ``token_ids``, so the cache is again what they say."""
        layer: Any
        for layer in self.hf_cache.layers:
            excess = layer.get_seq_length() - len(self.token_ids) if hasattr(layer, "get_seq_length") else 0
            if excess > 0:
                layer.crop(-excess)
        self._check()

    def _check(self) -> None:
        cached = self.hf_cache.get_seq_length()
        if cached != len(self.token_ids):
            raise RuntimeError(f"KV cache holds {cached} positions but tracks {len(self.token_ids)} token ids")


def _keep_every_position(cache) -> None:
    """Replace sliding-window layers with full ones (the module docstring says why)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    for index, layer in enumerate(cache.layers):
        if type(layer) is DynamicSlidingWindowLayer:  # subclasses (hybrid linear attention) are left alone
            cache.layers[index] = DynamicLayer()
