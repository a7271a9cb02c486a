"""How far a table's own points scatter (:func:`noise`): a floor under any interpolation's
held-out error (:mod:`simlab.cost.measured.heldout`).

Shapes that do the same work should take the same time; how far their measurements differ is
what no interpolation between shapes can predict (run-to-run noise, a kernel or split chosen
differently):

* GEMM: the ``m <= 16`` rows of an ``n x k`` weight whose time is its read (``m (n + k)``
  under 1% of ``n k``): each one's distance from its line's median;
* attention: ``(heads, KV heads, batch)`` and ``(heads / 2, KV heads / 2, 2 batch)`` at the
  same length (the same tiles, FLOPs and bytes): their ratio's distance from 1, over
  ``sqrt(2)`` (one point's share, for independent scatter).

MoE and all-reduce tables have no such shapes.

:func:`despike_gemm` takes the weight-bound GEMM rows that stand far over their expected time
(a measurement's spike, not a kernel's time) at that time before any interpolation, and
:func:`despike_along` the fused-MoE and attention rows that stand far over the same kernel's
time at a larger shape.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from simlab.cost.measured.interpolate import Grid

if TYPE_CHECKING:
    from simlab.cost.measured.kernels import Kernels

#: the GEMM rows whose time is the weight read: at most this many ...
FLAT_ROWS = 16
#: ... and their activations under this share of the weight
FLAT_SHARE = 0.01
#: a weight-bound GEMM row this many times its expected time is a spike: the rows of a clean
#: table lie within 10% of it (``python -m simlab.cost.measured.heldout``'s noise)
SPIKE = 1.25


def despike_gemm(frame: Any) -> tuple[Any, int]:
    """``frame`` (a GEMM table's rows of one kernel and dtype: ``n, k, m, latency``) with each
    spike taken at its expected time, and how many there were.

    The weight-bound rows (``m <= 16``, their activations under 1% of the weight) of an
    ``n x k`` line read the same weight. Their log times are fitted as a line's level plus a
    row count's offset shared by every line (Tukey's median polish, two sweeps): a kernel's
    own step at some ``m`` (vLLM's FP8 kernels on Blackwell slower at one row, its block-scaled
    ones faster at multiples of four) is in the offset, not a spike. A row over :data:`SPIKE`
    times its fit is a measurement's spike (timing noise only adds) and takes the fit, on
    lines of at least three such rows. Rows outside the weight-bound region are never touched
    (their times rise with ``m`` in steps the kernels choose)."""
    if frame.empty or not {"n", "k", "m", "latency"} <= set(frame.columns):
        return frame, 0
    n, k, m = (frame[c].to_numpy(dtype=float) for c in ("n", "k", "m"))
    rows = frame[(m <= FLAT_ROWS) & (FLAT_ROWS * (n + k) < FLAT_SHARE * n * k)]
    if rows.empty:
        return frame, 0
    log_t = np.log(rows["latency"].astype(float))
    line = [rows["n"], rows["k"]]
    offset = log_t * 0.0
    for _ in range(2):
        level = (log_t - offset).groupby(line).transform("median")
        offset = (log_t - level).groupby(rows["m"]).transform("median")
    fit = level + offset
    spike = (log_t - fit > math.log(SPIKE)) & (log_t.groupby(line).transform("size") >= 3)
    if not spike.any():
        return frame, 0
    out = frame.copy()
    out.loc[spike[spike].index, "latency"] = np.exp(fit[spike])
    return out, int(spike.sum())


def gemm_scatter(grid: Grid) -> np.ndarray:
    """``|t / median - 1|`` of the weight-bound GEMMs along each ``(n, k)`` line."""
    n, k, m = (np.asarray(axis) for axis in grid.axes)
    rows = m <= FLAT_ROWS
    out = []
    for i, j in np.ndindex(len(n), len(k)):
        line = grid.log_y[i, j, rows]
        line = line[np.isfinite(line)]
        if FLAT_ROWS * (n[i] + k[j]) < FLAT_SHARE * n[i] * k[j] and line.size >= 3:
            out.append(np.abs(np.exp(line - np.median(line)) - 1))
    return np.concatenate(out) if out else np.array([])


def attention_scatter(grid: Grid) -> np.ndarray:
    """``|t / t' - 1| / sqrt(2)`` of the attention shapes that do the same work."""
    heads, kv, batch = (list(axis) for axis in grid.axes[:3])
    out = []
    for h, g, i in np.ndindex(len(heads), len(kv), len(batch)):
        twin = (heads[h] / 2, kv[g] / 2, batch[i] * 2)
        if twin[0] in heads and twin[1] in kv and twin[2] in batch:
            other = grid.log_y[heads.index(twin[0]), kv.index(twin[1]), batch.index(twin[2])]
            ratio = np.abs(np.exp(grid.log_y[h, g, i] - other) - 1) / math.sqrt(2)
            out.append(ratio[np.isfinite(ratio)])
    return np.concatenate(out) if out else np.array([])


def noise(grids: dict[str, list[Grid]]) -> dict[str, float]:
    """``{class: P90}`` of the scatter of equal-work shapes (classes that have them)."""
    scatter = {"gemm": gemm_scatter, "attention": attention_scatter}
    out = {}
    for cls, measure in scatter.items():
        values = [measure(g) for g in grids.get(cls, [])]
        if values and sum(v.size for v in values):
            out[cls] = float(np.quantile(np.concatenate(values), 0.9))
    return out


def despike_along(frame: Any, axis: str, line: tuple[str, ...] = ()) -> tuple[Any, int]:
    """``frame`` (one kernel's rows, of one dtype and routing) with each spike taken at the
    fastest time measured at a larger ``axis`` on its line (the rows equal in the ``line``
    columns), and how many there were.

    For an op whose work never shrinks as ``axis`` grows -- a fused MoE's tokens (it touches no
    fewer experts, in expectation under the same routing), attention's length -- the time at a
    larger value bounds the time at a smaller one: the kernel could run the smaller shape as the
    larger, masked. A row over :data:`SPIKE` times that bound is a measurement's spike, or a
    tactic mis-chosen for that one shape: TensorRT-LLM 1.3.0rc10's H100 BF16 table times
    Kimi-K2's experts at MoE TP 2 (power-law routing) in 17.8 ms at 1,024 tokens, 5.5 ms at
    768 and 7.6 ms at 2,048. A row under the bound is never raised."""
    if frame.empty or not {axis, "latency"} <= set(frame.columns):
        return frame, 0
    keys = [*line, axis]
    fastest = frame.groupby(keys)["latency"].min().reset_index()  # sorted by line, then axis
    larger = fastest.iloc[::-1]
    if line:
        running = larger.groupby(list(line), sort=False)["latency"].cummin()
        bound = running.groupby([larger[c] for c in line], sort=False).shift(1)
    else:
        bound = larger["latency"].cummin().shift(1)
    fastest["bound"] = bound.reindex(fastest.index).fillna(np.inf)
    merged = frame[keys].merge(fastest[[*keys, "bound"]], on=keys, how="left")
    bounds = merged["bound"].to_numpy(dtype=float)
    spike = frame["latency"].to_numpy(dtype=float) > SPIKE * bounds
    if not spike.any():
        return frame, 0
    out = frame.copy()
    out.loc[out.index[spike], "latency"] = bounds[spike]
    return out, int(spike.sum())


def despiked(kernels: Kernels, frame: Any, what: str, axis: str, line: tuple[str, ...] = ()) -> Any:
    """``frame`` through :func:`despike_along`, its count warned once and kept in
    ``kernels.spikes[what]``; as measured where ``kernels`` read the tables so
    (``despike`` False)."""
    if not kernels.despike:
        return frame
    frame, spikes = despike_along(frame, axis, line)
    if spikes:
        kernels.spikes[what] = spikes
        kernels.warn_once(
            f"{what}: {spikes} of its rows over {SPIKE:g}x the same kernel's time at a larger "
            f"{axis}, measurement spikes: taken at that time (summary.json kernels.spikes)"
        )
    return frame
