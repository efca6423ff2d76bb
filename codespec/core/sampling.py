"""Logit transforms shared by the target and every draft distribution.

Exact speculative sampling needs p (target) and q (draft) processed by the *same* function, so
this is the only place temperature, top-k and top-p are applied.
"""

from __future__ import annotations

import torch

from codespec.core.config import SamplingParams


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p. Needs ``temperature > 0``.

    logits: [..., V] -> probs: [..., V] float32, each row sums to 1.
    """
    if params.greedy:
        raise ValueError("process_logits is for sampling; greedy uses argmax of the raw logits")
    scores = logits.float() / params.temperature  # [..., V]
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)  # [..., V]
        sorted_probs = sorted_scores.softmax(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (keeps at least one).
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., V]
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a probability row. probs: [V]."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A per-request generator: seeded requests are reproducible, unseeded ones draw a fresh seed."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
