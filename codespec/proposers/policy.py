"""The speculation policy's statistics and decision, as pure values and small estimators.

One step of plain decoding yields 1 token for ``plain`` seconds. A draft of length k from a
proposer whose per-depth acceptance is a_1, a_2, ... (a_i = P(draft i accepted | drafts before it
accepted)) yields in expectation

    E(k) = 1 + sum_{j=1..k} prod_{i<=j} a_i        tokens (accepted drafts + the recovered/bonus one)

for ``proposal(k) + verify(k)`` seconds, plus a charge for each expected rejected token (``waste``,
a fraction of a forward: rejected drafts are compute spent for nothing, which the measured slope
of a GPU forward barely shows). The policy picks the (proposer, k) with the best E(k) / cost, and
plain decoding when nothing beats 1 / plain by a margin. Long drafts fall out
of this by themselves: when a source's acceptance stays near 1 at every depth, E(k) grows almost
linearly while verify(k) = a + b k grows slowly, so the best k is the longest available.

Estimators:
- ``DepthAcceptance``: exponentially forgetting counts per depth. Deep positions are seen rarely,
  so each depth's estimate shrinks toward the depth before it (and a bucket's toward its
  proposer's), which extrapolates "always right so far" to deeper positions and "usually wrong"
  to everything after.
- the cost side (``LinearCost``, ``ForwardCosts``, ``CostTable``): ``proposers.costs``.

``PolicyState`` holds what a policy has learned across requests; ``request_share`` prices one
request's part of a shared forward (a batch's), which auto plans with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from codespec.core.draft import BatchShare
from codespec.proposers.costs import Curve, ForwardCosts, LinearCost, VerifyCost, verify_seconds
from codespec.proposers.looks import LookGate


@dataclass(frozen=True)
class PolicyConfig:
    margin: float = 0.05  # speculate only when the expected rate beats plain decoding by this much
    waste: float = 0.05  # extra cost of an expected rejected draft token, as a fraction of a forward
    acceptance_decay: float = 0.97
    cost_decay: float = 0.98
    prior_acceptance: float = 0.5  # optimistic enough that an untried proposer gets tried
    prior_strength: float = 2.0
    lookup_continuation: float = 0.9  # prior for a lookup's deeper tokens once the first is right
    probe_interval: int = 16
    probe_max_interval: int = 256
    probe_max_len: int = 4
    model_max_len: int = 64  # longest autoregressive draft considered (bounds the per-step arithmetic)
    # Fixed costs instead of measured ones, (a, b) seconds for k tokens = a + b k (a plain step: a):
    # for replays that model time, and for deterministic tests. None = measure.
    verify_cost: tuple[float, float] | None = None
    proposal_costs: dict | None = None  # proposer name -> (a, b)
    catch_up_limit: int = 2  # model timings with a longer catch-up prefill are not per-token costs
    # A model proposer whose cache lags (a new prompt, steps drafted by others) must be fed the missing
    # tokens before it drafts: up to this many plain steps' worth is exploration, more is priced in.
    catch_up_free: float = 2.0
    # Speculation that does not pay must cost (almost) nothing: after ``idle_after`` plain steps in
    # a row, looking for a draft (every lookup and the arithmetic; model probes apart) may take at most
    # ``idle_share`` of the decoding time (``IdleBudget``); on other steps auto answers "no draft" at
    # once. A tiny CPU model's 2 ms step would otherwise pay ~0.3 ms of Python on every step.
    idle_after: int = 8
    idle_share: float = 0.005
    probe_share: float = 0.005  # idle probes of model proposers (their catch-up prefill included), on their own


# -- acceptance ---------------------------------------------------------------------------------
class DepthAcceptance:
    """Discounted counts of drafts reaching and passing each depth (index 0 = first draft token)."""

    def __init__(self, decay: float = 0.97) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay = decay
        self.reached: list[float] = []
        self.passed: list[float] = []

    def record(self, passed: int, rejected_next: bool, times: int = 1) -> None:
        """Depths 1..passed were accepted; depth passed+1 was rejected if ``rejected_next``.
        ``times``: that many drafts alike, booked at once exactly as one after another (each
        decays the counts, then adds 1: n of them decay by d^n and add 1 + d + ... + d^(n-1))."""
        seen = passed + (1 if rejected_next else 0)
        if seen == 0 or times <= 0:
            return
        decay = self.decay**times
        added = float(times) if self.decay == 1.0 else (1.0 - decay) / (1.0 - self.decay)
        self.reached = [value * decay for value in self.reached]
        self.passed = [value * decay for value in self.passed]
        while len(self.reached) < seen:
            self.reached.append(0.0)
            self.passed.append(0.0)
        for depth in range(seen):
            self.reached[depth] += added
            if depth < passed:
                self.passed[depth] += added

    @property
    def observations(self) -> float:
        """Discounted number of drafts seen (depth-1 count)."""
        return self.reached[0] if self.reached else 0.0

    def estimates(
        self,
        length: int,
        prior: Sequence[float] | float,
        strength: float = 2.0,
        continuation: float = 0.0,
        stop_below: float = 0.0,
    ) -> list[float]:
        """a_1..a_length. ``prior`` is a per-depth prior (list) or the depth-1 prior mean (float);
        with a float, deeper depths use the previous depth's estimate as their prior mean, raised
        to at least ``continuation`` (a lookup that was right so far tends to stay right). The list
        ends early once the chance of reaching the next depth (the running product) falls below
        ``stop_below``: deeper drafts add nothing, and the policy's arithmetic stops with them."""
        out: list[float] = []
        per_depth: Sequence[float] | None = prior if isinstance(prior, Sequence) else None
        previous = 0.5 if isinstance(prior, Sequence) else float(prior)
        reached_all, passed_all = self.reached, self.passed
        known = len(reached_all)
        survive = 1.0
        for depth in range(length):
            if per_depth is not None:
                base = per_depth[depth] if depth < len(per_depth) else (per_depth[-1] if per_depth else previous)
            else:
                base = previous if depth == 0 else max(previous, continuation)
            reached = reached_all[depth] if depth < known else 0.0
            passed = passed_all[depth] if depth < known else 0.0
            estimate = (passed + strength * base) / (reached + strength)
            out.append(estimate)
            previous = estimate
            survive *= estimate
            if survive < stop_below:
                break
        return out


_EMPTY = DepthAcceptance()  # never recorded into: the prior alone


def bucket(match_len: int | None) -> str:
    """Coarse lookup match-length classes: a longer matched context predicts better continuations."""
    if not match_len or match_len <= 0:
        return "-"
    for upper, name in ((1, "1"), (3, "2-3"), (7, "4-7"), (15, "8-15")):
        if match_len <= upper:
            return name
    return "16+"


class AcceptanceTable:
    """Per-proposer and per-(proposer, match bucket) depth acceptance, shrunk hierarchically."""

    def __init__(self, decay: float = 0.97, prior: float = 0.5, strength: float = 2.0) -> None:
        self.decay = decay
        self.prior = prior
        self.strength = strength
        self.by_proposer: dict[str, DepthAcceptance] = {}
        self.by_bucket: dict[tuple[str, str], DepthAcceptance] = {}
        # estimates asked since the last record, by (proposer, bucket, continuation, stop_below): a
        # batch's rows plan one after another between records and ask the same classes
        self._asked: dict[tuple[str, str, float, float], tuple[int, list[float]]] = {}

    def summary(self, depths: int = 8, digits: int = 3) -> dict[str, list[float]]:
        """Per proposer, its acceptance estimates at the first ``depths`` depths (for logs and reports)."""
        return {
            name: [round(a, digits) for a in table.estimates(depths, self.prior)]
            for name, table in self.by_proposer.items()
        }

    def record(self, proposer: str, match_len: int | None, passed: int, rejected_next: bool, times: int = 1) -> None:
        self._asked.clear()
        self.by_proposer.setdefault(proposer, DepthAcceptance(self.decay)).record(passed, rejected_next, times)
        key = (proposer, bucket(match_len))
        self.by_bucket.setdefault(key, DepthAcceptance(self.decay)).record(passed, rejected_next, times)

    def estimates(
        self, proposer: str, match_len: int | None, length: int, continuation: float = 0.0, stop_below: float = 0.0
    ) -> list[float]:
        """a_1..a_length (shorter when ``stop_below`` cuts it: see ``DepthAcceptance.estimates``).
        Each depth's estimate depends on the depths before it only, so a list worked out for a
        longer draft (or cut short by ``stop_below``) answers a shorter one with its prefix."""
        if length <= 0:
            return []
        cell_name = bucket(match_len)
        key = (proposer, cell_name, continuation, stop_below)
        known = self._asked.get(key)
        if known is not None and (length <= known[0] or len(known[1]) < known[0]):
            return known[1][:length]
        found = self._estimates(proposer, cell_name, length, continuation, stop_below)
        self._asked[key] = (length, found)
        return found[:]

    def _estimates(
        self, proposer: str, cell_name: str, length: int, continuation: float, stop_below: float
    ) -> list[float]:
        overall = self.by_proposer.get(proposer) or _EMPTY
        cell = self.by_bucket.get((proposer, cell_name))
        # the bucket's prior must reach as deep as the bucket could: cut the proposer level only
        # when there is no bucket to refine it
        proposer_level = overall.estimates(
            length, self.prior, self.strength, continuation, stop_below if cell is None else 0.0
        )
        if cell is None:
            return proposer_level
        return cell.estimates(length, proposer_level, self.strength, stop_below=stop_below)


# -- decision -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """What the policy knows about one proposer this step."""

    name: str
    acceptance: Sequence[float]  # a_1..a_max_len
    max_len: int  # most tokens it can draft now (a lookup: the length of the draft it already made)
    proposal_s: tuple[float, float] = (0.0, 0.0)  # drafting k tokens costs a + b k; (0, 0) if already made


@dataclass(frozen=True)
class Choice:
    name: str | None  # None: plain decoding
    draft_len: int
    expected_tokens: float
    cost_s: float

    @property
    def rate(self) -> float:
        """Expected tokens per second."""
        return self.expected_tokens / self.cost_s if self.cost_s > 0 else math.inf


STOP_BELOW = 1e-4  # a depth reached with less chance than this adds nothing to E(k)


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i."""
    total, survive = 1.0, 1.0
    for depth in range(k):
        survive *= acceptance[depth]
        total += survive
    return total


def best_length(candidate: Candidate, verify_s: VerifyCost, waste: float = 0.0) -> Choice:
    """The draft length with the best expected tokens per second for this candidate (k >= 1).

    ``verify_s``: (a, b) for a + b k seconds, or a measured ``CostCurve``. ``waste`` charges each
    expected *rejected* draft token that fraction of a forward on top of its measured cost:
    rejected tokens are compute that a shared accelerator (or a battery) pays for nothing, and the
    measured slope alone says they are nearly free on a GPU.
    """
    curve = verify_s if isinstance(verify_s, Curve) else None
    if isinstance(verify_s, Curve):
        verify_a, verify_b = verify_s(1), 0.0
    else:
        verify_a, verify_b = verify_s
    proposal_a, proposal_b = candidate.proposal_s
    acceptance = candidate.acceptance
    best_k, best_total, best_cost, best_rate = 0, 1.0, 0.0, -1.0
    total, survive = 1.0, 1.0
    for k in range(1, min(candidate.max_len, len(acceptance)) + 1):
        survive *= acceptance[k - 1]
        total += survive
        rejected = k - (total - 1.0)  # expected drafted minus expected accepted
        verify = curve(k) if curve is not None else verify_a + verify_b * k
        cost = proposal_a + proposal_b * k + verify + waste * verify_a * rejected
        rate = total / cost if cost > 0 else math.inf
        if rate > best_rate:
            best_k, best_total, best_cost, best_rate = k, total, cost, rate
        if survive < STOP_BELOW:
            break  # deeper positions add nothing but cost
    if best_k == 0:  # max_len 0: nothing to draft; the empty draft costs a plain step
        return Choice(candidate.name, 0, 1.0, verify_seconds(verify_s, 0))
    return Choice(candidate.name, best_k, best_total, best_cost)


def plain_choice(plain_s: float) -> Choice:
    return Choice(None, 0, 1.0, plain_s)


def choose(
    candidates: Sequence[Candidate],
    verify_s: VerifyCost,
    margin: float = 0.05,
    waste: float = 0.0,
    plain_s: float | None = None,
) -> tuple[Choice, Choice | None]:
    """(decision, best speculative option). Speculate only when it beats plain decoding by ``margin``.

    ``plain_s`` is a step without a draft (default: ``verify_s``'s intercept, or a curve's k = 0)."""
    options = [best_length(c, verify_s, waste) for c in candidates if c.max_len > 0]

    def rate(choice: Choice) -> float:
        return choice.expected_tokens / choice.cost_s if choice.cost_s > 0 else math.inf

    best = max(options, key=rate, default=None)
    plain = plain_choice(verify_seconds(verify_s, 0) if plain_s is None else plain_s)
    if best is not None and rate(best) > rate(plain) * (1.0 + margin):
        return best, best
    return plain, best


class IdleBudget:
    """How much time looking for drafts may take while speculation is off: at most ``share`` of the
    time decoding took, both sums forgetting with ``decay`` per step (~ the last 1 / (1 - decay)
    steps: a probe whose catch-up prefill costs ten forwards waits for ~1,000 idle steps).
    ``allows(cost)`` says whether one more look of ``cost`` seconds fits; ``charge`` books it."""

    def __init__(self, share: float = 0.005, decay: float = 0.999) -> None:
        self.share = share
        self.decay = decay
        self.spent = 0.0
        self.elapsed = 0.0

    def step(self, seconds: float) -> None:
        """A decoding step took ``seconds`` (its forward, drafting and bookkeeping)."""
        if seconds > 0.0 and math.isfinite(seconds):
            self.spent *= self.decay
            self.elapsed = self.elapsed * self.decay + seconds

    def charge(self, seconds: float) -> None:
        if seconds > 0.0 and math.isfinite(seconds):
            self.spent += seconds

    def allows(self, cost: float) -> bool:
        return self.spent + max(cost, 0.0) <= self.share * self.elapsed


@dataclass
class ProbeSchedule:
    """When speculation is off, try a fallback now and then: every ``interval`` plain steps, the
    interval doubling after each probe (up to ``max_interval``) and resetting once speculation pays."""

    base_interval: int = 16
    max_interval: int = 256
    interval: int = field(default=0)
    idle_steps: int = 0

    def __post_init__(self) -> None:
        if self.interval <= 0:
            self.interval = self.base_interval

    def plain_step(self) -> bool:
        """Count a step without speculation; True when the next one should be a probe."""
        self.idle_steps += 1
        return self.idle_steps >= self.interval

    def probed(self) -> None:
        self.idle_steps = 0
        self.interval = min(self.interval * 2, self.max_interval)

    def speculated(self) -> None:
        self.idle_steps = 0
        self.interval = self.base_interval


# -- what a policy has learned, and a shared forward's price --------------------------------------
@dataclass
class PolicyState:
    """What the policy has learned: acceptance by depth and the cost fits. It outlives a proposer
    instance: ``from_setup`` hands every auto built for the same target and candidates the same
    state (a process-wide table), so a request starts with what earlier ones measured, whether
    the caller keeps one proposer for a server's lifetime or builds one per request."""

    acceptance: AcceptanceTable
    verify_cost: ForwardCosts
    proposal_costs: dict[str, LinearCost] = field(default_factory=dict)
    # While speculation is off: the looking and probing budgets, the plain-step streak a session's
    # next request starts from (each request counts its own; its first step always looks), what a
    # look costs, and per model proposer the seconds per token of catching its cache up.
    idle: IdleBudget = field(default_factory=IdleBudget)
    probe_budget: IdleBudget = field(default_factory=IdleBudget)
    plain_streak: int = 0
    look_s: float = 0.0
    catch_up_s: dict[str, float] = field(default_factory=dict)
    look_gates: dict[str, LookGate] = field(default_factory=dict)  # per lookup: what a look costs and saves

    @classmethod
    def fresh(cls, config: PolicyConfig) -> PolicyState:
        return cls(
            AcceptanceTable(config.acceptance_decay, config.prior_acceptance, config.prior_strength),
            ForwardCosts(config.cost_decay),
            idle=IdleBudget(config.idle_share),
            probe_budget=IdleBudget(config.probe_share),
        )


def request_share(batch: BatchShare) -> tuple[float, float] | None:
    """(a plain step's seconds, seconds per drafted token) for one request of a shared forward, or
    None before the forward is measured. Its part of the forward: the fixed cost split among the
    requests, and its own rows. A token not drafted now costs it another row-step later (its share
    of a forward that runs for the others anyway, and its row); a drafted token costs a row now."""
    if batch.row_cost is None:
        return None
    base, per_row = batch.row_cost
    return base / max(1, batch.requests) + per_row, per_row
