"""Analytic roofline cost model of one engine iteration (:class:`CostModel`).

Every operation of an iteration (:mod:`simlab.cost.layers`) is reduced to (op class, FLOPs,
bytes moved, kernel launches), summed over the layers it runs in, and timed as

    t(op) = [max(FLOPs / (eta_c * peak), bytes / (eta_m * bandwidth)) + launches * t0] * s(tokens)
            + fixed

with ``(eta_c, eta_m, t0)`` per op class from a calibration file written by ``gpu_validate``
(:mod:`simlab.cost.calibration`, defaults otherwise), ``s`` an optional measured token-count
curve of the class (1 without one: small-token GEMMs and cache-resident elementwise kernels are
off the plain roofline) and ``fixed`` the terms the roofline misses
(:class:`~simlab.cost.terms.CostTerms`, ``engine.costs``: per-iteration and per-sequence engine
overhead, MoE dispatch, per-copy SSM checkpoint overhead; 0 by default). Identical layers make
the per-layer max equal to the max of the totals. An op a calibration measured
(:mod:`simlab.cost.profiles`) is timed from its measurement instead.

The all-reduce is timed over the link bandwidth: ``t0`` (the small-message latency, per call)
plus its bytes over ``eta_m`` x the link bandwidth; a calibration may give the all-reduce one
efficiency per tensor-parallel degree (``by_tp``). Mamba1's scan, the recurrent decode step and
the elementwise ops run on CUDA cores in FP32, not on tensor cores
(:data:`~simlab.cost.shapes.CUDA_CORE_CLASSES`): their ``eta_c`` is capped at the preset's
``fp32_tflops / peak_tflops``, so no efficiency makes them beat the CUDA cores' peak (the
selective scan's default, 0.30 of the A100's tensor peak, was 4.8x it). Where the real kernel
lands below that ceiling no measurement says yet (``gpu_validate`` on a GPU measures it).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from simlab.cost.calibration import Calibration, Efficiency, curve_scale, log_curve
from simlab.cost.hardware import Hardware
from simlab.cost.layers import LayerOps
from simlab.cost.measured.hooks import MeasuredOps
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.sources import INTERPOLATED, ROOFLINE
from simlab.cost.profiles import ALLREDUCE, Profile
from simlab.cost.shapes import (
    CUDA_CORE_CLASSES,
    ENGINE_OVERHEAD,
    OP_CLASSES,
    BatchShape,
    Op,
    TimedOp,
    on_tp,
)
from simlab.cost.terms import CostTerms
from simlab.model.spec import ModelSpec

#: :meth:`CostModel._position_ops`: the attention projections, the SSM projections, and the
#: ops after the SSM layers' (MLP / MoE, norms), each op with its time
PositionOps = tuple[tuple[TimedOp, ...], tuple[TimedOp, ...], tuple[TimedOp, ...]]
#: position counts :meth:`CostModel._position_ops` remembers (then it starts afresh)
POSITION_MEMO = 4096

#: A decode batch's ops by their place around decode attention (:meth:`CostModel.decode_span_of`):
#: the summed seconds of the ops before it, its constants (None: no decode attention), the
#: seconds of each op after it, and the engine overhead the overlapped loop hides (0: none)
DecodeTemplate = tuple[
    float, tuple[float, float, float, float, float] | None, tuple[float, ...], float
]
#: (peak FLOP/s, bandwidth in bytes/s, seconds per launch) of one op class
Rate = tuple[float, float, float]


def _efficiencies(
    calibration: Calibration, hardware: Hardware, tp: int, terms: CostTerms
) -> dict[str, Efficiency]:
    """The efficiency each op class is timed with: the calibration's at ``tp``, the CUDA-core
    classes capped at the FP32 peak, and the :class:`CostTerms`' scan factors and all-reduce
    latency applied."""
    eff = {name: calibration.for_class(name, tp) for name in OP_CLASSES}
    ceiling = hardware.fp32_flops / hardware.peak_flops
    for name in CUDA_CORE_CLASSES:  # no efficiency makes CUDA cores beat their FP32 peak
        if eff[name].eta_c > ceiling:
            eff[name] = replace(eff[name], eta_c=ceiling)
    if terms.mamba1_scan_scale != 1.0:
        eff["selective_scan"] = eff["selective_scan"].scaled(terms.mamba1_scan_scale)
    if terms.mamba2_scan_scale != 1.0:
        eff["ssm_scan"] = eff["ssm_scan"].scaled(terms.mamba2_scan_scale)
    if terms.allreduce_latency_s is not None:
        eff["allreduce"] = replace(eff["allreduce"], t0=terms.allreduce_latency_s)
    return eff


def _rates(eff: dict[str, Efficiency], hardware: Hardware) -> dict[str, Rate]:
    """The :data:`Rate` of each op class (the all-reduce's over the link), and of the
    fixed-time terms (class ``overhead``)."""
    rate = {
        name: (e.eta_c * hardware.peak_flops, e.eta_m * hardware.mem_bw, e.t0)
        for name, e in eff.items()
    }
    e = eff["allreduce"]
    rate["allreduce"] = (e.eta_c * hardware.peak_flops, e.eta_m * hardware.link_bw, e.t0)
    rate["overhead"] = (math.inf, math.inf, 0.0)  # fixed-time terms only
    return rate


class CostModel:
    """Iteration time of a model on a hardware preset, per DESIGN.md "Cost model"."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: Hardware,
        calibration: Calibration | None = None,
        tp: int = 1,
        terms: CostTerms | None = None,
        overlap: bool = False,
        kernels: Kernels | None = None,
        ep: int = 1,
    ):
        if tp < 1:
            raise ValueError(f"tensor-parallel degree must be >= 1, got {tp}")
        #: ``model`` as the replica's GPUs hold it (:func:`~simlab.cost.shapes.on_tp`:
        #: replicated KV heads)
        self.model = model = on_tp(model, tp)
        self.hw = hardware
        self.calibration = calibration or Calibration()
        self.tp = tp
        self.terms = terms or CostTerms()
        #: the engine's overlapped loop (``engine.overlap``): its CPU work (op
        #: ``engine_overhead``) runs while the GPU computes, so an iteration lasts the longer
        #: of the two instead of their sum
        self.overlap = overlap
        #: the per-GPU ops of each layer kind, untimed
        self.layers = LayerOps(model, tp, self.terms)
        self.efficiency = _efficiencies(self.calibration, hardware, tp, self.terms)
        self._rate = _rates(self.efficiency, hardware)
        self._curve = {name: log_curve(e.curve) for name, e in self.efficiency.items() if e.curve}
        self._profiles = {
            (name, shape): p
            for (name, shape, t), p in self.calibration.profiles.items()
            if t == tp and not (name == ALLREDUCE and self.terms.allreduce_latency_s is not None)
        }
        self._allreduce_profile = self._profiles.get((ALLREDUCE, ()))
        self._decode_templates: dict[int, DecodeTemplate | None] = {}
        self._position_memo: dict[int, PositionOps] = {}
        self._lm_head_memo: dict[int, TimedOp] = {}
        self._allreduce_memo: dict[int, tuple[TimedOp, ...]] = {}
        #: the measured kernels that time the ops they cover before the roofline does (None:
        #: every op on the calibrated roofline)
        #: the MoE's experts split over ``ep`` of the ``tp`` GPUs (measured kernels only: on
        #: the roofline a GPU's expert bytes and FLOPs are the same on average either way)
        self.ep = ep
        self.kernels = None if kernels is None else MeasuredOps(kernels, model, tp, hardware, ep)
        #: simulated GPU seconds per time source (:mod:`simlab.cost.measured.sources`) over
        #: the iterations :meth:`time` and :meth:`decode_span_of` timed (with measured kernels)
        self.source_seconds: dict[str, float] = {}
        self._span_sources: dict[int, dict[str, float]] = {}

    # ------------------------------------------------------------------ timing
    def op_time(self, op: Op) -> float:
        if self.kernels is not None:
            timed = self.kernels.time(op)
            if timed is not None:
                return timed[0] + op.fixed_s
        if op.units and self._profiles:
            measured = self._profile_of(op)
            if measured is not None:
                profile, x = measured
                return profile.at(x) * op.units + op.fixed_s
        peak, bw, t0 = self._rate[op.op_class]
        t = max(op.flops / peak, op.bytes / bw) + op.launches * t0
        curve = self._curve.get(op.op_class)
        if curve:
            t *= curve_scale(curve, op.tokens)
        return t + op.fixed_s

    def time(self, batch: BatchShape) -> float:
        """Seconds for one iteration computing ``batch`` (0 for an empty batch): the sum of
        :meth:`op_time` over :meth:`ops`, in their order; with :attr:`overlap` the larger of
        the engine overhead and the sum of the other ops."""
        if not batch.prefill and not batch.decode:
            return 0.0
        timed = self._timed_ops(batch)
        if self.kernels is not None:
            self._tally(timed)
        if not self.overlap:
            return sum([t for _, t in timed])
        gpu = sum([t for op, t in timed if op.name != ENGINE_OVERHEAD])
        return max(gpu, sum([t for op, t in timed if op.name == ENGINE_OVERHEAD]))

    def _profile_of(self, op: Op) -> tuple[Profile, float] | None:
        """The measured :class:`Profile` that times ``op`` and its argument (an all-reduce's:
        one call's message bytes; every other op's: its tokens), or None."""
        per_token = self.layers.message_bytes_per_token.get(op.name)
        if per_token is not None:
            profile = self._allreduce_profile
            return None if profile is None else (profile, float(op.tokens * per_token))
        profile = self._profiles.get((op.name, op.shape))
        return None if profile is None else (profile, op.tokens)

    def source(self, op: Op) -> str:
        """Where ``op``'s time comes from: a measured kernel (``measured`` at a measured shape,
        ``interpolated`` between), a calibration's measured profile (``interpolated``), or the
        calibrated roofline; ``overhead`` for the configured CPU-side terms."""
        if op.op_class == "overhead":
            return "overhead"
        timed = None if self.kernels is None else self.kernels.time(op)
        if timed is not None:
            return timed[1]
        return INTERPOLATED if op.units and self._profile_of(op) is not None else ROOFLINE

    def sources(self, batch: BatchShape) -> dict[str, float]:
        """Seconds of ``batch``'s GPU ops per :meth:`source` (the overhead terms left out)."""
        out: dict[str, float] = {}
        self._tally(self._timed_ops(batch) if batch.prefill or batch.decode else [], out)
        return out

    def _tally(self, timed: list[TimedOp], into: dict[str, float] | None = None) -> None:
        """Add ``timed``'s GPU seconds by source to ``into`` (default :attr:`source_seconds`)."""
        tally = self.source_seconds if into is None else into
        for op, t in timed:
            tag = self.source(op)
            if tag != "overhead":
                tally[tag] = tally.get(tag, 0.0) + t

    def measured(self, op: Op) -> bool:
        """Whether a calibration's measured :class:`Profile` times ``op`` (not a measured
        kernel, not the roofline)."""
        if self.kernels is not None and self.kernels.time(op) is not None:
            return False
        return bool(op.units) and self._profile_of(op) is not None

    def measured_share(self, batch: BatchShape) -> float:
        """The share of ``batch``'s predicted time timed from measured shapes (0: all modelled)."""
        timed = self._timed_ops(batch) if batch.prefill or batch.decode else []
        total = sum([t for _, t in timed])
        return sum([t for op, t in timed if self.measured(op)]) / total if total else 0.0

    def breakdown(self, batch: BatchShape) -> dict[str, float]:
        """Seconds per op name (for reports and calibration)."""
        return {op.name: t for op, t in self._timed_ops(batch)}

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
        ctx = np.asarray(contexts, dtype=np.int64)
        return self.decode_span_of(len(ctx), int(ctx.sum()), steps, shared_kv_tokens)

    def decode_span_of(
        self, n: int, context_sum: int, steps: int, shared_kv_tokens: int = 0
    ) -> np.ndarray:
        """:meth:`decode_span` of ``n`` requests whose contexts sum to ``context_sum``.

        Only decode attention depends on the contexts; every other op of a decode batch depends
        on ``n`` alone, so its time is computed once per ``n`` (:meth:`_decode_template`). The
        floats are the step-by-step ones bit for bit: each op's time comes from the same
        formula, and the ops are added to the total in the same order."""
        span = self._decode_span(n, context_sum, steps, shared_kv_tokens)
        if self.kernels is not None and steps and n:
            self._tally_span(n, context_sum, steps, shared_kv_tokens)
        return span

    def _tally_span(self, n: int, context_sum: int, steps: int, shared_kv_tokens: int) -> None:
        """:meth:`_tally` of a decode span: the ops other than decode attention per ``n``
        (memoised), decode attention at the span's first step, each x ``steps``."""
        other = self._span_sources.get(n)
        if other is None:
            other = {}
            ops = self._timed_ops(BatchShape(decode=[1] * n))
            self._tally([(op, t) for op, t in ops if op.name != "attn_decode"], other)
            self._span_sources[n] = other
        tally = self.source_seconds
        for tag, t in other.items():
            tally[tag] = tally.get(tag, 0.0) + t * steps
        if self.model.n_attn_layers:
            op = self.layers.attention_decode(n, context_sum, shared_kv_tokens)
            tag = self.source(op)
            tally[tag] = tally.get(tag, 0.0) + self.op_time(op) * steps

    def _decode_span(
        self, n: int, context_sum: int, steps: int, shared_kv_tokens: int
    ) -> np.ndarray:
        """:meth:`decode_span_of`'s durations (without the tally of their sources)."""
        template = self._decode_template(n)
        if template is None:  # an op other than decode attention depends on the contexts
            # ops read a decode batch's contexts through their sum only: any with that sum
            ctx = [context_sum - n + 1] + [1] * (n - 1) if n else []
            return self._decode_span_generic(ctx, steps, shared_kv_tokens)
        head, var, tail, hidden = template
        kernel = self._kernel_decode(n, context_sum, steps, shared_kv_tokens)
        if var is None:
            total = np.full(steps, head)
        elif kernel is not None:
            total = head + (kernel + var[4])
        else:
            peak, bw, launch_s, scale, fixed = var
            a = self.layers.attention_decode(n, context_sum, shared_kv_tokens)
            b = self.layers.attention_decode(n, context_sum + n, shared_kv_tokens)
            j = np.arange(steps, dtype=np.float64)
            flops = a.flops + (b.flops - a.flops) * j
            moved = a.bytes + (b.bytes - a.bytes) * j
            total = head + ((np.maximum(flops / peak, moved / bw) + launch_s) * scale + fixed)
        for t in tail:
            total += t
        return np.maximum(total, hidden) if hidden else total

    def _kernel_decode(
        self, n: int, context_sum: int, steps: int, shared_kv_tokens: int
    ) -> np.ndarray | None:
        """Decode attention's measured seconds per step (None: not measured; its fixed
        seconds not included)."""
        if self.kernels is None or shared_kv_tokens or not self.model.n_attn_layers:
            return None
        sums = np.asarray(context_sum + n * np.arange(steps), dtype=np.float64)
        return self.kernels.decode_seconds(n, sums)

    def _decode_template(self, n: int) -> DecodeTemplate | None:
        """Per ``n``: the summed time of the ops before decode attention, decode attention's
        constants, and the times of the ops after it (None: the ops of a decode batch do not
        have that shape, :meth:`decode_span_of` then builds them per call)."""
        if n in self._decode_templates:
            return self._decode_templates[n]
        ops = self.ops(BatchShape(decode=[1] * n))
        other = self.ops(BatchShape(decode=[2] * n, shared_kv_tokens=1))
        template: DecodeTemplate | None = None
        if [op.name for op in ops] == [op.name for op in other]:
            head, var, tail, hidden = 0.0, None, [], 0.0
            for op, op2 in zip(ops, other, strict=True):
                if op.name == "attn_decode" and var is None:
                    var = self._op_constants(op)
                elif op != op2:
                    break
                elif self.overlap and op.name == ENGINE_OVERHEAD:
                    hidden += self._span_term(op)
                elif var is None:
                    head += self._span_term(op)
                else:
                    tail.append(self._span_term(op))
            else:
                template = (head, var, tuple(tail), hidden)
        self._decode_templates[n] = template
        return template

    def _op_constants(self, op: Op) -> tuple[float, float, float, float, float]:
        """``(peak, bandwidth, launch seconds, curve scale, fixed seconds)`` of ``op``: all of
        its time but its FLOPs and bytes."""
        peak, bw, t0 = self._rate[op.op_class]
        scale = curve_scale(self._curve.get(op.op_class, ((), ())), op.tokens)
        return peak, bw, op.launches * t0, scale, op.fixed_s

    def _span_term(self, op: Op) -> float:
        """``op``'s time as :meth:`_decode_span_generic` adds it (the scale always applied)."""
        if self.measured(op) or (self.kernels is not None and self.kernels.time(op) is not None):
            return self.op_time(op)
        peak, bw, launch_s, scale, fixed = self._op_constants(op)
        return (max(op.flops / peak, op.bytes / bw) + launch_s) * scale + fixed

    def _decode_span_generic(
        self, ctx: list[int], steps: int, shared_kv_tokens: int = 0
    ) -> np.ndarray:
        """:meth:`decode_span` from the ops of the first two steps (any model)."""
        ops0 = self.ops(BatchShape(decode=ctx, shared_kv_tokens=shared_kv_tokens))
        ops1 = self.ops(BatchShape(decode=[c + 1 for c in ctx], shared_kv_tokens=shared_kv_tokens))
        j = np.arange(steps, dtype=np.float64)
        total, hidden = np.zeros(steps), 0.0
        kernel = self._kernel_decode(len(ctx), sum(ctx), steps, shared_kv_tokens)
        for a, b in zip(ops0, ops1, strict=True):
            if self.overlap and a.name == ENGINE_OVERHEAD:  # its seqs are the same every step
                hidden += self.op_time(a)
                continue
            if a.name == "attn_decode" and kernel is not None:
                total += kernel + a.fixed_s
                continue
            if self.measured(a) or (self.kernels is not None and self.kernels.time(a)):
                # its tokens (the decode count) are the same every step
                total += self.op_time(a)
                continue
            peak, bw, t0 = self._rate[a.op_class]
            flops = a.flops + (b.flops - a.flops) * j
            moved = a.bytes + (b.bytes - a.bytes) * j
            scale = curve_scale(self._curve.get(a.op_class, ((), ())), a.tokens)  # same each step
            total += (np.maximum(flops / peak, moved / bw) + a.launches * t0) * scale + a.fixed_s
        return np.maximum(total, hidden) if hidden else total

    # ------------------------------------------------------------------ operations
    def ops(self, batch: BatchShape) -> list[Op]:
        """The operations of one iteration (order and names are stable for a given model)."""
        return [op for op, _ in self._timed_ops(batch)]

    def _timed_ops(self, batch: BatchShape) -> list[TimedOp]:
        """:meth:`ops` with each op's :meth:`op_time`. The ops that depend on the batch's
        position count alone (projections, MLP / MoE, norms) come from a memo per count
        (:meth:`_position_ops`), the rest are built per batch."""
        m, layers, timed = self.model, self.layers, self._timed
        pos = batch.unique_tokens if batch.unique_tokens is not None else batch.tokens
        attn_proj, ssm_proj, after = self._position_ops(pos)
        ops: list[TimedOp] = []
        if m.n_attn_layers:
            ops += attn_proj
            ops += [timed(op) for op in layers.attention(batch)]
        if m.n_ssm_layers:
            ops += ssm_proj
            ops += [timed(op) for op in layers.ssm(batch)]
        ops += after
        ops += self._output_ops(batch)
        return ops + [timed(op) for op in layers.fixed(batch, pos)]

    def _timed(self, op: Op) -> TimedOp:
        return op, self.op_time(op)

    def _position_ops(self, pos: int) -> PositionOps:
        """The per-GPU ops that depend on the position count ``pos`` alone, timed, by their
        place in :meth:`ops`: the attention projections, the SSM projections, and MLP / MoE
        and the norms (memoised per ``pos``; Ops are immutable)."""
        memo = self._position_memo
        if pos in memo:
            return memo[pos]
        layers, timed = self.layers, self._timed
        entry = (
            tuple(timed(op) for op in layers.attention_proj(pos)),
            tuple(timed(op) for op in layers.ssm_proj(pos)),
            tuple(timed(op) for op in layers.mlp_and_norms(pos)),
        )
        if len(memo) >= POSITION_MEMO:
            memo.clear()
        memo[pos] = entry
        return entry

    def _output_ops(self, batch: BatchShape) -> list[TimedOp]:
        """The LM head over the sampled positions and the tensor-parallel all-reduces, per GPU
        and timed (memoised per sampled count and per position count)."""
        ops: list[TimedOp] = []
        sampled = (
            batch.sampled if batch.sampled is not None else len(batch.decode) + len(batch.prefill)
        )
        if self.model.vocab_size and sampled:
            head = self._lm_head_memo.get(sampled)
            if head is None:
                head = self._timed(self.layers.lm_head(sampled))
                if len(self._lm_head_memo) >= POSITION_MEMO:
                    self._lm_head_memo.clear()
                self._lm_head_memo[sampled] = head
            ops.append(head)
        if self.tp > 1:
            ops += self._allreduces(batch.tokens)
        return ops

    def _allreduces(self, tokens: int) -> tuple[TimedOp, ...]:
        """The tensor-parallel all-reduces over ``tokens`` positions, timed (memoised per
        count)."""
        timed = self._allreduce_memo.get(tokens)
        if timed is None:
            timed = tuple(self._timed(op) for op in self.layers.allreduces(tokens))
            if len(self._allreduce_memo) >= POSITION_MEMO:
                self._allreduce_memo.clear()
            self._allreduce_memo[tokens] = timed
        return timed
