"""Per-shape interpolation of a measured table (:class:`Grid`).

A table is a grid of latencies over a few shape axes (a GEMM's ``n, k, m``; an attention
kernel's heads, KV heads, batch and sequence length), each axis a sorted list of measured
values, with holes where nothing was measured. A query blends the ``2^d`` grid points around it
linearly in log shape -- exact at a measured point, between its measured neighbours elsewhere
(clamped to their range). What is blended is the log of the measured efficiency
``t / t_ref`` against the table's :class:`~simlab.cost.measured.reference.Roofline` (launch
floor + FLOPs at peak + bytes at bandwidth), which is smooth where the latency bends (launch-bound
to weight-bound to compute-bound); a table without one blends log latency, a power law between
neighbours. Beyond the last measured value of the *primary* axis (tokens or
sequence length) the curve is extended as ``t(x_max) (x / x_max)^p`` (``p``: 1 for GEMMs and
MoE, 2 for causal attention) up to :data:`EXTRAPOLATION` times that value; below the first it is
held at the first value (launch-bound). Outside the range of any other axis, or at a hole, there
is no answer (None): the cost model falls back to the roofline.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from simlab.cost.measured.reference import Roofline
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
    one value at a time.

    With a reference (``ref``: ms at a primary value), ``log_y`` is the log efficiency
    ``log(t / t_ref)`` and a value is clamped to the log latencies ``[log_lo, log_hi]`` of the
    measured points blended at its neighbouring knots."""

    log_x: tuple[float, ...]
    log_y: tuple[float, ...]
    x_max: float
    power: float
    exact: bool
    ref: Callable[[float], float] | None = None
    log_lo: tuple[float, ...] = ()
    log_hi: tuple[float, ...] = ()

    def value(self, x: float) -> float | None:
        """Latency at ``x`` (None past :data:`EXTRAPOLATION` x the range)."""
        if x > self.x_max:
            if x > self.x_max * EXTRAPOLATION:
                return None
            return self._knot(len(self.log_x) - 1) * (x / self.x_max) ** self.power
        lx, xs, ys = math.log(max(x, 1e-9)), self.log_x, self.log_y
        i = bisect.bisect_left(xs, lx)
        if i == 0 or xs[i] == lx:
            return self._knot(i)
        w = (lx - xs[i - 1]) / (xs[i] - xs[i - 1])
        log_t = ys[i - 1] * (1 - w) + ys[i] * w
        if self.ref is None:
            return math.exp(log_t)
        lo, hi = min(self.log_lo[i - 1 : i + 1]), max(self.log_hi[i - 1 : i + 1])
        return math.exp(min(max(log_t + math.log(self.ref(x)), lo), hi))

    def _knot(self, i: int) -> float:
        """Latency at the ``i``-th knot (the measured one when ``exact``)."""
        if self.ref is None:
            return math.exp(self.log_y[i])
        log_t = self.log_y[i] + math.log(self.ref(math.exp(self.log_x[i])))
        return math.exp(min(max(log_t, self.log_lo[i]), self.log_hi[i]))

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
    hole); ``power``: the primary axis' extrapolation exponent; ``reference``: the roofline
    the efficiency is measured against, its floor set to the table's smallest latency (None:
    the latency itself is interpolated)."""

    axes: tuple[tuple[float, ...], ...]
    log_y: np.ndarray
    power: float = 1.0
    reference: Roofline | None = None
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.reference is not None:
            floor = float(np.exp(np.nanmin(self.log_y)))
            object.__setattr__(self, "reference", replace(self.reference, floor=floor))

    @functools.cached_property
    def log_ref(self) -> np.ndarray:
        """Log of the reference at every grid point (zeros without one)."""
        if self.reference is None:
            return np.zeros_like(self.log_y)
        mesh = np.meshgrid(*[np.asarray(a, dtype=float) for a in self.axes], indexing="ij")
        return np.log(np.broadcast_to(self.reference(*mesh), self.log_y.shape))

    @classmethod
    def from_frame(
        cls, frame: Any, axes: list[str], power: float, reference: Roofline | None = None
    ) -> Grid | None:
        """A grid from a table's rows: its ``axes`` columns and ``latency`` (None: no rows)."""
        if frame.empty:
            return None
        columns = [frame[a].to_numpy() for a in axes]
        return cls.from_columns(
            columns, frame["latency"].to_numpy(dtype=np.float64), power, reference
        )

    @classmethod
    def from_columns(
        cls,
        columns: list[np.ndarray],
        latency: np.ndarray,
        power: float,
        reference: Roofline | None = None,
    ) -> Grid:
        """A grid from one array per axis and the latencies (ms) of the rows (a shape measured
        twice keeps its last row)."""
        axes, index = [], []
        for values in columns:
            axis, inverse = np.unique(np.asarray(values, dtype=float), return_inverse=True)
            axes.append(tuple(float(v) for v in axis))
            index.append(inverse)
        log_y = np.full([len(a) for a in axes], np.nan)
        log_y[tuple(index)] = np.log(np.asarray(latency, dtype=float))
        return cls(tuple(axes), log_y, power, reference)

    @classmethod
    def from_points(
        cls,
        points: dict[tuple[float, ...], float],
        power: float = 1.0,
        reference: Roofline | None = None,
    ) -> Grid:
        """A grid from ``{shape: latency}`` (every shape the same length)."""
        dims = len(next(iter(points)))
        axes = tuple(tuple(sorted({p[d] for p in points})) for d in range(dims))
        index = [{v: i for i, v in enumerate(axis)} for axis in axes]
        log_y = np.full([len(a) for a in axes], np.nan)
        for shape, latency in points.items():
            log_y[tuple(index[d][v] for d, v in enumerate(shape))] = math.log(latency)
        return cls(axes, log_y, power, reference)

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
        combos = _product([c for c in corners if c is not None])
        efficiency = self.log_y - self.log_ref
        rows = np.zeros(len(self.axes[-1]))
        for combo in combos:
            weight = math.prod(w for _, w in combo)
            rows = rows + weight * efficiency[tuple(i for i, _ in combo)]
        keep = ~np.isnan(rows)
        if not keep.any():
            return None
        primary = np.asarray(self.axes[-1], dtype=float)[keep]
        exact = all(len(c) == 1 for c in corners if c is not None)
        log_x = tuple(float(v) for v in np.log(primary))
        log_y = tuple(float(v) for v in rows[keep])
        if self.reference is None:
            return Curve(log_x, log_y, float(primary[-1]), self.power, exact)
        measured = np.array([self.log_y[tuple(i for i, _ in combo)][keep] for combo in combos])
        ref = functools.partial(self.reference, *others)
        lo, hi = tuple(measured.min(axis=0).tolist()), tuple(measured.max(axis=0).tolist())
        return Curve(log_x, log_y, float(primary[-1]), self.power, exact, ref, lo, hi)

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
