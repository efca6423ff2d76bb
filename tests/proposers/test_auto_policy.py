"""The auto policy's pure decision logic on synthetic statistics: expected tokens, draft lengths,
acceptance tables, cost fits, probing, which lookups are asked and drafts in a batch
(tests/proposers/test_auto.py drives the same policy through the real decode loop)."""

from __future__ import annotations

import pytest

from codespec.proposers.costs import ForwardCosts, LinearCost
from codespec.proposers.policy import (
    AcceptanceTable,
    Candidate,
    DepthAcceptance,
    ProbeSchedule,
    best_length,
    bucket,
    choose,
    expected_tokens,
)

VERIFY = (1.0, 0.01)  # a forward costs 1 s plus 0.01 s per scored draft token


# -- pure decision logic ---------------------------------------------------------------------
def test_expected_tokens_counts_the_recovered_or_bonus_token():
    assert expected_tokens([0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([1.0] * 8, 8) == 9.0


def test_reliable_lookup_gets_the_longest_draft():
    choice = best_length(Candidate("reference", [0.995] * 96, 96), VERIFY)
    assert choice.draft_len >= 64
    decision, _ = choose([Candidate("reference", [0.995] * 96, 96)], VERIFY)
    assert decision.name == "reference" and decision.draft_len >= 64


def test_draft_length_shrinks_with_acceptance():
    lengths = [best_length(Candidate("c", [a] * 64, 64), VERIFY).draft_len for a in (0.99, 0.9, 0.7, 0.4)]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]


def test_waste_charge_shortens_doubtful_drafts_only():
    doubtful = Candidate("context", [0.6] * 32, 32)
    assert best_length(doubtful, VERIFY, waste=0.1).draft_len < best_length(doubtful, VERIFY, waste=0.0).draft_len
    sure = Candidate("reference", [1.0] * 32, 32)
    assert best_length(sure, VERIFY, waste=0.1).draft_len == 32  # nothing expected to be rejected


def test_nothing_pays_means_plain_decoding():
    decision, best = choose([Candidate("context", [0.02] * 8, 8)], VERIFY)
    assert decision.name is None and decision.draft_len == 0
    assert best.name == "context"  # still reported, for probing and logs


def test_weak_lookup_falls_back_to_a_model():
    weak_lookup = Candidate("context", [0.1] * 8, 8)
    model = Candidate("draft", [0.8] * 16, 16, proposal_s=(0.0, 0.05))
    decision, _ = choose([weak_lookup, model], VERIFY)
    assert decision.name == "draft" and decision.draft_len > 1


def test_expensive_model_loses_to_plain_decoding():
    model = Candidate("early-exit", [0.3] * 16, 16, proposal_s=(0.0, 0.5))  # half a forward per token
    decision, _ = choose([model], VERIFY)
    assert decision.name is None


def test_margin_keeps_a_marginal_gain_off():
    # E(1) = 1.05 for 1.01 s: 4% better than 1 token/s, under the 5% margin.
    decision, _ = choose([Candidate("c", [0.0504], 1)], VERIFY, margin=0.05)
    assert decision.name is None
    decision, _ = choose([Candidate("c", [0.0504], 1)], VERIFY, margin=0.0)
    assert decision.name == "c"


def test_depth_acceptance_extrapolates_from_the_last_seen_depth():
    table = DepthAcceptance(decay=1.0)
    for _ in range(50):
        table.record(passed=3, rejected_next=True)  # always exactly three right
    estimates = table.estimates(6, prior=0.5, strength=2.0)
    assert estimates[0] > 0.95 and estimates[2] > 0.95
    assert estimates[3] < 0.05
    assert estimates[4] == pytest.approx(estimates[3]) and estimates[5] == pytest.approx(estimates[3])


def test_censored_shadow_records_do_not_count_as_rejections():
    table = DepthAcceptance(decay=1.0)
    table.record(passed=2, rejected_next=False)  # the emitted run ended before the draft did
    assert table.reached == [1.0, 1.0] and table.passed == [1.0, 1.0]


def test_buckets_shrink_toward_their_proposer():
    table = AcceptanceTable(decay=1.0)
    for _ in range(40):
        table.record("context", 1, passed=0, rejected_next=True)  # 1-token matches: wrong
        table.record("context", 12, passed=8, rejected_next=False)  # long matches: right
    short = table.estimates("context", 1, 4)
    long = table.estimates("context", 12, 4)
    unseen = table.estimates("context", 5, 4)
    assert short[0] < 0.1 < 0.9 < long[0]
    assert short[0] < unseen[0] < long[0]  # an unseen bucket gets the proposer-level estimate
    assert [bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 15, 16, 400)] == [
        "-",
        "1",
        "2-3",
        "2-3",
        "4-7",
        "4-7",
        "8-15",
        "8-15",
        "16+",
        "16+",
    ]


def test_linear_cost_recovers_intercept_and_slope():
    fit = LinearCost("flat", decay=1.0, ridge=1e-6)
    for k in range(0, 33, 4):
        fit.add(k, 2.0 + 0.5 * k)
    a, b = fit.fit()
    assert a == pytest.approx(2.0, rel=1e-3) and b == pytest.approx(0.5, rel=1e-3)


def test_linear_cost_from_one_length_follows_its_prior_shape():
    per_token = LinearCost("proportional")
    per_token.add(4, 0.4)
    assert per_token.predict(8) == pytest.approx(0.8, rel=1e-6)
    forward = LinearCost("flat")
    forward.add(0, 1.0)
    assert forward.predict(0) == pytest.approx(1.0) and forward.predict(10) == pytest.approx(1.2)
    assert LinearCost().fit() is None


def test_noisy_costs_never_make_a_forward_free():
    """Two noisy points that extrapolate to a negative intercept: the fit keeps a positive one, so
    plain decoding never looks infinitely fast."""
    fit = LinearCost("flat", decay=1.0, ridge=1e-6)
    fit.add(20, 0.001)
    fit.add(96, 0.010)
    a, b = fit.fit()
    assert a > 0 and b > 0
    assert choose([Candidate("c", [1.0] * 96, 96)], (a, b))[0].name == "c"


def test_plain_and_drafted_forwards_are_measured_apart():
    """A CPU-like cost: 10 ms plain, 15 ms + 1 ms per token once anything is drafted. One line
    through all steps would price the plain step near the drafted intercept; the split keeps it."""
    costs = ForwardCosts(decay=1.0)
    assert costs.verify_fit() == (1.0, 0.02) and costs.plain() == 1.0  # nothing measured: the default
    costs.add(0, 0.010)
    assert costs.plain() == pytest.approx(0.010)
    assert costs.verify_fit() == pytest.approx((0.010, 0.0002))  # derived until a draft is measured
    for k in (1, 2, 4, 8, 16):
        for _ in range(4):
            costs.add(k, 0.015 + 0.001 * k)
            costs.add(0, 0.010)
    a, b = costs.verify_fit()
    assert a == pytest.approx(0.015, rel=0.1) and b == pytest.approx(0.001, rel=0.1)
    assert costs.plain() == pytest.approx(0.010)


def test_weak_short_drafts_lose_to_a_cheaper_plain_step():
    """40% first-token acceptance: worth a draft when a plain step costs as much as a drafted one's
    intercept, not when the drafted forward costs 1.5x a plain one (a CPU's matrix-matrix jump)."""
    weak = Candidate("reference", [0.4, 0.5, 0.5, 0.5], 4)
    drafted = (0.015, 0.001)
    assert choose([weak], drafted, margin=0.0)[0].name == "reference"
    assert choose([weak], drafted, margin=0.0, plain_s=0.010)[0].name is None
    strong = Candidate("reference", [0.95] * 16, 16)
    assert choose([strong], drafted, margin=0.0, plain_s=0.010)[0].name == "reference"


def test_probe_interval_doubles_and_resets():
    schedule = ProbeSchedule(base_interval=2, max_interval=8)
    due = [schedule.plain_step() for _ in range(2)]
    assert due == [False, True]
    schedule.probed()
    assert schedule.interval == 4 and not any(schedule.plain_step() for _ in range(3)) and schedule.plain_step()
    schedule.probed()
    schedule.probed()
    assert schedule.interval == 8  # capped
    schedule.speculated()
    assert schedule.interval == 2 and schedule.idle_steps == 0


# -- behaviour on streams ------------------------------------------------------------------
# -- which lookups are asked (proposers/looks.py) -------------------------------------------
def test_look_gate_asks_a_dear_lookup_only_while_it_pays_and_backs_off_exploring():
    from codespec.proposers.looks import LookGate

    gate = LookGate(share=0.02, warmup=4, max_interval=8)
    plain_s = 0.003
    for _ in range(4):  # warm-up: always asked, whatever it costs
        assert gate.ask(plain_s)
        gate.looked(0.0005, 0.0)
    asked = [gate.ask(plain_s) for _ in range(40)]
    # 0.5 ms a look (17% of a step) and nothing saved: asked every 1, 2, 4, 8, 8, ... steps
    gaps, last = [], -1
    for index, was in enumerate(asked):
        if was:
            gaps.append(index - last)
            last = index
    assert gaps[:4] == [1, 2, 4, 8] and set(gaps[4:]) == {8}
    assert gate.skipped == asked.count(False)
    for _ in range(200):  # it starts to pay: a token right beyond the baseline each look
        if gate.ask(plain_s):
            gate.looked(0.0005, plain_s)
    assert all(gate.ask(plain_s) for _ in range(10))
    cheap = LookGate(share=0.02, warmup=1)
    cheap.looked(0.00001, 0.0)
    assert all(cheap.ask(plain_s) for _ in range(10))  # under 2% of a step: always asked


def test_a_step_is_clipped_as_the_curve_says_whether_or_not_the_curve_is_built():
    """``ForwardCosts.add`` builds its cost curve only for a step that might be clipped (over CLIP
    plain steps: the curve never prices a draft below a plain step); the booked costs are those of
    always clipping by the curve, stalls included."""
    from codespec.proposers.costs import CLIP

    def always_clipped(costs: ForwardCosts, k: int, seconds: float) -> None:
        if k and costs.drafted.sw >= 3.0:
            seconds = min(seconds, CLIP * costs.curve()(k))
        if k:
            costs.drafted.add(k, seconds)
            costs.table.add(k, seconds)
        else:
            ForwardCosts.add(costs, 0, seconds)

    fast, reference = ForwardCosts(decay=0.98), ForwardCosts(decay=0.98)
    steps = [(k % 17, 0.01 + 0.001 * (k % 17) + (0.2 if k % 11 == 0 else 0.0)) for k in range(300)]
    for k, seconds in steps:
        fast.add(k, seconds)
        always_clipped(reference, k, seconds)
    assert fast.verify_fit() == reference.verify_fit()
    assert [fast.curve()(k) for k in range(40)] == [reference.curve()(k) for k in range(40)]


@pytest.mark.parametrize("decay", [0.97, 1.0])
def test_drafts_booked_together_count_as_booked_one_by_one(decay):
    """A caller serving drafts from a runway books them afterwards, ``times`` at once: the counts
    must be what one record per draft would have left."""
    one_by_one, together = DepthAcceptance(decay), DepthAcceptance(decay)
    for table in (one_by_one, together):
        table.record(2, True)
    for _ in range(5):
        one_by_one.record(6, False)
    together.record(6, False, times=5)
    one_by_one.record(3, True)
    together.record(3, True)
    assert together.reached == pytest.approx(one_by_one.reached)
    assert together.passed == pytest.approx(one_by_one.passed)
    assert together.estimates(8, 0.5) == pytest.approx(one_by_one.estimates(8, 0.5))


@pytest.mark.parametrize("seed", range(12))
def test_estimates_asked_again_between_records_are_the_ones_worked_out_afresh(seed):
    """A batch's rows ask the same classes between records: the answers kept since the last record
    (a longer draft's prefix, or a list ``stop_below`` cut) equal the estimates worked out anew."""
    import random

    rng = random.Random(seed)
    kept, fresh = AcceptanceTable(), AcceptanceTable()
    answered = 0  # asks answered from what was kept
    for _ in range(300):
        proposer, match_len = rng.choice(["context", "outputs", "index"]), rng.choice([None, 1, 2, 5, 9, 20])
        if rng.random() < 0.1:
            passed, rejected = rng.randrange(0, 17), rng.random() < 0.6
            for table in (kept, fresh):
                table.record(proposer, match_len, passed, rejected)
        else:
            length = rng.randrange(0, 17)
            continuation, stop_below = rng.choice([(0.9, 1e-4), (0.9, 1e-4), (0.0, 0.0), (0.0, 0.05)])
            fresh._asked.clear()
            before = dict(kept._asked)
            asked = kept.estimates(proposer, match_len, length, continuation, stop_below)
            assert asked == fresh.estimates(proposer, match_len, length, continuation, stop_below)
            answered += bool(before) and kept._asked == before
    assert answered > 10
