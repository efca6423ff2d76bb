"""Interleaved runs and per-configuration metrics.

Configurations run request by request (request r runs every configuration before request r+1
starts, in an order rotated by r), so machine drift (other processes, thermal state) spreads over
all configurations instead of landing on whichever ran last. Metric arithmetic is
``codespec.stats`` (RequestStats.summary, percentile); this module only merges, adds the tail
percentiles the summary lacks, and divides by the same run's ``greedy``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.measure import MemoryProbe, RunResult
from bench.replay import Recording
from bench.workload import BenchCase
from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.stats import RequestStats, percentile

log = logging.getLogger(__name__)

BASELINE = "greedy"
METRIC_KEYS = (
    "tokens_per_s",
    "speedup",
    "tokens_per_forward",
    "mean_accepted_length",
    "coverage",
    "acceptance_by_depth",
    "ttft_ms_p50",
    "itl_ms_p50",
    "itl_ms_p95",
    "itl_ms_p99",
    "proposal_ms_p50",
    "verify_ms_p50",
    "peak_rss_mb",
    "equivalence",
)


# -- pure functions ------------------------------------------------------------------------------
def interleaved_order(requests: int, configs: Sequence[str]) -> list[tuple[int, str]]:
    """(request, configuration) pairs: all configurations of request r, rotated by r, then r + 1."""
    order: list[tuple[int, str]] = []
    for request in range(requests):
        shift = request % len(configs) if configs else 0
        order.extend((request, name) for name in [*configs[shift:], *configs[:shift]])
    return order


def speedup(tokens_per_s: float, baseline_tokens_per_s: float) -> float | None:
    """tokens/s of a configuration / tokens/s of plain decoding in the same run (design.md §3)."""
    if not baseline_tokens_per_s or not math.isfinite(baseline_tokens_per_s) or not math.isfinite(tokens_per_s):
        return None
    return tokens_per_s / baseline_tokens_per_s


def request_rate(stats: RequestStats) -> float | None:
    """One request's decode rate (tokens after the first / first-to-last seconds)."""
    if not stats.decode_s or stats.decode_s[0] <= 0:
        return None
    return stats.decode_tokens[0] / stats.decode_s[0]


def median_ratio(rates: Sequence[float | None], baseline: Sequence[float | None]) -> float | None:
    """Median over requests of (rate / baseline rate): robust to drift between requests."""
    ratios = [r / b for r, b in zip(rates, baseline) if r and b]
    return percentile(ratios, 50) if ratios else None


def unigram_tv(outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> float | None:
    """Total variation distance between the token frequencies of two sets of outputs (a cheap
    distribution check for sampling runs: exact speculative sampling keeps it at sampling noise)."""
    left, right = Counter(t for o in outputs for t in o), Counter(t for o in reference for t in o)
    total_left, total_right = sum(left.values()), sum(right.values())
    if not total_left or not total_right:
        return None
    return 0.5 * sum(abs(left[t] / total_left - right[t] / total_right) for t in left.keys() | right.keys())


DRAFT_BUCKETS = ((0, 0), (1, 4), (5, 8), (9, 16), (17, 32), (33, 256))


def verify_ms_by_draft_len(steps) -> dict[str, float]:
    """Median verification time per draft-length bucket (after each request's first step, which
    includes the prefill): what K really costs on this machine, next to what the policy chose."""
    buckets: dict[str, list[float]] = {}
    for step in steps:
        for low, high in DRAFT_BUCKETS:
            if low <= step.draft_len <= high:
                buckets.setdefault(f"{low}-{high}" if high != low else str(low), []).append(step.verify_s * 1e3)
                break
    return {name: round(percentile(values, 50), 3) for name, values in buckets.items()}


def drafts_by_proposer(steps) -> dict[str, dict]:
    """Per drafting source (auto's sub-proposers show up by name): steps, proposed, accepted."""
    table: dict[str, dict] = {}
    for step in steps:
        if step.draft_len:
            row = table.setdefault(step.proposer or "?", {"steps": 0, "proposed": 0, "accepted": 0})
            row["steps"] += 1
            row["proposed"] += step.draft_len
            row["accepted"] += step.accepted
    return table


def summarize(results: Sequence[RunResult], baseline: Sequence[RunResult] | None, sampling: bool = False) -> dict:
    """Every metric of one configuration over its requests (``baseline``: greedy's, same order)."""
    merged = RequestStats()
    for result in results:
        merged = merged.merge(result.stats)
    summary = merged.summary()
    gaps_ms = [gap * 1e3 for gap in merged.token_gaps_s]
    ttft_ms = [t * 1e3 for t in merged.ttft_s]
    steps = merged.steps
    base_rate = None
    if baseline:
        base_merged = RequestStats()
        for result in baseline:
            base_merged = base_merged.merge(result.stats)
        base_rate = base_merged.summary()["tokens_per_s"]
    elapsed = sum(r.stats.steps[-1].end_s for r in results if r.stats.steps)
    row = {
        "tokens_per_s": summary["tokens_per_s"],
        "speedup": speedup(summary["tokens_per_s"], base_rate) if base_rate else None,
        "tokens_per_forward": summary["tokens_per_forward"],
        "mean_accepted_length": summary["mean_accepted_length"],
        "coverage": summary["coverage"],
        "acceptance_by_depth": summary["acceptance_by_depth"],
        "ttft_ms_p50": percentile(ttft_ms, 50),
        "itl_ms_p50": percentile(gaps_ms, 50),
        "itl_ms_p95": percentile(gaps_ms, 95),
        "itl_ms_p99": percentile(gaps_ms, 99),
        "proposal_ms_p50": summary["proposal_ms_p50"],
        "verify_ms_p50": summary["verify_ms_p50"],
        "peak_rss_mb": max((r.peak_rss_mb for r in results), default=math.nan),
        "equivalence": None,
        # more of the checklist
        "requests": len(results),
        "tokens": summary["tokens"],
        "target_forwards": summary["target_forwards"],
        "forwards_per_token": summary["target_forwards"] / summary["tokens"] if summary["tokens"] else None,
        "proposed_tokens": summary["drafted_tokens"],
        "accepted_tokens": summary["accepted_tokens"],
        "verified_positions": sum(step.draft_len + 1 for step in steps),
        "acceptance_rate": summary["accepted_tokens"] / summary["drafted_tokens"]
        if summary["drafted_tokens"]
        else None,
        "ttft_ms_p95": percentile(ttft_ms, 95),
        "proposal_ms_p95": summary["proposal_ms_p95"],
        "verify_ms_p95": summary["verify_ms_p95"],
        "request_throughput_per_s": len(results) / elapsed if elapsed > 0 else None,
        "speedup_median": None,
        "cuda_max_allocated_mb": max((r.cuda_peak_mb for r in results if r.cuda_peak_mb is not None), default=None),
        "drafts_by_proposer": drafts_by_proposer(steps),
        "verify_ms_p50_by_draft_len": verify_ms_by_draft_len([step for r in results for step in r.stats.steps[1:]]),
        "itl_ms": [round(gap, 3) for gap in gaps_ms],  # for the distribution plot
    }
    if baseline:
        row["speedup_median"] = median_ratio(
            [request_rate(r.stats) for r in results], [request_rate(r.stats) for r in baseline]
        )
        same = [r.output_ids == b.output_ids for r, b in zip(results, baseline)]
        if sampling:
            row["distribution"] = {
                "output_tokens_mean": sum(len(r.output_ids) for r in results) / max(len(results), 1),
                "unigram_tv_vs_greedy": unigram_tv([r.output_ids for r in results], [b.output_ids for b in baseline]),
                "identical_to_greedy": sum(same) / len(same) if same else None,
            }
        else:
            row["equivalence"] = sum(same) / len(same) if same else None
    return {key: _clean(value) for key, value in row.items()}


def _clean(value):
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 4)
    return value


# -- running -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSettings:
    mode: str  # "real" | "replay"
    max_new_tokens: int
    draft_len: int
    sampling: SamplingParams = SamplingParams()


@dataclass
class Prepared:
    """A case tokenized for one run: its prompt, and in replay the recording to force."""

    case: BenchCase
    prompt_ids: list[int]
    recording: Recording | None
    max_new_tokens: int


def prepare(target, case, settings: RunSettings, end_ids: frozenset[int]) -> Prepared | None:
    """None when the prompt leaves no room in the model's context."""
    prompt_ids = target.encode(case.prompt)
    room = target.max_context - len(prompt_ids) - 1
    if room < 2:
        return None
    budget = min(settings.max_new_tokens, room)
    if settings.mode == "real":
        return Prepared(case, prompt_ids, None, budget)
    recorded = target.encode(case.output)
    complete = len(recorded) < budget
    output_ids = tuple(recorded[:budget])
    eos = getattr(target.tokenizer, "eos_token_id", None)
    end_id = (eos if eos in end_ids else min(end_ids)) if complete and end_ids else None
    recording = Recording(tuple(prompt_ids), output_ids, end_id)
    return Prepared(case, prompt_ids, recording, len(output_ids) + (1 if end_id is not None else 0))


def run_interleaved(
    prepared: Sequence[Prepared],
    runners: dict[str, Callable[[Prepared], RunResult]],
    progress: Callable[[str], None] | None = None,
) -> dict[str, list[RunResult]]:
    """Every runner on every prepared case, interleaved; results per configuration in case order."""
    names = list(runners)
    results: dict[str, list] = {name: [None] * len(prepared) for name in names}
    started = time.perf_counter()
    for number, (request, name) in enumerate(interleaved_order(len(prepared), names), 1):
        results[name][request] = runners[name](prepared[request])
        if progress is not None and number % len(names) == 0:
            progress(f"request {request + 1}/{len(prepared)} done ({time.perf_counter() - started:.0f} s)")
    return results


def make_runners(
    configs: Sequence[str], target, codespec_configs: dict, hf_configs: dict, settings: RunSettings, probe: MemoryProbe
) -> dict[str, Callable[[Prepared], RunResult]]:
    """One callable per configuration; replay recordings are registered on ``target`` around each run."""

    def codespec_runner(config):
        def run(item: Prepared) -> RunResult:
            limits = GenerationLimits(
                item.max_new_tokens, (), None, settings.draft_len, stop_token_ids=frozenset(target.eos_token_ids)
            )  # the formats' end markers too
            if item.recording is not None:
                target.recordings.add(item.recording)
            try:
                return config.run(target, item.case, item.prompt_ids, limits, settings.sampling, probe)
            finally:
                if item.recording is not None:
                    target.recordings.remove(item.recording)

        return run

    def hf_runner(config):
        def run(item: Prepared) -> RunResult:
            return config.run(item.case, item.prompt_ids, item.max_new_tokens, settings.sampling, probe, item.recording)

        return run

    runners = {}
    for name in configs:
        if name in codespec_configs:
            runners[name] = codespec_runner(codespec_configs[name])
        else:
            runners[name] = hf_runner(hf_configs[name])
    return runners
