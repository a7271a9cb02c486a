"""Prefill attention at a head width a GPU's tables lack, from the nearest width they hold.

A100's attention tables measure 128-wide heads only, for every engine. Without this,
Qwen3.5's and Qwen3-Next's 256-wide full-attention layers and gpt-oss's 64-wide ones ran on
the roofline there. Now the nearest measured width on the same table, at the same GPU, lends
its measured time, scaled by the two widths' references:

    t_w(point) = t_src(point) * ref_w(point) / ref_src(point)

Both references are ``floor + flops / peak + bytes / bandwidth`` of the causal prefill
(:func:`~.reference.context`), with the source table's smallest latency as their floor (its
:class:`~.interpolate.Grid` reference). The floor matters: short prefills are launch-bound, so
the 256-wide time there is close to the 128-wide one, not twice it. The result is tagged
``interpolated``, warned once and recorded in ``kernels.head_widths``. Full attention only: a
sliding window's table has no reference to scale by.

How far off it is: on the tables that measure both widths, each point of the wanted width is
timed from the source width, for the same engine on the GPUs of this GPU's class
(:data:`~.delta_lend.MMA_SYNC`, or the others). Its P90 bounds the time (:mod:`.unmeasured`).
``python -m simlab.cost.measured.heldout`` prints it as ``head_width``.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simlab.cost.measured import delta_lend, reference, tables
from simlab.cost.measured.interpolate import Grid
from simlab.cost.measured.sources import INTERPOLATED

if TYPE_CHECKING:
    from simlab.cost.measured.kernels import Kernels, Timed

#: the head widths the tables hold somewhere
WIDTHS = (64, 128, 192, 256, 512)


def source_width(kernels: Kernels, head_dim: int) -> int | None:
    """The measured full-attention width nearest ``head_dim`` (in log) on ``kernels``' table,
    the wider of two equally near; None: none."""
    measured = [w for w in WIDTHS if w != head_dim and kernels.grid(("context", w, 0))]
    return min(measured, key=lambda w: (abs(math.log(w / head_dim)), -w)) if measured else None


def scaled(grid: Grid, head_dim: int, point: tuple[float, ...]) -> float | None:
    """``grid``'s time at ``point`` (heads, KV heads, batch, length) at ``head_dim`` instead."""
    timed = grid.at(point)
    if timed is None or grid.reference is None:
        return None
    target = replace(grid.reference, work=reference.context(head_dim))
    return float(timed[0] * target(*point) / grid.reference(*point))


def context(
    kernels: Kernels, batch: int, length: float, heads: int, kv: int, head_dim: int
) -> Timed:
    """Causal prefill attention at ``head_dim`` from the nearest measured width (None: no
    width measured, or outside that table)."""
    source = source_width(kernels, head_dim)
    grid = None if source is None else kernels.grid(("context", source, 0))
    ms = None if grid is None else scaled(grid, head_dim, (heads, kv, batch, length))
    if ms is None or source is None:
        return None
    kernels.record_width(head_dim, source)
    return ms, INTERPOLATED


def held_out_errors(grid_from: Grid, grid_to: Grid, head_dim: int) -> list[float]:
    """``|scaled / measured - 1|`` of every measured point of ``grid_to`` (``head_dim`` wide)
    timed from ``grid_from``."""
    errors = []
    measured = grid_to.log_y.reshape([len(a) for a in grid_to.axes])
    for index in itertools.product(*[range(len(a)) for a in grid_to.axes]):
        point = tuple(float(a[i]) for a, i in zip(grid_to.axes, index, strict=True))
        ms = scaled(grid_from, head_dim, point) if np.isfinite(measured[index]) else None
        if ms is not None:
            errors.append(abs(ms / math.exp(measured[index]) - 1))
    return errors


@functools.lru_cache(maxsize=32)
def class_errors(
    system: str, backend: str, source: int, head_dim: int, local: Path | None = None
) -> np.ndarray:
    """:func:`held_out_errors` from ``source`` to ``head_dim`` wide heads on the newest
    ``backend`` tables of the other GPUs of ``system``'s class that measured both."""
    from simlab.cost.measured.kernels import Kernels  # here: it imports this module

    mma = delta_lend.sm_version(system) in delta_lend.MMA_SYNC
    errors: list[float] = []
    for gpu in tables.systems():
        have = tables.versions(gpu, backend, local)
        if gpu == system or not have or (delta_lend.sm_version(gpu) in delta_lend.MMA_SYNC) != mma:
            continue
        other = Kernels(gpu, backend, have[-1], local=local, despike=False)
        grids = other.grid(("context", source, 0)), other.grid(("context", head_dim, 0))
        if grids[0] is not None and grids[1] is not None:
            errors += held_out_errors(grids[0], grids[1], head_dim)
    return np.asarray(errors)


def transfer_p90(kernels: Kernels, head_dim: int) -> float | None:
    """The P90 of :func:`class_errors` for the width ``head_dim`` was timed from (None: not
    transferred, or no GPU of the class measured both)."""
    source = kernels.head_widths.get(head_dim)
    if source is None:
        return None
    errors = class_errors(kernels.system, kernels.backend, source, head_dim, kernels.local)
    return float(np.quantile(errors, 0.9)) if errors.size else None
