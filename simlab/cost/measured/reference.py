"""The roofline reference a measured table is interpolated against (:class:`Roofline`).

A kernel's latency is close to ``floor + flops / peak + bytes / bandwidth``: a launch floor
(the table's smallest latency), its FLOPs at the GPU's peak and its memory traffic at the GPU's
bandwidth. That sum bends where the measurements bend -- flat while launch-bound, then growing
with the weights read (a GEMM's ``n x k``, the experts a MoE touches) and finally with the work
-- so the measured efficiency ``t / t_ref`` is smoother across shapes than ``t`` itself, and
:mod:`simlab.cost.measured.interpolate` interpolates that ratio rather than the latency.

Decode attention has none: its measured times are a median 9% roofline (H100 and A100), set
by the launch and the split-KV scheduling the roofline does not see, and a single floor puts
the bend in the wrong place (its held-out P90 rises by 0.3-1 point with one).

Each reference takes a table's shape axes (floats or numpy arrays, broadcast) in the grid's
axis order and gives ms; only its shape between neighbouring measurements matters, its scale
cancels at the measured points.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: bytes per value of a GEMM / MoE weight dtype (simlab's dtype names)
WIDTH = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}

Work = Callable[..., tuple[Any, Any]]  # shape axes -> (FLOPs, bytes)


@dataclass(frozen=True, slots=True)
class Roofline:
    """``floor + flops / peak + bytes / bandwidth`` (ms) of a table's ``work``; ``peak`` in
    FLOP/ms, ``bandwidth`` in bytes/ms."""

    work: Work
    peak: float
    bandwidth: float
    floor: float = 0.0

    def __call__(self, *shape: Any) -> Any:
        flops, traffic = self.work(*shape)
        return self.floor + flops / self.peak + traffic / self.bandwidth


def roofline(peaks: dict[str, float] | None, work: Work, dtype: str = "bf16") -> Roofline | None:
    """The reference of ``work`` on a GPU of ``peaks`` (:func:`~.tables.peaks`; None: no
    reference), its tensor-core peak scaled to ``dtype`` (FP8 twice BF16's, FP4 four times)."""
    if peaks is None:
        return None
    scale = WIDTH["bf16"] / WIDTH[dtype]
    return Roofline(work, peaks["peak_tflops"] * 1e9 * scale, peaks["mem_bw_gbps"] * 1e6)


def gemm(dtype: str) -> Work:
    """A GEMM on axes ``(n, k, m)``: ``2mnk`` FLOPs; reads A and B, writes C."""
    width = WIDTH[dtype]

    def work(n: Any, k: Any, m: Any) -> tuple[Any, Any]:
        return 2.0 * m * n * k, width * (m * k + k * n + m * n)

    return work


def context(head_dim: int) -> Work:
    """Causal prefill attention on axes ``(heads, kv heads, batch, length)``: half of the
    ``4 s^2 d`` FLOPs per head; reads Q, K, V and writes O once (BF16)."""

    def work(heads: Any, kv: Any, batch: Any, length: Any) -> tuple[Any, Any]:
        flops = 2.0 * batch * heads * length * length * head_dim
        return flops, 2.0 * batch * length * head_dim * (2 * heads + 2 * kv)

    return work


def moe(shape: tuple[int, ...], dtype: str, matrices: int = 3) -> Work:
    """A fused MoE of ``shape`` (hidden, intermediate, top-k, experts, TP, EP) on its token
    axis: ``matrices`` ``hidden x intermediate / TP`` GEMMs per routed token (3: gated experts;
    2: non-gated, Nemotron-H's ReLU^2), and the weights of the local experts the tokens touch
    (``E (1 - (1 - k/E)^T)`` of them, uniform routing)."""
    hidden, inter, topk, experts, tp, ep = shape
    width, local, expert_values = WIDTH[dtype], experts / ep, matrices * hidden * inter / tp

    def work(tokens: Any) -> tuple[Any, Any]:
        touched = local * (1.0 - (1.0 - topk / experts) ** tokens)
        flops = 2.0 * tokens * topk / ep * expert_values
        return flops, width * touched * expert_values + 4.0 * tokens * hidden

    return work
