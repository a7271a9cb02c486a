"""Per-shape interpolation of a measured table (:class:`Grid`).

A table is a grid of latencies over a few shape axes (a GEMM's ``n, k, m``; an attention
kernel's heads, KV heads, batch and sequence length), each axis a sorted list of measured
values, with holes where nothing was measured. A query blends the ``2^d`` grid points around it
linearly in (log shape, log latency) -- exact at a measured point, between its measured
neighbours elsewhere, and a power law between them (latency ~ tokens x width at large shapes,
constant at small ones). Beyond the last measured value of the *primary* axis (tokens or
sequence length) the curve is extended as ``t(x_max) (x / x_max)^p`` (``p``: 1 for GEMMs and
MoE, 2 for causal attention) up to :data:`EXTRAPOLATION` times that value; below the first it is
held at the first value (launch-bound). Outside the range of any other axis, or at a hole, there
is no answer (None): the cost model falls back to the roofline.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from simlab.cost.measured.sources import INTERPOLATED, MEASURED

#: how far past the largest measured primary value (a factor) a table's curve is extended
EXTRAPOLATION = 8.0

Corner = tuple[tuple[int, float], ...]  # (index, weight) pairs along one axis


def brackets(values: tuple[float, ...], x: float) -> Corner | None:
    """The measured values around ``x`` on one axis and their weights, linear in log ``x``:
    ``((i, 1.0),)`` at a measured value, two neighbours between, None outside the axis."""
    i = int(np.searchsorted(values, x))
    if i < len(values) and values[i] == x:
        return ((i, 1.0),)
    if i == 0 or i == len(values):
        return None
    lo, hi = math.log(values[i - 1]), math.log(values[i])
    w = (math.log(x) - lo) / (hi - lo)
    return ((i - 1, 1.0 - w), (i, w))


@dataclass(frozen=True, slots=True)
class Curve:
    """Log latency along the primary axis at fixed other axes (:meth:`Grid.curve`), and
    whether those were all measured values (``exact``). Plain floats: the hot path asks for
    one value at a time."""

    log_x: tuple[float, ...]
    log_y: tuple[float, ...]
    x_max: float
    power: float
    exact: bool

    def value(self, x: float) -> float | None:
        """Latency at ``x`` (None past :data:`EXTRAPOLATION` x the range)."""
        if x > self.x_max:
            if x > self.x_max * EXTRAPOLATION:
                return None
            return math.exp(self.log_y[-1]) * (x / self.x_max) ** self.power
        lx, xs, ys = math.log(max(x, 1e-9)), self.log_x, self.log_y
        i = bisect.bisect_left(xs, lx)
        if i == 0:
            return math.exp(ys[0])
        if xs[i] == lx:
            return math.exp(ys[i])
        w = (lx - xs[i - 1]) / (xs[i] - xs[i - 1])
        return math.exp(ys[i - 1] * (1 - w) + ys[i] * w)

    def at(self, x: float) -> tuple[float, str] | None:
        """Latency at ``x`` and its source (``measured`` only at a measured shape)."""
        value = self.value(x)
        if value is None:
            return None
        i = bisect.bisect_left(self.log_x, math.log(max(x, 1e-9)))
        hit = self.exact and i < len(self.log_x) and self.log_x[i] == math.log(max(x, 1e-9))
        return value, MEASURED if hit else INTERPOLATED

    def at_many(self, xs: np.ndarray) -> np.ndarray | None:
        """:meth:`value` at each of ``xs`` (None if any lies past the extrapolation limit)."""
        values = [self.value(float(x)) for x in xs]
        if any(v is None for v in values):
            return None
        return np.array(values, dtype=np.float64)


@dataclass(frozen=True)
class Grid:
    """Latencies (ms) of one kernel over shape axes; the last axis is the primary one.

    ``axes``: each axis' sorted measured values; ``log_y``: log latency per grid point (NaN: a
    hole); ``power``: the primary axis' extrapolation exponent."""

    axes: tuple[tuple[float, ...], ...]
    log_y: np.ndarray
    power: float = 1.0
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_columns(cls, columns: list[np.ndarray], latency: np.ndarray, power: float) -> Grid:
        """A grid from one array per axis and the latencies (ms) of the rows (a shape measured
        twice keeps its last row)."""
        axes, index = [], []
        for values in columns:
            axis, inverse = np.unique(np.asarray(values, dtype=float), return_inverse=True)
            axes.append(tuple(float(v) for v in axis))
            index.append(inverse)
        log_y = np.full([len(a) for a in axes], np.nan)
        log_y[tuple(index)] = np.log(np.asarray(latency, dtype=float))
        return cls(tuple(axes), log_y, power)

    @classmethod
    def from_points(cls, points: dict[tuple[float, ...], float], power: float = 1.0) -> Grid:
        """A grid from ``{shape: latency}`` (every shape the same length)."""
        dims = len(next(iter(points)))
        axes = tuple(tuple(sorted({p[d] for p in points})) for d in range(dims))
        index = [{v: i for i, v in enumerate(axis)} for axis in axes]
        log_y = np.full([len(a) for a in axes], np.nan)
        for shape, latency in points.items():
            log_y[tuple(index[d][v] for d, v in enumerate(shape))] = math.log(latency)
        return cls(axes, log_y, power)

    def curve(self, others: tuple[float, ...]) -> Curve | None:
        """The primary-axis curve at ``others`` (one value per other axis), blended from the
        measured points around them; None outside their range or where a corner is missing
        (memoised)."""
        if others in self._cache:
            return self._cache[others]
        result = self._blend(others)
        self._cache[others] = result
        return result

    def _blend(self, others: tuple[float, ...]) -> Curve | None:
        corners = [brackets(axis, x) for axis, x in zip(self.axes, others, strict=False)]
        if any(c is None for c in corners):
            return None
        rows = np.zeros(len(self.axes[-1]))
        for combo in _product([c for c in corners if c is not None]):
            weight = math.prod(w for _, w in combo)
            rows = rows + weight * self.log_y[tuple(i for i, _ in combo)]
        keep = ~np.isnan(rows)
        if not keep.any():
            return None
        primary = np.asarray(self.axes[-1], dtype=float)[keep]
        exact = all(len(c) == 1 for c in corners if c is not None)
        log_x = tuple(float(v) for v in np.log(primary))
        log_y = tuple(float(v) for v in rows[keep])
        return Curve(log_x, log_y, float(primary[-1]), self.power, exact)

    def at(self, shape: tuple[float, ...]) -> tuple[float, str] | None:
        """Latency (ms) and source at ``shape`` (the primary value last), or None."""
        curve = self.curve(tuple(shape[:-1]))
        return None if curve is None else curve.at(shape[-1])


@functools.lru_cache(maxsize=64)
def _product_cached(corners: tuple[Corner, ...]) -> tuple[Corner, ...]:
    out: list[Corner] = [()]
    for axis in corners:
        out = [(*combo, pick) for combo in out for pick in axis]
    return tuple(out)


def _product(corners: list[Corner]) -> tuple[Corner, ...]:
    """Every combination of one (index, weight) per axis."""
    return _product_cached(tuple(corners))
