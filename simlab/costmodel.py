"""Analytic roofline cost model of one engine iteration.

Every operation of an iteration is reduced to (op class, FLOPs, bytes moved, kernel launches),
summed over the layers it runs in, and timed as

    t(op) = max(FLOPs / (eta_c * peak), bytes / (eta_m * bandwidth)) + launches * t0

with ``(eta_c, eta_m, t0)`` per op class from a calibration file written by ``gpu_validate``
(defaults otherwise). Identical layers make the per-layer max equal to the max of the totals.

An iteration (:class:`BatchShape`) mixes prefill chunks ``(prefix, new)`` (``new`` tokens over
``prefix + new`` keys, lower-right causal) and decode steps with a given context. Options from
the seeds:

* RadixMLP intra-batch deduplication: position-wise work (projections, MLP/MoE, norms) runs on
  the ``unique_tokens`` of the batch, ``N'`` instead of ``N``; attention and scans do not.
* shared-context decode attention (intra-prompt parallel decoding / cascade): a prefix shared by
  several decoding requests has its KV read once per group; ``shared_kv_tokens`` counts the KV
  token reads saved that way.

Per-GPU work is divided by the tensor-parallel degree, and each attention / SSM / MLP layer adds
one all-reduce of its output (ring: ``2 (tp-1)/tp`` of the activation bytes over the link).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from simlab.model import ModelSpec

OP_CLASSES = (
    "gemm",
    "attn_prefill",
    "attn_decode",
    "ssm_scan",
    "ssm_step",
    "state_copy",
    "elementwise",
    "allreduce",
)


@dataclass(frozen=True)
class Hardware:
    """Published peak numbers of one accelerator (dense FP16/BF16 tensor core)."""

    name: str
    peak_tflops: float
    mem_bw_gbps: float
    mem_gb: float
    link_bw_gbps: float

    def __post_init__(self) -> None:
        for key in ("peak_tflops", "mem_bw_gbps", "mem_gb", "link_bw_gbps"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"hardware.{key} must be a number > 0, got {value!r}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Hardware:
        return cls(**{k: v for k, v in dict(cfg).items() if not str(k).startswith("_")})

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def mem_bw(self) -> float:
        return self.mem_bw_gbps * 1e9

    @property
    def link_bw(self) -> float:
        return self.link_bw_gbps * 1e9


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of peak compute / bandwidth and fixed overhead (s) per launch."""

    eta_c: float
    eta_m: float
    t0: float

    def __post_init__(self) -> None:
        if not (0 < self.eta_c <= 1.5 and 0 < self.eta_m <= 1.5 and self.t0 >= 0):
            raise ValueError(f"efficiency out of range: {self}")


#: Defaults before calibration: typical achieved fractions on A100/H100-class GPUs.
DEFAULT_EFFICIENCY = {
    "gemm": Efficiency(0.70, 0.80, 4e-6),
    "attn_prefill": Efficiency(0.50, 0.75, 6e-6),
    "attn_decode": Efficiency(0.30, 0.70, 6e-6),
    "ssm_scan": Efficiency(0.30, 0.60, 10e-6),
    "ssm_step": Efficiency(0.20, 0.60, 6e-6),
    "state_copy": Efficiency(1.00, 0.80, 3e-6),
    "elementwise": Efficiency(1.00, 0.80, 3e-6),
    "allreduce": Efficiency(1.00, 0.70, 10e-6),
}


@dataclass(frozen=True)
class Calibration:
    """Per-op-class efficiency factors; see :meth:`load` for the file format."""

    efficiency: dict[str, Efficiency] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY))
    source: str = "defaults"

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """Read ``{"hardware": ..., "ops": {class: {"eta_c", "eta_m", "t0"}}}``; classes absent
        from the file keep their defaults."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            ops = data["ops"]
            eff = dict(DEFAULT_EFFICIENCY)
            for name, values in ops.items():
                if name not in OP_CLASSES:
                    raise ValueError(f"unknown op class {name!r}")
                eff[name] = Efficiency(
                    float(values["eta_c"]), float(values["eta_m"]), float(values["t0"])
                )
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"calibration file {path}: {err}") from err
        return cls(efficiency=eff, source=str(path))


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of an iteration, totalled over the layers it runs in."""

    name: str
    op_class: str
    flops: float
    bytes: float
    launches: int


@dataclass
class BatchShape:
    """What one iteration computes."""

    prefill: list[tuple[int, int]] = field(default_factory=list)  # (prefix, new) per chunk
    decode: list[int] = field(default_factory=list)  # context length per decoding request
    unique_tokens: int | None = None  # RadixMLP: deduplicated position-wise tokens (N')
    shared_kv_tokens: int = 0  # decode KV token reads saved by shared-context attention
    state_loads: int = 0  # SSM checkpoints copied into running slots (prefix hits)
    state_stores: int = 0  # SSM checkpoints copied out for the prefix cache
    sampled: int | None = None  # positions needing logits (default: decodes + final chunks)

    @property
    def tokens(self) -> int:
        return sum(q for _, q in self.prefill) + len(self.decode)


class CostModel:
    """Iteration time of a model on a hardware preset, per DESIGN.md "Cost model"."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: Hardware,
        calibration: Calibration | None = None,
        tp: int = 1,
    ):
        if tp < 1:
            raise ValueError(f"tensor-parallel degree must be >= 1, got {tp}")
        self.model = model
        self.hw = hardware
        self.calibration = calibration or Calibration()
        self.tp = tp
        self._rate = {
            name: (e.eta_c * hardware.peak_flops, e.eta_m * hardware.mem_bw, e.t0)
            for name, e in self.calibration.efficiency.items()
        }
        self._rate["allreduce"] = (
            self._rate["allreduce"][0],
            self.calibration.efficiency["allreduce"].eta_m * hardware.link_bw,
            self._rate["allreduce"][2],
        )

    # ------------------------------------------------------------------ timing
    def op_time(self, op: Op) -> float:
        peak, bw, t0 = self._rate[op.op_class]
        return max(op.flops / peak, op.bytes / bw) + op.launches * t0

    def time(self, batch: BatchShape) -> float:
        """Seconds for one iteration computing ``batch`` (0 for an empty batch)."""
        if not batch.prefill and not batch.decode:
            return 0.0
        return sum(self.op_time(op) for op in self.ops(batch))

    def breakdown(self, batch: BatchShape) -> dict[str, float]:
        """Seconds per op name (for reports and calibration)."""
        return {op.name: self.op_time(op) for op in self.ops(batch)}

    def prefill_time(self, prefix: int, new: int) -> float:
        """One request prefilling ``new`` tokens after a cached ``prefix``, alone in a batch
        (a hybrid with a prefix hit also loads its checkpoint)."""
        loads = 1 if (prefix and self.model.is_hybrid) else 0
        return self.time(BatchShape(prefill=[(prefix, new)], state_loads=loads))

    def decode_span(
        self, contexts: np.ndarray, steps: int, shared_kv_tokens: int = 0
    ) -> np.ndarray:
        """Durations of ``steps`` consecutive decode-only iterations of the same requests
        (contexts grow by one per step). Every op's FLOPs and bytes are affine in the step, so
        two evaluations give all of them."""
        ctx = [int(c) for c in contexts]
        ops0 = self.ops(BatchShape(decode=ctx, shared_kv_tokens=shared_kv_tokens))
        ops1 = self.ops(BatchShape(decode=[c + 1 for c in ctx], shared_kv_tokens=shared_kv_tokens))
        j = np.arange(steps, dtype=np.float64)
        total = np.zeros(steps)
        for a, b in zip(ops0, ops1, strict=True):
            peak, bw, t0 = self._rate[a.op_class]
            flops = a.flops + (b.flops - a.flops) * j
            moved = a.bytes + (b.bytes - a.bytes) * j
            total += np.maximum(flops / peak, moved / bw) + a.launches * t0
        return total

    # ------------------------------------------------------------------ operations
    def ops(self, batch: BatchShape) -> list[Op]:
        """The operations of one iteration (order and names are stable for a given model)."""
        m = self.model
        n_tok = batch.tokens
        pos = batch.unique_tokens if batch.unique_tokens is not None else n_tok
        ops: list[Op] = []
        if m.n_attn_layers:
            ops += self._attention_ops(batch, pos)
        if m.n_ssm_layers:
            ops += self._ssm_ops(batch, pos)
        if m.n_mlp_layers:
            ops.append(self._mlp_op(pos))
        if m.n_moe_layers:
            ops.append(self._moe_op(pos))
        ops += self._common_ops(batch, pos)
        return [self._per_gpu(op) for op in ops]

    def _per_gpu(self, op: Op) -> Op:
        if self.tp == 1 or op.op_class in ("allreduce", "elementwise"):
            return op
        return replace(op, flops=op.flops / self.tp, bytes=op.bytes / self.tp)

    def _gemm(self, name: str, tokens: int, d_in: int, d_out: int, layers: int) -> Op:
        w = self.model.dtype_bytes
        flops = 2.0 * tokens * d_in * d_out * layers
        moved = (d_in * d_out + tokens * (d_in + d_out)) * w * layers
        return Op(name, "gemm", flops, moved, layers)

    def _attention_ops(self, batch: BatchShape, pos: int) -> list[Op]:
        m = self.model
        na, w, D = m.n_attn_layers, m.dtype_bytes, m.d_model
        qdim, kvdim = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
        ops = [
            self._gemm("attn_qkv_proj", pos, D, qdim + 2 * kvdim, na),
            self._gemm("attn_out_proj", pos, qdim, D, na),
        ]
        if batch.prefill:
            flops = bytes_ = 0.0
            for prefix, new in batch.prefill:
                flops += 4.0 * qdim * (new * prefix + new * (new + 1) / 2)
                bytes_ += (2 * new * qdim + (prefix + new) * 2 * kvdim) * w
            ops.append(Op("attn_prefill", "attn_prefill", flops * na, bytes_ * na, na))
        if batch.decode:
            ctx = float(sum(batch.decode))
            kv_reads = max(ctx - batch.shared_kv_tokens, 0.0)
            flops = 4.0 * qdim * ctx
            bytes_ = (kv_reads * 2 * kvdim + 2 * len(batch.decode) * qdim) * w
            ops.append(Op("attn_decode", "attn_decode", flops * na, bytes_ * na, na))
        return ops

    def _ssm_ops(self, batch: BatchShape, pos: int) -> list[Op]:
        m = self.model
        ns, w, D, N, di = m.n_ssm_layers, m.dtype_bytes, m.d_model, m.ssm_state_dim, m.ssm_d_inner
        conv_ch, K = m.ssm_conv_channels, m.ssm_conv_kernel
        state = m.ssm_state_bytes_per_layer
        if m.ssm_kind == "mamba2":
            in_dim = 2 * di + 2 * m.ssm_n_groups * N + m.ssm_n_heads
            scan_tok = 6 * di * N + 2 * K * conv_ch + 10 * di
        else:
            in_dim = 2 * di
            R = m.ssm_dt_rank
            scan_tok = 2 * di * (R + 2 * N) + 2 * R * di + 9 * di * N + 2 * K * di + 10 * di
        ops = [
            self._gemm("ssm_in_proj", pos, D, in_dim, ns),
            self._gemm("ssm_out_proj", pos, di, D, ns),
        ]
        prefill_tok = sum(q for _, q in batch.prefill)
        if prefill_tok:
            # activations in and out of conv + scan, plus each sequence's state read and written
            moved = prefill_tok * (conv_ch + 2 * di) * w + 2 * state * len(batch.prefill)
            ops.append(Op("ssm_scan", "ssm_scan", scan_tok * prefill_tok * ns, moved * ns, ns))
        if batch.decode:
            n = len(batch.decode)
            moved = n * ((conv_ch + 2 * di) * w + 2 * state)
            ops.append(Op("ssm_step", "ssm_step", scan_tok * n * ns, moved * ns, ns))
        copies = batch.state_loads + batch.state_stores
        if copies:
            ops.append(Op("ssm_state_copy", "state_copy", 0.0, 2.0 * state * copies * ns, copies))
        return ops

    def _mlp_op(self, pos: int) -> Op:
        m = self.model
        mats = 3 if m.mlp_gated else 2
        w, D, inter, n = m.dtype_bytes, m.d_model, m.mlp_intermediate, m.n_mlp_layers
        flops = 2.0 * pos * D * inter * mats * n
        moved = (mats * D * inter + pos * (2 * D + mats * inter)) * w * n
        return Op("mlp", "gemm", flops, moved, 2 * n)

    def _moe_op(self, pos: int) -> Op:
        m = self.model
        mats = 3 if m.mlp_gated else 2
        w, D, inter, n = m.dtype_bytes, m.d_model, m.moe_intermediate, m.n_moe_layers
        active = min(m.moe_experts, pos * m.moe_top_k)  # distinct experts whose weights are read
        flops = (2.0 * pos * D * m.moe_experts + 2.0 * pos * m.moe_top_k * D * inter * mats) * n
        moved = (active * mats * D * inter + pos * m.moe_top_k * (2 * D + mats * inter)) * w * n
        return Op("moe", "gemm", flops, moved, 3 * n)

    def _common_ops(self, batch: BatchShape, pos: int) -> list[Op]:
        m = self.model
        w, D = m.dtype_bytes, m.d_model
        layers = m.n_attn_layers + m.n_ssm_layers + m.n_mlp_layers + m.n_moe_layers
        ops = [
            Op(
                "norms_residuals",
                "elementwise",
                8.0 * pos * D * layers,
                4.0 * pos * D * w * layers,
                layers,
            )
        ]
        sampled = (
            batch.sampled if batch.sampled is not None else len(batch.decode) + len(batch.prefill)
        )
        if m.vocab_size and sampled:
            ops.append(self._gemm("lm_head", sampled, D, m.vocab_size, 1))
        if self.tp > 1:
            reduced = 2.0 * (self.tp - 1) / self.tp * batch.tokens * D * w * layers
            ops.append(Op("tp_allreduce", "allreduce", 0.0, reduced, layers))
        return ops
