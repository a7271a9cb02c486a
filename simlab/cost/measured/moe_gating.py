"""A non-gated model's fused MoE on rows a table ran with gated experts (:func:`as_run`).

Nemotron-H's experts are not gated: up, ReLU^2, down, two GEMMs per routed token, against a
SwiGLU expert's three (gate, up, down). The tables hold Nemotron-3's shapes but do not say how
their collector ran them, and the collectors differ. aiconfigurator's vLLM collector before
0.24 and its SGLang collector before 0.5.14 built every shape's experts gated (``w1`` of
``2 x intermediate``, SiLU-and-multiply). Later ones run Nemotron-H's shapes non-gated, and
TensorRT-LLM's name that kernel ``nongated``. Some cases differ from their version's rule:
SGLang 0.5.14's Nemotron-3-Super FP8 case (hidden 1024) has no non-gated flag, so it ran gated.

So where a non-gated model's shape is in a table, the table's own rows are judged. Each of the
shape's points, at every MoE TP without expert parallelism, is timed from the nearest gated
model's shape on the same table (:func:`~.transfer.nearest`, :meth:`.Kernels.moe_from`): once
as gated experts and once as non-gated. The rows were run the way whose median error is
smaller, if that error is within the table's held-out P90 of that transfer
(:meth:`.Kernels.moe_transfer_p90`). Otherwise the rows cannot tell, and are taken as measured.

Rows run gated time the non-gated model at

    t(x) = t_rows(x) * ref_2(x) / ref_3(x)

where ``ref_2 / ref_3`` is the two expert GEMMs' roofline reference over the three's, at the
same tokens (:func:`~.reference.moe`). The result is tagged ``interpolated``. Each shape so
timed, or left undecided, is warned once and recorded in ``kernels.moe_gating``.
``python -m simlab.cost.measured.moe_gating`` prints every table's verdicts, and checks the
scaling where one GPU has tables of both kinds (:data:`CHECKS`).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simlab.cost.measured import tables, transfer
from simlab.cost.measured.moe_kernel import MOE_COLUMNS
from simlab.cost.measured.sources import INTERPOLATED

if TYPE_CHECKING:
    from simlab.cost.measured.kernels import Kernels, Timed

GATED, NON_GATED, UNDECIDED = "gated", "non-gated", "undecided"


@functools.lru_cache(maxsize=64)
def judge(
    system: str, backend: str, version: str, dtype: str, local: Path | None, model: tuple[int, ...]
) -> tuple[str, dict[str, float]]:
    """How the ``version`` table ran the experts of ``model`` (hidden, intermediate, top-k,
    experts): :data:`GATED`, :data:`NON_GATED` or :data:`UNDECIDED`, with the median errors of
    each way and the P90 that decided it."""
    from simlab.cost.measured.kernels import Kernels  # here: it imports this module

    kernels = Kernels(system, backend, version, dtype, local, despike=False)
    if _named_nongated(kernels.path("moe"), model):
        return NON_GATED, {}
    shapes = kernels.moe_shapes()
    errors: dict[str, list[float]] = {GATED: [], NON_GATED: []}
    for shape in shapes:
        source = transfer.nearest(shapes, shape) if shape[:4] == model else None
        grid = kernels.grid(("moe", *shape))
        if shape[5] != 1 or source is None or grid is None:
            continue
        for tokens, log_t in zip(grid.axes[0], grid.log_y, strict=True):
            for way, gated in ((GATED, True), (NON_GATED, False)):
                timed = kernels.moe_from(tokens, shape, source, gated)
                if timed is not None and np.isfinite(log_t):
                    errors[way].append(abs(timed[0] / np.exp(log_t) - 1))
    p90 = kernels.moe_transfer_p90()
    if p90 is None or not errors[GATED] or not errors[NON_GATED]:
        return UNDECIDED, {}
    median = {way: float(np.median(e)) for way, e in errors.items()}
    best = min(median, key=lambda way: median[way])
    return (best if median[best] <= p90 else UNDECIDED), {**median, "p90": p90}


def _named_nongated(path: Path | None, model: tuple[int, ...]) -> bool:
    """Whether every row of ``model`` in the table at ``path`` names a ``nongated`` kernel."""
    frame = tables.rows(path, ()) if path is not None else None
    if frame is None or "kernel_source" not in frame.columns:
        return False
    for column, value in zip(MOE_COLUMNS, model, strict=False):
        frame = frame[frame[column] == value]
    return not frame.empty and bool(
        frame["kernel_source"].astype(str).str.contains("nongated", regex=False).all()
    )


def as_run(
    kernels: Kernels, tokens: float, shape: tuple[int, ...], gated: bool, timed: Timed
) -> Timed:
    """``timed``, ``shape``'s measured rows at ``tokens``, for a model whose experts are
    ``gated`` or not. It is scaled where the table ran them gated and the model's are not.
    Only a non-gated model is judged: every collector runs a gated model's experts gated."""
    path = kernels.path("moe")
    if gated or timed is None or path is None:
        return timed
    version = kernels.moe_versions.get(shape, path.parent.name)
    verdict, figures = (
        judge(kernels.system, kernels.backend, version, kernels.dtype, kernels.local, shape[:4])
        if shape not in kernels.moe_kernels  # another engine's rows (``engine.moe_kernel``)
        else (UNDECIDED, {})
    )
    if verdict == NON_GATED:
        return timed
    note = (
        f" (off as gated {figures[GATED]:.0%}, as non-gated {figures[NON_GATED]:.0%}, "
        f"transfer P90 {figures['p90']:.0%})"
        if figures
        else ""
    )
    refs = kernels.moe_reference(shape, False), kernels.moe_reference(shape, True)
    if verdict == UNDECIDED or refs[0] is None or refs[1] is None:
        record(
            kernels,
            shape,
            f"non-gated experts on rows that do not tell how they ran: taken as measured{note}",
        )
        return timed
    record(kernels, shape, f"non-gated experts on rows run gated: scaled to 2 GEMMs of 3{note}")
    return timed[0] * refs[0](tokens) / refs[1](tokens), INTERPOLATED


def record(kernels: Kernels, shape: tuple[int, ...], what: str) -> None:
    """Note (once, warned) how ``shape``'s rows were taken, in ``kernels.moe_gating``."""
    if shape not in kernels.moe_gating:
        kernels.moe_gating[shape] = what
        kernels.warn_once(
            f"fused MoE {transfer.label(shape)}: {what} (summary.json kernels.moe_gating)"
        )


def verdicts(system: str, backend: str, version: str, dtype: str = "bf16") -> dict[str, str]:
    """Every non-gated model shape of the ``version`` table: its verdict and the figures."""
    from simlab.cost.measured.kernels import Kernels  # here: it imports this module

    kernels = Kernels(system, backend, version, dtype)
    path = kernels.path("moe")
    if path is None or path.parent.name != version:
        return {}
    out = {}
    for model in sorted({s[:4] for s in kernels.moe_shapes() if not transfer.gated(s)}):
        verdict, figures = judge(system, backend, version, dtype, None, model)
        detail = ", ".join(f"{k} {v:.0%}" for k, v in figures.items()) or "kernel named so"
        out[f"{model[0]}x{model[1]} top-{model[2]} of {model[3]}"] = f"{verdict} ({detail})"
    return out


#: the same GPU's two tables, both Triton's fused MoE, that ran Nemotron-3-Nano gated and not
CHECKS = (
    ("h200_sxm", ("vllm", "0.19.0"), ("vllm", "0.24.0")),
    ("h100_sxm", ("sglang", "0.5.10"), ("vllm", "0.24.0")),
)
#: Nemotron-3-Nano's experts, and a gated model's of about their size (Qwen3-30B-A3B)
NANO, GATED_MODEL = (2688, 1856, 6, 128), (2048, 768, 8, 128)


def check(
    system: str,
    gated_rows: tuple[str, str],
    other: tuple[str, str],
    model: tuple[int, ...],
    scaled: bool = True,
) -> np.ndarray:
    """``|time / measured - 1|`` of every point of ``model`` at MoE TP 1 on the ``other``
    table, timed from the ``gated_rows`` table's rows: ``scaled`` to two GEMMs of three for a
    non-gated model, else as they are."""
    from simlab.cost.measured.kernels import Kernels  # here: it imports this module

    rows = Kernels(system, *gated_rows, despike=False)
    measured = Kernels(system, *other, despike=False)
    shape = (*model, 1, 1)
    grids = rows.grid(("moe", *shape)), measured.grid(("moe", *shape))
    two, three = rows.moe_reference(shape, False), rows.moe_reference(shape, True)
    if grids[0] is None or grids[1] is None or two is None or three is None:
        return np.array([])
    gated = transfer.gated(shape) or not scaled
    scale = (lambda x: 1.0) if gated else (lambda x: two(x) / three(x))
    errors = []
    for tokens, log_t in zip(grids[1].axes[0], grids[1].log_y, strict=True):
        timed = grids[0].at((tokens,))
        if timed is not None and np.isfinite(log_t):
            errors.append(abs(timed[0] * scale(tokens) / np.exp(log_t) - 1))
    return np.asarray(errors)


def main(argv: list[str] | None = None) -> int:
    """Print every table's verdicts and :data:`CHECKS`
    (``python -m simlab.cost.measured.moe_gating``)."""
    del argv
    out = sys.stdout
    for system in tables.systems():
        for backend in ("vllm", "sglang", "trtllm"):
            for version in tables.versions(system, backend):
                for label, verdict in verdicts(system, backend, version).items():
                    out.write(f"{system:20s} {backend:7s} {version:11s} {label:28s} {verdict}\n")
    out.write("\nrows run gated, scaled, against a table that ran them non-gated (MoE TP 1):\n")
    for system, rows, other in CHECKS:
        for name, experts, scaled in (
            ("Qwen3-30B-A3B (gated)", GATED_MODEL, False),
            ("Nemotron-3-Nano as measured", NANO, False),
            ("Nemotron-3-Nano scaled", NANO, True),
        ):
            errors = check(system, rows, other, experts, scaled)
            if errors.size:
                out.write(
                    f"  {system} {' '.join(rows)} -> {' '.join(other)}, {name}: median "
                    f"{np.median(errors):.1%}, P90 {np.quantile(errors, 0.9):.1%}\n"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
