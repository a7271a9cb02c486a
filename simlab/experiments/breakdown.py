"""What a prediction says about where its time comes from (``prediction.json``'s
``kernels``, ``breakdown_sources``, ``time_sources`` and ``unmeasured``): the measured kernel
tables used, each op's source per length, and the unmeasured ops' ranges."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from simlab.cost.measured import select, unmeasured
from simlab.cost.measured.hooks import PREFIX_ATTENTION_UNCERTAINTY
from simlab.cost.measured.sources import worst
from simlab.cost.model import CostModel
from simlab.cost.shapes import BatchShape


def kernels_used(cost: CostModel) -> dict[str, Any] | None:
    """The measured kernels' GPU, backend, version, dtype and each table's version, and the
    MoE shapes its tables lack (:meth:`~simlab.cost.measured.kernels.Kernels.lent`)."""
    if cost.kernels is None:
        return None
    k = cost.kernels.kernels
    return (
        {
            "system": k.system,
            "backend": k.backend,
            "version": k.version,
            "dtype": k.dtype,
            "kv_cache_dtype": k.kv_dtype,
            "tables": k.used_versions(),
            "prefix_attention_uncertainty": PREFIX_ATTENTION_UNCERTAINTY,
        }
        | ({"moe_kernel": k.moe_kernel} if k.moe_kernel else {})
        | k.lent()
        | ({"checkpoint": line} if (line := select.checkpoint_caveat(cost.model, k.dtype)) else {})
    )


def unmeasured_ranges(
    cost: CostModel, runs: list[list[BatchShape]], totals: list[float]
) -> dict[str, Any]:
    """Per unmeasured op its assumption and ``[low, high]`` ms per length, and the prefill's
    range with every unmeasured op at its low / high end (the rest as predicted)."""
    per_shape = [[unmeasured.ranges(cost, shape) for shape in run] for run in runs]
    lent = cost.kernels.kernels.delta_lent if cost.kernels is not None else None
    per_run = [summed_ranges(r) for r in per_shape]
    names = list(dict.fromkeys(op for r in per_run for op in r))
    total_ms = []
    for total, run, ranges in zip(totals, runs, per_shape, strict=True):
        low = high = total
        for shape, r in zip(run, ranges, strict=True):  # an op measured in one iteration
            b = cost.breakdown(shape)  # and not in another moves only where it is not
            low -= sum(b[op] - lo for op, (lo, _) in r.items())
            high += sum(hi - b[op] for op, (_, hi) in r.items())
        total_ms.append([1000 * low, 1000 * high])
    return {
        "assumptions": {op: unmeasured.assumption(op, cost.model.ssm_kind, lent) for op in names},
        "ops_ms": {
            op: [[1000 * v for v in r.get(op, (0.0, 0.0))] for r in per_run] for op in names
        },
        "prefill_ms": total_ms,
    }


def summed_ranges(
    ranges: Iterable[dict[str, tuple[float, float]]],
) -> dict[str, tuple[float, float]]:
    """:func:`summed` for ``(low, high)`` pairs."""
    out: dict[str, tuple[float, float]] = {}
    for r in ranges:
        for op, (lo, hi) in r.items():
            a, b = out.get(op, (0.0, 0.0))
            out[op] = (a + lo, b + hi)
    return out


def op_sources(cost: CostModel, runs: list[list[BatchShape]]) -> dict[str, list[str | None]]:
    """Per op name, its source per length (the worst over that length's iterations; None
    where the op does not run)."""
    out: dict[str, list[str | None]] = {}
    for i, run in enumerate(runs):
        for shape in run:
            for op in cost.ops(shape):
                tags = out.setdefault(op.name, [None] * len(runs))
                tag = cost.source(op)
                tags[i] = tag if tags[i] is None else worst([tags[i] or tag, tag])
    return out


def summed(breakdowns: Iterable[dict[str, float]]) -> dict[str, float]:
    """Seconds per op over several iterations (an op absent from one adds nothing there)."""
    out: dict[str, float] = {}
    for breakdown in breakdowns:
        for op, seconds in breakdown.items():
            out[op] = out.get(op, 0.0) + seconds
    return out
