"""Typed request settings, validated once at the edge so the engine can trust them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from codespec.core.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` means greedy.

    The same transforms (temperature, then top-k, then top-p) are applied to the target's and to a
    draft model's logits, as exact speculative sampling requires.
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)):
            raise InvalidRequestError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# K, the most draft tokens verified in one forward, where a server decodes: `codespec serve` and
# `complete`, the engine service, and what `codespec bench` and `simulate` measure (docs/design.md §4).
# ``GenerationLimits`` keeps a library default of 8; `codespec generate` states its own.
SERVE_MAX_DRAFT = 32


@dataclass(frozen=True)
class GenerationLimits:
    """When a request stops, besides EOS."""

    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    deadline_s: float | None = None  # wall-clock budget from request start
    max_draft_len: int = 8  # K: the most draft tokens verified in one forward
    # Token ids that end the output like EOS (a prompt format's end markers, e.g. <|file_sep|>).
    stop_token_ids: frozenset[int] = frozenset()
    # Stop ("repetition") once the output ends in one unit of 1-8 tokens repeated this many times in a
    # row: a small model's degenerate loop ('w', 'w', 'w', ...) is noise as a suggestion and would
    # run to the budget. 0: off. The output is still a prefix of what decoding would have produced.
    stop_repeats: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise InvalidRequestError(f"deadline must be > 0 seconds, got {self.deadline_s!r}")
        if not isinstance(self.stop_repeats, int) or self.stop_repeats < 0 or self.stop_repeats == 1:
            raise InvalidRequestError(f"stop_repeats must be 0 (off) or an integer >= 2, got {self.stop_repeats!r}")
        if not isinstance(self.max_draft_len, int) or not 0 <= self.max_draft_len <= 256:
            raise InvalidRequestError(f"draft length must be an integer in [0, 256], got {self.max_draft_len!r}")
