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
- ``CostTable``: the measured cost(k) curve itself (``PiecewiseCurve``, evaluated on demand). A CPU's curve is not a line: at
  qwen2.5-coder-0.5b with its 151,936-row LM head it steps from k = 0 to 1, bends where the GEMM
  kernels change blocking, and with MKL's kernels was not even monotone (k = 2 dearer than k = 4;
  docs/benchmarks.md). Each drafted step's time lands on the two nearest anchors of a grid of draft
  lengths (1, 2, 3, 4, 6, 8, 12, 16, ...), weighted by nearness; cost(k) interpolates between the
  anchors, each shrunk toward the a + b k fit by how little it has seen, and past the last measured
  anchor follows the fit's slope; it never falls below the plain step (a noisy plain-step mean
  above the drafted ones must not make weak drafts look free) nor decreases in k (weighted isotonic
  regression over the anchors), and measurements are clipped at 2x their estimate (a shared CPU's
  stalls). ``ForwardCosts.curve()`` is what the
  policy plans with.
"""

from __future__ import annotations

import bisect
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

    def record(self, proposer: str, match_len: int | None, passed: int, rejected_next: bool) -> None:
        self.by_proposer.setdefault(proposer, DepthAcceptance(self.decay)).record(passed, rejected_next)
        key = (proposer, bucket(match_len))
        self.by_bucket.setdefault(key, DepthAcceptance(self.decay)).record(passed, rejected_next)

    def estimates(
        self, proposer: str, match_len: int | None, length: int, continuation: float = 0.0, stop_below: float = 0.0
    ) -> list[float]:
        """a_1..a_length (shorter when ``stop_below`` cuts it: see ``DepthAcceptance.estimates``)."""
        overall = self.by_proposer.get(proposer) or _EMPTY
        cell = self.by_bucket.get((proposer, bucket(match_len)))
        # the bucket's prior must reach as deep as the bucket could: cut the proposer level only
        # when there is no bucket to refine it
        proposer_level = overall.estimates(
            length, self.prior, self.strength, continuation, stop_below if cell is None else 0.0
        )
        if cell is None:
            return proposer_level
        return cell.estimates(length, proposer_level, self.strength, stop_below=stop_below)


# -- cost ---------------------------------------------------------------------------------------
class LinearCost:
    """seconds ~ a + b k, exponentially forgetting least squares with a ridge prior on b.

    ``shape`` sets the slope prior: "flat" (a target forward: each extra scored position costs a
    small fraction of the forward) or "proportional" (autoregressive drafting: cost per token).
    """

    def __init__(self, shape: str = "flat", decay: float = 0.98, flat_slope: float = 0.02, ridge: float = 8.0) -> None:
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


ANCHORS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
CLIP = 2.0  # a measured step longer than CLIP x its estimate is booked at CLIP x


class Curve:
    """cost(k): seconds of one target forward verifying k drafted tokens (k = 0: a plain step)."""

    def __call__(self, k: int) -> float:
        raise NotImplementedError


@dataclass(frozen=True)
class CostCurve(Curve):
    """A table: cost(k) for k = 0..len - 1. Longer drafts than it covers cost its last entry plus
    ``slope`` per token."""

    seconds: tuple[float, ...]
    slope: float = 0.0

    def __call__(self, k: int) -> float:
        last = len(self.seconds) - 1
        if k <= last:
            return self.seconds[k]
        return self.seconds[last] + self.slope * (k - last)

    @classmethod
    def linear(cls, a: float, b: float, length: int, plain: float | None = None) -> CostCurve:
        """``a + b k`` for k >= 1 and ``plain`` (default ``a``) for k = 0."""
        return cls(tuple([a if plain is None else plain] + [a + b * k for k in range(1, length + 1)]), b)


class PiecewiseCurve(Curve):
    """``plain`` at k = 0; for k >= 1 linear through ``points`` ((k, seconds), k ascending) and lines
    of ``slope`` beyond them. Evaluated on demand: the policy asks for few k when acceptance is low."""

    def __init__(self, plain: float, points: Sequence[tuple[int, float]], slope: float) -> None:
        # Verifying more tokens never costs less than verifying fewer (or than a plain step): a noisy
        # plain-step mean above the drafted ones would otherwise make every weak draft look free.
        self.plain = plain
        monotone, floor = [], plain
        for k, seconds in points:
            floor = max(floor, seconds)
            monotone.append((k, floor))
        self.points = monotone
        self.keys = [k for k, _ in self.points]
        self.slope = max(slope, 0.0)

    def __call__(self, k: int) -> float:
        if k <= 0:
            return self.plain
        points, keys = self.points, self.keys
        if k <= keys[0]:
            return max(points[0][1] - self.slope * (keys[0] - k), self.plain)
        if k >= keys[-1]:
            return points[-1][1] + self.slope * (k - keys[-1])
        hi = bisect.bisect_left(keys, k)
        (k0, s0), (k1, s1) = points[hi - 1], points[hi]
        return s0 + (s1 - s0) * (k - k0) / (k1 - k0)


VerifyCost = tuple[float, float] | Curve  # (a, b): a + b k seconds; or a measured curve


def verify_seconds(verify_s: VerifyCost, k: int) -> float:
    """Seconds of a forward verifying k drafted tokens under either cost description."""
    if isinstance(verify_s, Curve):
        return verify_s(k)
    a, b = verify_s
    return a + b * k


class CostTable:
    """Measured seconds of drafted forwards (k >= 1) on a grid of draft lengths (``ANCHORS``).

    A measurement at k between anchors lo < k < hi adds to both with weights (hi - k) / (hi - lo) and
    (k - lo) / (hi - lo) (exponentially forgetting, as ``LinearCost``); an anchor's estimate is its
    weighted mean shrunk toward the linear fit with ``strength`` pseudo-measurements. cost(k)
    interpolates linearly between the anchors around k; beyond the last anchor that has data it
    follows the fit's slope from there, and before any data it is the fit."""

    def __init__(self, decay: float = 0.98, strength: float = 1.0, anchors: Sequence[int] = ANCHORS) -> None:
        self.decay = decay
        self.strength = strength
        self.anchors = tuple(anchors)
        self._sum = [0.0] * len(self.anchors)
        self._weight = [0.0] * len(self.anchors)

    def add(self, k: int, seconds: float) -> None:
        if k < 1 or not (seconds > 0.0 and math.isfinite(seconds)):
            return
        self._sum = [value * self.decay for value in self._sum]
        self._weight = [value * self.decay for value in self._weight]
        for index, share in self._shares(k):
            self._sum[index] += share * seconds
            self._weight[index] += share

    def _shares(self, k: int) -> list[tuple[int, float]]:
        anchors = self.anchors
        if k <= anchors[0]:
            return [(0, 1.0)]
        if k >= anchors[-1]:
            return [(len(anchors) - 1, 1.0)]
        hi = next(i for i, a in enumerate(anchors) if a >= k)
        if anchors[hi] == k:
            return [(hi, 1.0)]
        lo = hi - 1
        span = anchors[hi] - anchors[lo]
        return [(lo, (anchors[hi] - k) / span), (hi, (k - anchors[lo]) / span)]

    @property
    def measured(self) -> bool:
        return any(weight > 0.0 for weight in self._weight)

    def estimates(self, fit: tuple[float, float]) -> list[float | None]:
        """Per anchor: the shrunk mean, or None where nothing landed."""
        a, b = fit
        out: list[float | None] = []
        for anchor, total, weight in zip(self.anchors, self._sum, self._weight):
            if weight <= 1e-9:
                out.append(None)
            else:
                out.append((total + self.strength * (a + b * anchor)) / (weight + self.strength))
        return out

    def curve(self, fit: tuple[float, float], plain: float) -> Curve:
        """cost(k) (cost(0) = ``plain``) from the anchors and the linear ``fit``: the measured anchors
        made non-decreasing in k by weighted isotonic regression (a noisy anchor is pooled with its
        neighbours by how much each has seen, rather than lifting every longer draft's price)."""
        a, b = fit
        measured = [
            (anchor, value, weight + self.strength)
            for anchor, value, weight in zip(self.anchors, self.estimates(fit), self._weight)
            if value is not None
        ]
        if not measured:
            return PiecewiseCurve(plain, [(1, a + b)], b)
        return PiecewiseCurve(plain, isotonic(measured), b)


def isotonic(points: Sequence[tuple[int, float, float]]) -> list[tuple[int, float]]:
    """Weighted least-squares non-decreasing fit of (k, value, weight) points (pool adjacent
    violators), as (k, fitted value) in k order."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for _, value, weight in points:
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            value_b, weight_b, count_b = blocks.pop()
            value_a, weight_a, count_a = blocks.pop()
            total = weight_a + weight_b
            blocks.append([(value_a * weight_a + value_b * weight_b) / total, total, count_a + count_b])
    fitted = [block[0] for block in blocks for _ in range(int(block[2]))]
    return [(k, value) for (k, _, _), value in zip(points, fitted)]


class ForwardCosts:
    """Target forward costs as the policy sees them: ``plain`` seconds for a step without a draft,
    ``a + b k`` for a step verifying k >= 1 drafted tokens, and the measured curve (``CostTable``)
    around that line. Each is measured on its own steps; until one has a measurement it is derived
    from the other (or ``default`` when neither has)."""

    def __init__(self, decay: float = 0.98, default: tuple[float, float] = (1.0, 0.02)) -> None:
        self.drafted = LinearCost("flat", decay)
        self.table = CostTable(decay)
        self.decay = decay
        self.default = default
        self._plain_sum = self._plain_weight = 0.0

    def add(self, k: int, seconds: float) -> None:
        if not (seconds > 0.0 and math.isfinite(seconds)):
            return
        # A shared CPU preempts now and then: a step that took far longer than this k usually does is
        # booked at CLIP times the estimate (one 40 ms stall must not price a 2 ms step for a hundred steps).
        if k == 0:  # the common case, kept cheap: a plain step of an idle policy
            if self._plain_weight >= 3.0:
                seconds = min(seconds, CLIP * self._plain_sum / self._plain_weight)
            self._plain_sum = self._plain_sum * self.decay + seconds
            self._plain_weight = self._plain_weight * self.decay + 1.0
            return
        if self.drafted.sw >= 3.0:  # the estimate rests on a few measurements
            seconds = min(seconds, CLIP * self.curve()(k))
        self.drafted.add(k, seconds)
        self.table.add(k, seconds)

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

    def curve(self) -> Curve:
        """cost(k): the plain step, then the measured table around the fit."""
        return self.table.curve(self.verify_fit(), self.plain())


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
    best = max(options, key=lambda choice: choice.rate, default=None)
    plain = plain_choice(verify_seconds(verify_s, 0) if plain_s is None else plain_s)
    if best is not None and best.rate > plain.rate * (1.0 + margin):
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
