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
- ``LinearCost``: seconds ~ a + b k by exponentially forgetting least squares, with a ridge pull on
  the slope so a fit from one draft length is still sensible.
- ``ForwardCosts``: plain steps (k = 0) and drafted steps (k >= 1) are measured apart. On a CPU a
  forward over 2 positions costs far more than over 1 (matrix-vector becomes matrix-matrix: 10 ms
  -> 15 ms for a 30M-parameter Llama here, then +1 ms per position), so one line through both
  would put plain decoding's cost too high and make weak drafts look worth verifying. On a GPU
  the two agree and the split changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


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


# -- acceptance ---------------------------------------------------------------------------------
class DepthAcceptance:
    """Discounted counts of drafts reaching and passing each depth (index 0 = first draft token)."""

    def __init__(self, decay: float = 0.97) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay = decay
        self.reached: list[float] = []
        self.passed: list[float] = []

    def record(self, passed: int, rejected_next: bool) -> None:
        """Depths 1..passed were accepted; depth passed+1 was rejected if ``rejected_next``."""
        seen = passed + (1 if rejected_next else 0)
        if seen == 0:
            return
        self.reached = [value * self.decay for value in self.reached]
        self.passed = [value * self.decay for value in self.passed]
        while len(self.reached) < seen:
            self.reached.append(0.0)
            self.passed.append(0.0)
        for depth in range(seen):
            self.reached[depth] += 1.0
            if depth < passed:
                self.passed[depth] += 1.0

    @property
    def observations(self) -> float:
        """Discounted number of drafts seen (depth-1 count)."""
        return self.reached[0] if self.reached else 0.0

    def estimates(self, length: int, prior: Sequence[float] | float, strength: float = 2.0,
                  continuation: float = 0.0) -> list[float]:
        """a_1..a_length. ``prior`` is a per-depth prior (list) or the depth-1 prior mean (float);
        with a float, deeper depths use the previous depth's estimate as their prior mean, raised
        to at least ``continuation`` (a lookup that was right so far tends to stay right)."""
        out: list[float] = []
        previous = 0.5 if isinstance(prior, Sequence) else float(prior)
        for depth in range(length):
            if isinstance(prior, Sequence):
                base = prior[depth] if depth < len(prior) else (prior[-1] if prior else previous)
            else:
                base = previous if depth == 0 else max(previous, continuation)
            reached = self.reached[depth] if depth < len(self.reached) else 0.0
            passed = self.passed[depth] if depth < len(self.passed) else 0.0
            estimate = (passed + strength * base) / (reached + strength)
            out.append(estimate)
            previous = estimate
        return out


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

    def record(self, proposer: str, match_len: int | None, passed: int, rejected_next: bool) -> None:
        self.by_proposer.setdefault(proposer, DepthAcceptance(self.decay)).record(passed, rejected_next)
        key = (proposer, bucket(match_len))
        self.by_bucket.setdefault(key, DepthAcceptance(self.decay)).record(passed, rejected_next)

    def estimates(self, proposer: str, match_len: int | None, length: int, continuation: float = 0.0) -> list[float]:
        overall = self.by_proposer.get(proposer) or DepthAcceptance(self.decay)
        proposer_level = overall.estimates(length, self.prior, self.strength, continuation)
        cell = self.by_bucket.get((proposer, bucket(match_len)))
        if cell is None:
            return proposer_level
        return cell.estimates(length, proposer_level, self.strength)


# -- cost ---------------------------------------------------------------------------------------
class LinearCost:
    """seconds ~ a + b k, exponentially forgetting least squares with a ridge prior on b.

    ``shape`` sets the slope prior: "flat" (a target forward: each extra scored position costs a
    small fraction of the forward) or "proportional" (autoregressive drafting: cost per token).
    """

    def __init__(self, shape: str = "flat", decay: float = 0.98, flat_slope: float = 0.02,
                 ridge: float = 8.0) -> None:
        if shape not in ("flat", "proportional"):
            raise ValueError(f"shape must be flat or proportional, got {shape!r}")
        self.shape = shape
        self.decay = decay
        self.flat_slope = flat_slope
        self.ridge = ridge
        self.sw = self.sk = self.skk = self.st = self.skt = 0.0

    def add(self, k: int, seconds: float) -> None:
        """One measurement. Zero or negative seconds are not measurements (a model-free replay
        that reports no cost) and are skipped, so the caller's default stays in force."""
        if not (seconds > 0.0 and math.isfinite(seconds)):
            return
        d = self.decay
        self.sw = self.sw * d + 1.0
        self.sk = self.sk * d + k
        self.skk = self.skk * d + k * k
        self.st = self.st * d + seconds
        self.skt = self.skt * d + k * seconds

    @property
    def fitted(self) -> bool:
        return self.sw > 0.0

    def fit(self) -> tuple[float, float] | None:
        """(a, b) in seconds and seconds per token, or None before any measurement."""
        if self.sw <= 0.0:
            return None
        mean_t = self.st / self.sw
        if self.shape == "flat":
            slope_prior = self.flat_slope * mean_t
        else:
            slope_prior = self.st / self.sk if self.sk > 0 else mean_t
        lam = self.ridge
        det = self.sw * (self.skk + lam) - self.sk * self.sk
        a = (self.st * (self.skk + lam) - self.sk * (self.skt + lam * slope_prior)) / det
        b = (self.sw * (self.skt + lam * slope_prior) - self.sk * self.st) / det
        slope_floor = 1e-3 * mean_t  # drafting is never free: keeps the best k finite
        if b < slope_floor:
            b = slope_floor
            a = (self.st - b * self.sk) / self.sw
        # Noise can push the intercept to zero or below; a step always has a fixed cost, and a zero
        # one would make plain decoding look infinitely fast (or drafting free).
        intercept_floor = 0.1 * mean_t if self.shape == "flat" else 0.0
        if a < intercept_floor:
            a = intercept_floor
            b = max((self.st - a * self.sw) / self.sk if self.sk > 0 else slope_prior, slope_floor)
        return a, b

    def predict(self, k: int, default: tuple[float, float] = (1.0, 0.02)) -> float:
        a, b = self.fit() or default
        return a + b * k


class ForwardCosts:
    """Target forward costs as the policy sees them: ``plain`` seconds for a step without a draft,
    ``a + b k`` for a step verifying k >= 1 drafted tokens. Each is measured on its own steps;
    until one has a measurement it is derived from the other (or ``default`` when neither has)."""

    def __init__(self, decay: float = 0.98, default: tuple[float, float] = (1.0, 0.02)) -> None:
        self.drafted = LinearCost("flat", decay)
        self.decay = decay
        self.default = default
        self._plain_sum = self._plain_weight = 0.0

    def add(self, k: int, seconds: float) -> None:
        if not (seconds > 0.0 and math.isfinite(seconds)):
            return
        if k > 0:
            self.drafted.add(k, seconds)
        else:
            self._plain_sum = self._plain_sum * self.decay + seconds
            self._plain_weight = self._plain_weight * self.decay + 1.0

    @property
    def plain_measured(self) -> float | None:
        return self._plain_sum / self._plain_weight if self._plain_weight > 0.0 else None

    def verify_fit(self) -> tuple[float, float]:
        """(a, b) for drafted steps: seconds = a + b k."""
        fit = self.drafted.fit()
        if fit is not None:
            return fit
        plain = self.plain_measured
        if plain is not None:  # nothing drafted yet: assume a flat slope from the plain step
            return plain, self.drafted.flat_slope * plain
        return self.default

    def plain(self) -> float:
        measured = self.plain_measured
        return measured if measured is not None else self.verify_fit()[0]

    def fit(self) -> tuple[float, float] | None:
        """The drafted-step fit, or None before any measurement (for reports)."""
        return self.drafted.fit()


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


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i."""
    total, survive = 1.0, 1.0
    for depth in range(k):
        survive *= acceptance[depth]
        total += survive
    return total


def best_length(candidate: Candidate, verify_s: tuple[float, float], waste: float = 0.0) -> Choice:
    """The draft length with the best expected tokens per second for this candidate (k >= 1).

    ``waste`` charges each expected *rejected* draft token that fraction of a forward on top of
    its measured cost: rejected tokens are compute that a shared accelerator (or a battery) pays
    for nothing, and the measured slope alone says they are nearly free on a GPU.
    """
    verify_a, verify_b = verify_s
    proposal_a, proposal_b = candidate.proposal_s
    best = None
    total, survive = 1.0, 1.0
    for k in range(1, candidate.max_len + 1):
        survive *= candidate.acceptance[k - 1]
        total += survive
        rejected = k - (total - 1.0)  # expected drafted minus expected accepted
        cost = proposal_a + proposal_b * k + verify_a + verify_b * k + waste * verify_a * rejected
        choice = Choice(candidate.name, k, total, cost)
        if best is None or choice.rate > best.rate:
            best = choice
        if survive < 1e-4:
            break  # deeper positions add nothing but cost
    if best is None:  # max_len 0: nothing to draft; the empty draft costs a plain step
        return Choice(candidate.name, 0, 1.0, verify_a)
    return best


def plain_choice(plain_s: float) -> Choice:
    return Choice(None, 0, 1.0, plain_s)


def choose(candidates: Sequence[Candidate], verify_s: tuple[float, float], margin: float = 0.05,
           waste: float = 0.0, plain_s: float | None = None) -> tuple[Choice, Choice | None]:
    """(decision, best speculative option). Speculate only when it beats plain decoding by ``margin``.

    ``plain_s`` is a step without a draft (default: ``verify_s``'s intercept)."""
    options = [best_length(c, verify_s, waste) for c in candidates if c.max_len > 0]
    best = max(options, key=lambda choice: choice.rate, default=None)
    plain = plain_choice(verify_s[0] if plain_s is None else plain_s)
    if best is not None and best.rate > plain.rate * (1.0 + margin):
        return best, best
    return plain, best


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
