"""vLLM's ``suffix`` method offline: ArcticInference's suffix-decoding cache, configured and called
as ``bench.vllm_propose`` and vLLM 0.32's ``SuffixDecodingProposer`` configure and call it, for the
benches that replay it without vLLM (arctic-inference on the path: ``PYTHONPATH=DIR``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

TREE_DEPTH, MIN_PROB, SPEC_FACTOR = 24, 0.1, 1.0  # vLLM's suffix settings in bench.vllm_propose

Drafter = Callable[[list[int], int], list[int]]  # (sequence, prompt length) -> draft


def suffix_caches() -> dict[str, Any]:
    """vLLM's ``suffix``, with its tree of earlier responses and with the request's tree only."""
    from arctic_inference.suffix_decoding.cache import SuffixDecodingCache

    return {
        "suffix": SuffixDecodingCache(TREE_DEPTH, 10000),
        "suffix, this request only": SuffixDecodingCache(TREE_DEPTH, 0),
    }


def suffix_drafter(cache, request: int, prompt: list[int], first: int, k: int) -> Drafter:
    """vLLM's ``suffix``: the request's tree over its prompt and response, and the global tree of
    earlier responses when ``cache`` keeps them (each response added as it is generated)."""
    cache.start_request(request, np.array(prompt, dtype=np.int32))
    cache.add_active_response(request, [first])
    added = [len(prompt) + 1]

    def draft(sequence: list[int], prompt_len: int) -> list[int]:
        if len(sequence) > added[0]:
            cache.add_active_response(request, sequence[added[0] :])
            added[0] = len(sequence)
        context = np.array(sequence[-TREE_DEPTH:], dtype=np.int32)
        return list(cache.speculate(request, context, k, SPEC_FACTOR, 0.0, MIN_PROB).token_ids)

    return draft
