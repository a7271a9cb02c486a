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
"""

from __future__ import annotations

import math

import numpy as np

from simlab.cost.measured.interpolate import Grid

#: the GEMM rows whose time is the weight read: at most this many ...
FLAT_ROWS = 16
#: ... and their activations under this share of the weight
FLAT_SHARE = 0.01


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
