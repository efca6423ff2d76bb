"""Per-step records and the metrics of docs/design.md §3, under exactly those names.

Every figure is computed from what happened, over *all* steps: tokens per target forward counts
undrafted steps too, so a proposer that rarely drafts cannot look good by its mean accepted length.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepRecord:
    """One target forward: what was drafted, what survived, what it cost."""

    proposer: str  # "" when the step had no draft
    draft_len: int  # K
    accepted: int  # w
    emitted: int  # tokens added to the output (w + 1, less if cut by EOS, stop or budget)
    proposal_s: float
    verify_s: float
    end_s: float  # seconds from request start to the end of this step


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def json_safe(value):
    """``value`` with every NaN (a percentile of nothing) replaced by None, which JSON can carry;
    walks dicts and lists, so a whole ``summary()`` can be passed."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_safe(item) for item in value]
    return value


def acceptance_by_depth(steps: Iterable[StepRecord]) -> list[float]:
    """P(draft i accepted | drafts 1..i-1 accepted), i = 1..max K seen."""
    reached: list[int] = []  # reached[i]: steps whose draft had position i+1 and got that far
    passed: list[int] = []
    for step in steps:
        for depth in range(step.draft_len):
            if depth >= len(reached):
                reached.append(0)
                passed.append(0)
            if depth > step.accepted:
                break
            reached[depth] += 1
            if depth < step.accepted:
                passed[depth] += 1
    return [p / r if r else 0.0 for p, r in zip(passed, reached)]


@dataclass
class RequestStats:
    """Everything measured for one request (or several merged, for aggregates)."""

    steps: list[StepRecord] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)  # one per request
    decode_s: list[float] = field(default_factory=list)  # first -> last token, one per request
    decode_tokens: list[int] = field(default_factory=list)  # tokens after the first, per request
    token_gaps_s: list[float] = field(default_factory=list)  # inter-token latencies

    def merge(self, other: RequestStats) -> RequestStats:
        return RequestStats(
            self.steps + other.steps,
            self.ttft_s + other.ttft_s,
            self.decode_s + other.decode_s,
            self.decode_tokens + other.decode_tokens,
            self.token_gaps_s + other.token_gaps_s,
        )

    @property
    def tokens(self) -> int:
        return sum(step.emitted for step in self.steps)

    @property
    def drafted_tokens(self) -> int:
        return sum(step.draft_len for step in self.steps)

    @property
    def accepted_tokens(self) -> int:
        return sum(step.accepted for step in self.steps)

    def summary(self) -> dict:
        """The metric names of docs/design.md §3 (and of `codespec generate --json`)."""
        steps = self.steps
        drafted = [step for step in steps if step.draft_len > 0]
        proposal_ms = [step.proposal_s * 1e3 for step in steps]
        verify_ms = [step.verify_s * 1e3 for step in steps]
        decode_time = sum(self.decode_s)
        return {
            "tokens": self.tokens,
            "target_forwards": len(steps),
            "tokens_per_forward": self.tokens / len(steps) if steps else 0.0,
            "mean_accepted_length": (sum(step.accepted + 1 for step in drafted) / len(drafted) if drafted else 0.0),
            "coverage": len(drafted) / len(steps) if steps else 0.0,
            "acceptance_by_depth": [round(value, 4) for value in acceptance_by_depth(steps)],
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "proposal_ms_p50": percentile(proposal_ms, 50),
            "proposal_ms_p95": percentile(proposal_ms, 95),
            "verify_ms_p50": percentile(verify_ms, 50),
            "verify_ms_p95": percentile(verify_ms, 95),
            "ttft_ms": percentile([t * 1e3 for t in self.ttft_s], 50),
            "itl_ms_p50": percentile([t * 1e3 for t in self.token_gaps_s], 50),
            "itl_ms_p95": percentile([t * 1e3 for t in self.token_gaps_s], 95),
            "itl_ms_p99": percentile([t * 1e3 for t in self.token_gaps_s], 99),
            "tokens_per_s": sum(self.decode_tokens) / decode_time if decode_time > 0 else 0.0,
        }
