"""The policy plans with the measured cost(k) curve, and speculation that does not pay costs (almost)
nothing: pure arithmetic first, then the auto proposer on the real decode loop (tiny random Llama)."""

from __future__ import annotations

import pytest
from engine_harness import ScriptedProposer, always_wrong, oracle, plain_greedy

from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.decode import generate_all
from codespec.core.draft import Draft, MatchInfo
from codespec.proposers.auto import AutoProposer, PolicyConfig, PolicyState
from codespec.proposers.costs import (
    CostCurve,
    CostTable,
    ForwardCosts,
    PiecewiseCurve,
    cost_points,
    isotonic,
    verify_seconds,
)
from codespec.proposers.policy import Candidate, IdleBudget, best_length, choose


# -- the curve ---------------------------------------------------------------------------------
def test_table_reproduces_a_bent_curve_at_its_anchors_and_interpolates_between():
    """A CPU-like curve: flat to k = 4, then 0.5 s per token. Measured at k = 1, 4, 8, 16 only."""
    true = {1: 1.05, 4: 1.05, 8: 3.05, 16: 7.05}
    table = CostTable(decay=1.0, strength=1e-6)
    for _ in range(20):
        for k, seconds in true.items():
            table.add(k, seconds)
    curve = table.curve(fit=(1.0, 0.4), plain=1.0)
    for k, seconds in true.items():
        assert curve(k) == pytest.approx(seconds, rel=1e-4)
    assert curve(6) == pytest.approx(2.05, rel=1e-4)  # between the anchors 4 and 8
    assert curve(12) == pytest.approx(5.05, rel=1e-4)
    assert curve(32) == pytest.approx(7.05 + 0.4 * 16, rel=1e-4)  # past the data: the fit's slope
    assert curve(0) == 1.0


def test_a_measurement_between_anchors_lands_on_both_by_nearness():
    table = CostTable(decay=1.0, strength=1e-6)
    table.add(5, 2.0)  # anchors 4 and 6, half each
    estimates = dict(zip(table.anchors, table.estimates((0.0, 0.0))))
    assert estimates[4] == pytest.approx(2.0, rel=1e-4) and estimates[6] == pytest.approx(2.0, rel=1e-4)
    assert estimates[8] is None


def test_the_curve_never_prices_a_draft_below_a_plain_step_nor_longer_drafts_below_shorter():
    curve = PiecewiseCurve(plain=5.0, points=[(1, 3.9), (4, 6.0), (8, 5.5)], slope=0.2)
    assert curve(1) == 5.0  # a noisy plain mean above the drafted ones: drafts are not free
    assert curve(8) == 6.0  # not cheaper than k = 4
    assert all(curve(k) <= curve(k + 1) for k in range(40))


def test_a_stall_is_booked_at_twice_the_estimate():
    costs = ForwardCosts(decay=1.0)
    for _ in range(10):
        costs.add(0, 0.002)
    costs.add(0, 0.100)  # the process was descheduled for 98 ms
    assert costs.plain() == pytest.approx((10 * 0.002 + 0.004) / 11)
    for _ in range(10):
        costs.add(8, 0.003)
    costs.add(8, 1.0)
    assert costs.curve()(8) < 0.004


def test_the_best_length_follows_the_curve_where_a_line_would_not():
    """Flat to k = 4, then 0.5 per token: with 90% acceptance the curve says 4; a line through the
    same end points (1.05 at k = 1, 15.05 at k = 32) prices k = 4 at 2.4 and picks a shorter draft."""
    table = CostCurve(tuple([1.0] + [1.05] * 4 + [1.05 + 0.5 * (k - 4) for k in range(5, 33)]), 0.5)
    candidate = Candidate("reference", [0.9] * 32, 32)
    assert best_length(candidate, table).draft_len == 4
    slope = (15.05 - 1.05) / 31
    assert best_length(candidate, (1.05 - slope, slope)).draft_len < 4
    assert verify_seconds(table, 40) == pytest.approx(15.05 + 0.5 * 8)


def test_weak_drafts_lose_to_plain_decoding_even_when_the_plain_mean_is_inflated():
    curve = PiecewiseCurve(plain=5.0, points=[(1, 3.9)], slope=0.1)
    weak = Candidate("reference", [0.05] * 8, 8)
    assert choose([weak], curve, margin=0.05)[0].name is None
    strong = Candidate("reference", [0.95] * 8, 8)
    assert choose([strong], curve, margin=0.05)[0].name == "reference"


def test_cost_points_report_the_planned_curve():
    assert cost_points(ForwardCosts()) is None
    costs = ForwardCosts(decay=1.0)
    costs.add(0, 0.010)
    costs.add(16, 0.020)
    points = cost_points(costs)
    assert points[0] == pytest.approx(0.010) and points[16] >= points[1] >= 0.010


# -- the idle budget ---------------------------------------------------------------------------
def test_idle_budget_allows_looks_up_to_its_share_of_decoding_time():
    budget = IdleBudget(share=0.01, decay=1.0)
    assert not budget.allows(0.001)  # nothing decoded yet: nothing to spend
    for _ in range(100):
        budget.step(0.002)  # 0.2 s decoded: 2 ms may go to looking
    assert budget.allows(0.0015)
    budget.charge(0.0015)
    assert not budget.allows(0.001) and budget.allows(0.0005)


# -- the auto proposer on the decode loop ------------------------------------------------------
class Matched(ScriptedProposer):
    def propose(self, context):
        draft = super().propose(context)
        return Draft(draft.token_ids, self.name, match=MatchInfo(8, self.name))


@pytest.fixture(scope="module")
def stream(tiny_target):
    from engine_harness import stdlib_corpus

    prompt = tiny_target.encode(stdlib_corpus()[2][:300])
    reference = plain_greedy(tiny_target, prompt, 120)
    return prompt, reference, [*prompt, *reference]


def run(target, prompt, proposer, max_new=120, max_draft=16):
    limits = GenerationLimits(max_new_tokens=max_new, max_draft_len=max_draft)
    return generate_all(target, prompt, proposer, SamplingParams(), limits)


def test_a_useless_lookup_is_mostly_not_even_asked_once_speculation_is_off(tiny_target, stream):
    """Measured costs (no fixed verify_cost): after idle_after plain steps, looking takes at most
    idle_share of the time, so most steps answer "no draft" without running the lookup."""
    prompt, reference, full = stream
    wrong = Matched("wrong", always_wrong(full, tiny_target.vocab_size))
    state = PolicyState.fresh(PolicyConfig())
    auto = AutoProposer(lookups=[wrong], config=PolicyConfig(), state=state)
    finished = run(tiny_target, prompt, auto)
    assert finished.token_ids == reference
    assert auto.skipped_looks > len(finished.stats.steps) // 2
    assert state.plain_streak >= PolicyConfig().idle_after
    # the next request of the same session looks at its first steps, then is idle again at once
    # (the state carries the budget)
    again = AutoProposer(
        lookups=[Matched("wrong", always_wrong(full, tiny_target.vocab_size))], config=PolicyConfig(), state=state
    )
    assert run(tiny_target, prompt, again).token_ids == reference
    assert again.skipped_looks > len(finished.stats.steps) // 2


def test_a_reliable_lookup_is_asked_every_step_and_drafts_long(tiny_target, stream):
    prompt, reference, full = stream
    right = Matched("right", oracle(full))
    auto = AutoProposer(lookups=[right], config=PolicyConfig())
    finished = run(tiny_target, prompt, auto, max_draft=32)
    assert finished.token_ids == reference
    assert auto.skipped_looks == 0
    assert finished.stats.summary()["tokens_per_forward"] > 8


def test_modelled_costs_never_skip_a_look(tiny_target, stream):
    """With fixed costs (tests, model-free replays) a look costs nothing in the modelled time."""
    prompt, reference, full = stream
    wrong = Matched("wrong", always_wrong(full, tiny_target.vocab_size))
    auto = AutoProposer(lookups=[wrong], config=PolicyConfig(verify_cost=(1.0, 0.01)))
    assert run(tiny_target, prompt, auto).token_ids == reference
    assert auto.skipped_looks == 0


def test_one_noisy_anchor_is_pooled_with_its_neighbours_not_spread_to_every_longer_draft():
    """A stall measured once at k = 2 (0.86 s against ~0.15 s elsewhere) must not price k = 4..32."""
    table = CostTable(decay=1.0, strength=1.0)
    table.add(2, 0.86)
    for _ in range(20):
        for k in (4, 8, 16, 32):
            table.add(k, 0.10 + 0.005 * k)
    curve = table.curve(fit=(0.1, 0.005), plain=0.09)
    assert curve(16) < 0.25 and curve(32) < 0.30
    assert all(curve(k) <= curve(k + 1) for k in range(40))
    assert isotonic([(1, 3.0, 1.0), (2, 1.0, 3.0), (4, 5.0, 1.0)]) == [(1, 1.5), (2, 1.5), (4, 5.0)]
