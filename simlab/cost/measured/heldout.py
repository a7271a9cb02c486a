"""``python -m simlab.cost.measured.heldout --gpu h100_sxm --backend vllm``: the interpolation's
error on measured shapes it did not see.

For every table class (GEMM, attention -- context and generation --, MoE, all-reduce) and every
axis of its grid, each line of measured points along that axis (the other axes fixed) has its
alternate interior points held back; each is predicted from its two kept neighbours exactly as
:mod:`simlab.cost.measured.interpolate` predicts an unmeasured shape (the log efficiency against
the table's roofline reference, linear in log shape, clamped to the neighbours), and compared
with its measurement (the tables as measured: their GEMM spikes kept, not taken at their fit
as a run takes them). Prints the median and P90 of
``|predicted / measured - 1|`` per class and the points behind them, and the table's own
scatter between shapes that do the same work (:mod:`simlab.cost.measured.noise`), a floor under
that error. ``moe_shape``: each measured MoE model left out and timed from the nearest other
model's shape, as :mod:`simlab.cost.measured.transfer` times a shape the table lacks.
``gdn_scan_gpu`` (a GPU whose tables lack GDN's chunked scan): each GPU that lends it left out
and timed from the others, as :mod:`simlab.cost.measured.delta_lend` times it.
``head_W`` (a prefill attention width ``W`` these tables lack): the class's GPUs that measured
it, timed from the width this table has, as :mod:`simlab.cost.measured.head_width` times it.
``--json FILE`` writes them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

from simlab.cost.measured import delta_lend, head_width, select, tables, transfer
from simlab.cost.measured.interpolate import Grid
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.noise import noise

log = logging.getLogger(__name__)

#: head dimension of the attention grids checked (every measured GPU has it)
HEAD_DIM = 128


def axis_errors(grid: Grid) -> np.ndarray:
    """``|predicted / measured - 1|`` of every alternate interior point along every axis."""
    errors = []
    for axis, values in enumerate(grid.axes):
        if len(values) < 3:
            continue
        lines, ref = (
            np.moveaxis(a, axis, -1).reshape(-1, len(values)) for a in (grid.log_y, grid.log_ref)
        )
        lx = np.log(np.asarray(values, dtype=float))
        held = np.arange(1, len(values) - 1, 2)
        w = (lx[held] - lx[held - 1]) / (lx[held + 1] - lx[held - 1])
        efficiency = lines - ref
        predicted = efficiency[:, held - 1] * (1 - w) + efficiency[:, held + 1] * w + ref[:, held]
        if grid.reference is not None:  # clamped to the neighbours, as Grid.at does
            below, above = lines[:, held - 1], lines[:, held + 1]
            predicted = np.clip(predicted, np.fmin(below, above), np.fmax(below, above))
        error = np.abs(np.exp(predicted - lines[:, held]) - 1)
        errors.append(error[np.isfinite(error)])
    return np.concatenate(errors) if errors else np.array([])


def class_grids(kernels: Kernels) -> dict[str, list[Grid]]:
    """The grids of each class of ``kernels`` (MoE: one per measured model shape)."""
    keys: dict[str, list[tuple[object, ...]]] = {
        "gemm": [("gemm",)],
        "attention": [("context", HEAD_DIM, 0), ("generation", HEAD_DIM, 0)],
        "moe": [("moe", *shape) for shape in kernels.moe_shapes()],
        "allreduce": [("allreduce", gpus) for gpus in (2, 4, 8)],
    }
    out: dict[str, list[Grid]] = {}
    for cls, wanted in keys.items():
        grids = [kernels.grid(key) for key in wanted]
        out[cls] = [g for g in grids if g is not None]
    return out


def report(kernels: Kernels) -> dict[str, dict[str, float]]:
    """``{class: {median, p90, points}}`` of the held-out errors, and ``noise_p90``, the
    scatter of the table's equal-work shapes (:mod:`~simlab.cost.measured.noise`), where the
    class has such shapes."""
    out: dict[str, dict[str, float]] = {}
    grids_of = class_grids(kernels)
    floor = noise(grids_of)
    per_class = {
        cls: np.concatenate([axis_errors(g) for g in grids]) if grids else np.array([])
        for cls, grids in grids_of.items()
    }
    per_class["moe_shape"] = transfer.held_out_errors(kernels)
    if kernels.grid(("gdn", *delta_lend.SCAN, 0)) is None:  # the scan comes from other GPUs
        per_class["gdn_scan_gpu"] = delta_lend.held_out_errors(kernels.system, kernels.local)
    for width in head_width.WIDTHS:  # the widths these tables lack, from the nearest they hold
        held = kernels.grid(("context", width, 0)) is not None
        source = None if held else head_width.source_width(kernels, width)
        if source is not None:
            per_class[f"head_{width}"] = head_width.class_errors(
                kernels.system, kernels.backend, source, width, kernels.local
            )
    for cls, errors in per_class.items():
        if errors.size:
            out[cls] = {
                "median": float(np.median(errors)),
                "p90": float(np.quantile(errors, 0.9)),
                "points": int(errors.size),
            }
            if cls in floor:
                out[cls]["noise_p90"] = floor[cls]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simlab.cost.measured.heldout")
    parser.add_argument("--gpu", required=True, help="a GPU of the tables, e.g. h100_sxm")
    parser.add_argument("--backend", default="vllm", choices=tables.BACKENDS)
    parser.add_argument("--version", default=None, help="default: the newest measured")
    parser.add_argument("--dtype", default="bf16", choices=tuple(tables.DTYPES))
    parser.add_argument("--json", type=Path, default=None, help="write the table here")
    args = parser.parse_args(argv)
    if args.gpu not in tables.systems():
        known = ", ".join(tables.systems()) or "none: aiconfigurator-core is not installed"
        print(
            f"heldout: error: --gpu {args.gpu!r} has no measured tables ({known})", file=sys.stderr
        )
        return 2
    try:
        version = select.resolve_version(args.gpu, args.backend, args.version)
    except ValueError as err:
        print(f"heldout: error: {err}", file=sys.stderr)
        return 2
    if version is None:
        print(
            f"heldout: error: --backend {args.backend} has no tables on {args.gpu}", file=sys.stderr
        )
        return 2
    result = report(Kernels(args.gpu, args.backend, version, args.dtype, despike=False))
    print(f"{args.gpu} {args.backend} {version} {args.dtype}: held-out error, alternate shapes")
    for cls, row in result.items():
        floor = f"  table noise P90 {100 * row['noise_p90']:4.1f}%" if "noise_p90" in row else ""
        floor += "  each model left out (MoE shapes the tables lack)" if cls == "moe_shape" else ""
        if cls == "gdn_scan_gpu":
            floor += "  each source GPU left out (the GDN scan these tables lack)"
        if cls.startswith("head_"):
            floor += "  on the class's GPUs (a prefill attention width these tables lack)"
        print(
            f"  {cls:<12} median {100 * row['median']:5.1f}%  P90 {100 * row['p90']:5.1f}%  "
            f"({row['points']:,} points){floor}"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"gpu": args.gpu, "backend": args.backend, "version": version, "classes": result},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
