"""Metric arithmetic on literal step records (docs/design.md §3)."""

from __future__ import annotations

import math

from codespec.core.stats import RequestStats, StepRecord, acceptance_by_depth, percentile


def step(draft_len, accepted, emitted=None):
    return StepRecord(
        "p" if draft_len else "", draft_len, accepted, accepted + 1 if emitted is None else emitted, 0.001, 0.002, 0.0
    )


def test_acceptance_by_depth_is_conditional():
    steps = [step(3, 3), step(3, 1), step(3, 0), step(2, 2)]
    # depth 1: 4 reached, 3 passed; depth 2: 3 reached, 2 passed; depth 3: only (3, 3) reached it.
    assert acceptance_by_depth(steps) == [3 / 4, 2 / 3, 1 / 1]


def test_summary_counts_undrafted_steps():
    stats = RequestStats(steps=[step(0, 0), step(0, 0), step(4, 3), step(4, 0)])
    summary = stats.summary()
    assert summary["tokens"] == 1 + 1 + 4 + 1
    assert summary["target_forwards"] == 4
    assert summary["tokens_per_forward"] == 7 / 4
    assert summary["mean_accepted_length"] == (4 + 1) / 2
    assert summary["coverage"] == 0.5
    recorded_proposal = summary["proposal_ms_p50"]  # literal records above say 1 ms each
    assert math.isclose(recorded_proposal, 1.0)


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert math.isnan(percentile([], 50))


def test_json_safe_turns_every_nan_into_null_so_a_summary_is_valid_json():
    import json

    from codespec.core.stats import json_safe

    summary = RequestStats().summary()  # no steps: every percentile is NaN
    cleaned = json_safe(summary)
    text = json.dumps(cleaned, allow_nan=False)  # raises on any NaN left
    assert json.loads(text)["proposal_ms_p50"] is None
    assert json_safe({"a": [1.5, float("nan")]}) == {"a": [1.5, None]}


def test_itl_is_reported_at_p50_p95_and_p99():
    stats = RequestStats(token_gaps_s=[0.001 * i for i in range(1, 101)])  # 1..100 ms
    summary = stats.summary()
    assert summary["itl_ms_p50"] < summary["itl_ms_p95"] < summary["itl_ms_p99"] <= 100.0
    assert math.isclose(summary["itl_ms_p99"], 99.01)
