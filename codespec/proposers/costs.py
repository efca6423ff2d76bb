"""What a step costs, measured: the estimators the speculation policy (``proposers.policy``) plans with.

Estimators:
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
from dataclasses import dataclass


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
        # cost(k) >= the plain step for every k (``PiecewiseCurve``): a step under CLIP plain steps
        # is never clipped, and the curve (~40 µs of Python) is built only for one that might be
        if self.drafted.sw >= 3.0 and seconds > CLIP * self.plain():  # the estimate rests on a few measurements
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


COST_POINTS = (0, 1, 2, 4, 8, 16, 32, 64)


def cost_points(costs: ForwardCosts) -> dict[int, float] | None:
    """The planned cost(k) at a few draft lengths (None before any measurement), for reports."""
    if costs.plain_measured is None and costs.fit() is None:
        return None
    curve = costs.curve()
    return {k: curve(k) for k in COST_POINTS}
