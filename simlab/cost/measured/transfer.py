"""A fused MoE whose shape no table measured, timed from the nearest measured shape
(:func:`nearest`, :func:`moe_ms`).

A table measures the fused MoE of a few models only (hidden, intermediate, top-k, experts, MoE
TP and EP): on A100 with vLLM 0.14, nine of them, not Qwen3.5-35B-A3B's 256 experts of 512 nor
Jamba's 16. On the calibrated roofline, which times the MoE as dense GEMMs, the fused kernel
comes out at 0.49-0.72x its measured time from 256 to 8,192 tokens (Qwen3-30B-A3B and
Qwen3-235B-A22B on ``a100_80gb`` with vLLM, whose shapes are measured: ``engine.kernels=roofline``
against the tables).

Instead, the nearest measured shape at the same expert parallelism (Euclidean in the logs of
hidden, intermediate per GPU, top-k and experts per GPU) lends its measured efficiency against
the :func:`~simlab.cost.measured.reference.moe` roofline, at equal tokens per expert (each
expert's GEMM rows, which set the grouped GEMM's efficiency):

    t(x) = t_src(x_src) * ref(x) / ref_src(x_src),  x_src = x * (k / E) / (k_src / E_src)

where ``ref`` counts the query's expert GEMMs: three for gated experts, two for non-gated ones
(Nemotron-H's ReLU^2 experts). Only gated models' shapes lend: the tables ran Nemotron-H's
experts in either way (A100's vLLM 0.14 rows gated, H100's vLLM 0.24 rows not; :mod:`.moe_gating`
judges them). Which shapes are gated, the model configs the package bundles say, since
its MoE shapes are theirs (:func:`bundled_gating`; a shape of none of them counts as gated).
The result is ``interpolated``. How far it is off is measured by leaving each model out
(every MoE TP of its shape) and timing its measured points from the nearest other model:
``python -m simlab.cost.measured.heldout`` prints it as ``moe_shape``.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from simlab.cost.measured.reference import Roofline
from simlab.model import hf
from simlab.model import layers as kinds
from simlab.model.hf import resolve
from simlab.model.spec import ModelSpec

if TYPE_CHECKING:
    from simlab.cost.measured.kernels import Kernels

Shape = tuple[int, ...]  # (hidden, intermediate, top-k, experts, MoE TP, MoE EP)


def features(shape: Shape) -> tuple[float, ...]:
    """The logs of what sets a fused MoE's efficiency: hidden, intermediate per GPU, top-k and
    experts per GPU."""
    hidden, inter, topk, experts, tp, ep = shape
    return (math.log(hidden), math.log(inter / tp), math.log(topk), math.log(experts / ep))


def nearest(measured: Sequence[Shape], query: Shape, other_model: bool = False) -> Shape | None:
    """The measured gated shape nearest ``query`` at its expert parallelism (None: none
    there); ``other_model``: not one of ``query``'s own model at another MoE TP (the held-out
    check)."""
    wanted = features(query)
    candidates = [
        s
        for s in measured
        if s[5] == query[5] and gated(s) and not (other_model and s[:4] == query[:4])
    ]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda s: (sum((a - b) ** 2 for a, b in zip(features(s), wanted, strict=True)), s),
    )


def source_tokens(tokens: float, query: Shape, source: Shape) -> float:
    """The tokens of ``source`` at which each expert gets as many rows as ``query``'s at
    ``tokens``."""
    return tokens * (query[2] / query[3]) / (source[2] / source[3])


def moe_ms(
    tokens: float, source_ms: float, source_at: float, ref: Roofline, ref_src: Roofline
) -> float:
    """``query``'s time at ``tokens``: the source's measured ``source_ms`` at ``source_at``
    tokens (:func:`source_tokens`), scaled by the two shapes' roofline references."""
    return source_ms * ref(tokens) / ref_src(source_at)


def label(shape: Shape) -> str:
    """``hidden x intermediate, top-k of experts, TP t EP e``."""
    hidden, inter, topk, experts, tp, ep = shape
    return f"{hidden}x{inter} top-{topk} of {experts} (MoE TP {tp}, EP {ep})"


def record(transfers: dict[Shape, Shape]) -> dict[str, str]:
    """``kernels.moe_shapes`` of a summary: each unmeasured shape and the measured one that
    timed it."""
    return {label(shape): label(source) for shape, source in sorted(transfers.items())}


@functools.lru_cache(maxsize=1)
def bundled_gating() -> dict[tuple[int, ...], bool]:
    """``(width, intermediate, top-k, experts) -> gated`` of every MoE model whose config
    aiconfigurator-core bundles (read quietly: their warnings are about serving them)."""
    quiet = logging.getLogger(hf.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    out: dict[tuple[int, ...], bool] = {}
    try:
        for model_id in resolve.bundled_ids():
            try:
                m = ModelSpec.from_config(hf.spec_fields(model_id))
            except ValueError:  # an architecture simlab does not read
                continue
            for width in {kinds.moe_width(m), m.d_model} if m.moe_experts else ():
                # a latent MoE's rows hold its latent width or, in some tables, its hidden one
                out[(width, m.moe_intermediate, m.moe_top_k, m.moe_experts)] = m.mlp_gated
    finally:
        quiet.setLevel(level)
    return out


def gated(shape: Shape) -> bool:
    """Whether ``shape``'s experts are gated, as its bundled model config says (gated when no
    config has the shape)."""
    return bundled_gating().get(shape[:4], True)


def held_out_errors(kernels: Kernels) -> np.ndarray:
    """``|predicted / measured - 1|`` of every measured fused-MoE point of a gated model
    without expert parallelism (the MoE simlab times), each model left out (all its MoE TP
    degrees): its shape timed from the nearest other model's, as a shape no table holds is."""
    shapes = [s for s in kernels.moe_shapes() if s[5] == 1 and gated(s)]
    errors = []
    for shape in shapes:
        source = nearest(shapes, shape, other_model=True)
        grid = kernels.grid(("moe", *shape))
        if source is None or grid is None:
            continue
        for tokens, log_t in zip(grid.axes[0], grid.log_y, strict=True):
            timed = kernels.moe_from(tokens, shape, source) if np.isfinite(log_t) else None
            if timed is not None:
                errors.append(abs(timed[0] / np.exp(log_t) - 1))
    return np.array(errors)
