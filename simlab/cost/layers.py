"""The operations of one iteration, per layer kind and per GPU (:class:`LayerOps`).

An iteration (:class:`~simlab.cost.shapes.BatchShape`) mixes prefill chunks ``(prefix, new)``
(``new`` tokens over ``prefix + new`` keys, lower-right causal) and decode steps with a given
context. Options from the seeds:

* RadixMLP intra-batch deduplication: position-wise work (projections, MLP/MoE, norms) runs on
  the ``unique_tokens`` of the batch, ``N'`` instead of ``N``; attention and scans do not.
* shared-context decode attention (intra-prompt parallel decoding / cascade): a prefix shared by
  several decoding requests has its KV read once per group; ``shared_kv_tokens`` counts the KV
  token reads saved that way.

Per-GPU work is the replica's divided by the tensor-parallel degree (the model as its GPUs
hold it, :func:`~simlab.cost.shapes.on_tp`: KV heads copied where ``tp`` exceeds them), and
each attention / SSM / MLP layer adds one all-reduce of its output (``2 (tp-1)/tp`` of the
activation bytes per GPU). The scan of
Mamba1 (selective scan, class ``selective_scan``) and of Mamba2 (SSD chunked scan, class
``ssm_scan``) are separate classes. Mamba1's ``x_proj`` (``d_inner -> dt_rank + 2N``) and
``dt_proj`` (``dt_rank -> d_inner``) are GEMMs (``ssm_x_proj``, ``ssm_dt_proj``), not scan work;
``x_proj`` is row-parallel in vLLM and SGLang (``RowParallelLinear``), so under tensor
parallelism each Mamba1 layer adds a second, small all-reduce of ``dt_rank + 2N`` values per
token (``ssm_x_proj_allreduce``).
"""

from __future__ import annotations

import math
from dataclasses import replace

from simlab.cost.profiles import ALLREDUCE, X_PROJ_ALLREDUCE
from simlab.cost.shapes import ENGINE_OVERHEAD, BatchShape, Op
from simlab.cost.terms import CostTerms
from simlab.model import layers as kinds
from simlab.model.spec import ModelSpec


class LayerOps:
    """The per-GPU :class:`~simlab.cost.shapes.Op` of each layer kind of ``model`` at
    tensor-parallel degree ``tp``, with the :class:`~simlab.cost.terms.CostTerms` they charge
    (untimed: :class:`~simlab.cost.model.CostModel` times them)."""

    def __init__(self, model: ModelSpec, tp: int, terms: CostTerms):
        self.model = model
        self.tp = tp
        self.terms = terms
        #: every attention, SSM, MLP and MoE layer: each has a norm, a residual add and an
        #: all-reduce of its output
        self.n_layers = sum(
            (model.n_attn_layers, model.n_ssm_layers, model.n_mlp_layers, model.n_moe_layers)
        )
        #: one all-reduce call's message bytes per token, per all-reduce op (its profile's x)
        self.message_bytes_per_token = {ALLREDUCE: model.d_model * model.dtype_bytes}
        if model.n_ssm_layers and model.ssm_kind == "mamba1":
            x_proj_out = model.ssm_dt_rank + 2 * model.ssm_state_dim
            self.message_bytes_per_token[X_PROJ_ALLREDUCE] = x_proj_out * model.dtype_bytes

    def _per_gpu(self, op: Op) -> Op:
        """``op``'s share of one GPU (the all-reduce and the elementwise ops are not split)."""
        if self.tp == 1 or op.op_class in ("allreduce", "elementwise"):
            return op
        return replace(op, flops=op.flops / self.tp, bytes=op.bytes / self.tp)

    def _gemm(self, name: str, tokens: int, d_in: int, d_out: int, layers: int) -> Op:
        """A ``d_in -> d_out`` GEMM over ``tokens`` rows in each of ``layers`` layers, per GPU."""
        return self._per_gpu(self._gemm_op(name, tokens, d_in, d_out, layers))

    def _gemm_op(self, name: str, tokens: int, d_in: int, d_out: int, layers: int) -> Op:
        """:meth:`_gemm` over all GPUs."""
        w = self.model.dtype_bytes
        flops = 2.0 * tokens * d_in * d_out * layers
        moved = (d_in * d_out + tokens * (d_in + d_out)) * w * layers
        return Op(name, "gemm", flops, moved, layers, tokens, shape=(d_in, d_out, w), units=layers)

    # ------------------------------------------------------------------ attention
    def attention_proj(self, pos: int) -> list[Op]:
        """The QKV and output projections over ``pos`` positions (none without attention)."""
        m = self.model
        if not m.n_attn_layers:
            return []
        na = m.n_attn_layers
        return [
            self._gemm(name, pos, d_in, d_out, na) for name, d_in, d_out in kinds.attention_gemms(m)
        ]

    def attention(self, batch: BatchShape) -> list[Op]:
        """Prefill and decode attention: what depends on the chunks and the contexts. A
        sliding-window layer's query attends at most ``swa_window`` keys and reads only them."""
        m = self.model
        na, w = m.n_attn_layers, m.dtype_bytes
        qo = sum(kinds.q_dims(m))  # query read and output written, per token
        pair, kv = float(kinds.pair_flops(m)), _kv_read(m)
        ops: list[Op] = []
        if batch.prefill:
            flops = bytes_ = 0.0
            for prefix, new in batch.prefill:
                flops += pair * (new * prefix + new * (new + 1) / 2)
                bytes_ += (new * qo + (prefix + new) * kv) * w
            flops, bytes_ = flops * (na - m.n_swa_layers), bytes_ * (na - m.n_swa_layers)
            if m.n_swa_layers:
                swa_flops, swa_bytes = self._window_prefill(batch.prefill)
                flops, bytes_ = flops + swa_flops, bytes_ + swa_bytes
            new_tok = sum(q for _, q in batch.prefill)
            query = _prefill_query(batch.prefill)
            op = Op(
                "attn_prefill", "attn_prefill", flops, bytes_, na, new_tok, units=na, query=query
            )
            ops.append(self._per_gpu(op))
        if batch.decode:
            n, context_sum = len(batch.decode), sum(batch.decode)
            ops.append(self.attention_decode(n, context_sum, batch.shared_kv_tokens))
        return ops

    def _window_prefill(self, chunks: list[tuple[int, int]]) -> tuple[float, float]:
        """FLOPs and bytes of the sliding-window layers over prefill ``chunks``: query ``j``
        attends ``min(j, window)`` keys, a chunk reads the keys of its window and itself."""
        m = self.model
        W, pair = m.swa_window, float(kinds.pair_flops(m))
        qo, kv = sum(kinds.q_dims(m)), _kv_read(m)

        def pairs(n: int) -> float:  # sum_{j=1..n} min(j, W)
            return n * (n + 1) / 2 if n <= W else W * (W + 1) / 2 + (n - W) * W

        flops = sum(pair * (pairs(p + q) - pairs(p)) for p, q in chunks)
        bytes_ = sum((q * qo + (min(p, W) + q) * kv) * m.dtype_bytes for p, q in chunks)
        return flops * m.n_swa_layers, bytes_ * m.n_swa_layers

    def attention_decode(self, n: int, context_sum: int, shared_kv_tokens: int) -> Op:
        """Decode attention of ``n`` requests whose contexts sum to ``context_sum``; a
        sliding-window layer reads ``swa_window`` keys per request (its contexts are taken to
        exceed the window, which keeps the time affine in ``context_sum``)."""
        m = self.model
        na, w = m.n_attn_layers, m.dtype_bytes
        full, swa = na - m.n_swa_layers, m.n_swa_layers
        qo, pair = sum(kinds.q_dims(m)), float(kinds.pair_flops(m))
        kv = _kv_read(m)
        ctx = float(context_sum)
        kv_reads = max(ctx - shared_kv_tokens, 0.0)
        flops = pair * ctx * full
        bytes_ = (kv_reads * kv + n * qo) * w * full
        if swa:
            flops += pair * n * m.swa_window * swa
            bytes_ += (n * m.swa_window * kv + n * qo) * w * swa
        query = (n, context_sum, shared_kv_tokens)
        op = Op("attn_decode", "attn_decode", flops, bytes_, na, n, units=na, query=query)
        return self._per_gpu(op)

    # ------------------------------------------------------------------ SSM
    def ssm_proj(self, pos: int) -> list[Op]:
        """The SSM layers' projections over ``pos`` positions (none without SSM layers)."""
        m = self.model
        if not m.n_ssm_layers:
            return []
        ns, D, N, di = m.n_ssm_layers, m.d_model, m.ssm_state_dim, m.ssm_d_inner
        if m.ssm_kind != "mamba1":
            return [
                self._gemm("ssm_in_proj", pos, D, kinds.ssm_in_dim(m), ns),
                self._gemm("ssm_out_proj", pos, di, D, ns),
            ]
        R = m.ssm_dt_rank
        return [
            self._gemm("ssm_in_proj", pos, D, 2 * di, ns),
            self._gemm("ssm_x_proj", pos, di, R + 2 * N, ns),
            self._gemm("ssm_dt_proj", pos, R, di, ns),
            self._gemm("ssm_out_proj", pos, di, D, ns),
        ]

    def ssm(self, batch: BatchShape) -> list[Op]:
        """The scan of the prefill chunks, the decode step, the checkpoint copies."""
        m = self.model
        ns, w, di = m.n_ssm_layers, m.dtype_bytes, m.ssm_d_inner
        activations = (m.ssm_conv_channels + 2 * di) * w  # per token, in and out of conv + scan
        state = m.ssm_state_bytes_per_layer
        ops: list[Op] = []
        prefill_tok = sum(q for _, q in batch.prefill)
        if prefill_tok:
            # activations of every token, plus each sequence's state read and written
            moved = prefill_tok * activations + 2 * state * len(batch.prefill)
            scan = "selective_scan" if m.ssm_kind == "mamba1" else "ssm_scan"
            flops = self._scan_flops_per_token() * prefill_tok * ns
            uniform = int(all(q == batch.prefill[0][1] for _, q in batch.prefill))
            seqs = (len(batch.prefill), uniform)  # equal chunks: the measured tables' shape
            ops.append(Op("ssm_scan", scan, flops, moved * ns, ns, prefill_tok, query=seqs))
        if batch.decode:
            n = len(batch.decode)
            moved = n * (activations + 2 * state)
            flops = self._scan_flops_per_token() * n * ns
            ops.append(Op("ssm_step", "ssm_step", flops, moved * ns, ns, n))
        copies = batch.state_loads + batch.state_stores
        if copies:
            fixed = batch.state_loads * self.terms.state_load_s
            fixed += batch.state_stores * self.terms.state_store_s
            copied = 2.0 * state * copies * ns
            ops.append(Op("ssm_state_copy", "state_copy", 0.0, copied, copies, copies, fixed))
        return [self._per_gpu(op) for op in ops]

    def _scan_flops_per_token(self) -> int:
        """FLOPs of one token's conv and scan in one SSM layer (Mamba1's x_proj and dt_proj
        are GEMMs: :meth:`ssm_proj`)."""
        return kinds.scan_flops_per_token(self.model)

    # ------------------------------------------------------------------ position-wise, output
    def mlp_and_norms(self, pos: int) -> list[Op]:
        """The dense MLP, the MoE and the norms over ``pos`` positions, those the model has."""
        m = self.model
        ops: list[Op] = []
        if m.n_mlp_layers:
            ops.append(self._mlp(pos))
        if m.n_moe_layers:
            ops.append(self._moe(pos))
            ops += self._moe_dense_parts(pos)
        ops.append(self._norms(pos))
        return [self._per_gpu(op) for op in ops]

    def _mlp(self, pos: int) -> Op:
        m = self.model
        mats = 3 if m.mlp_gated else 2
        w, D, inter, n = m.dtype_bytes, m.d_model, m.mlp_intermediate, m.n_mlp_layers
        flops = 2.0 * pos * D * inter * mats * n
        moved = (mats * D * inter + pos * (2 * D + mats * inter)) * w * n
        shape = (D, inter, int(m.mlp_gated), w)
        return Op("mlp", "gemm", flops, moved, 2 * n, pos, shape=shape, units=n)

    def _moe(self, pos: int) -> Op:
        m = self.model
        mats = 3 if m.mlp_gated else 2
        w, D, inter, n = m.dtype_bytes, kinds.moe_width(m), m.moe_intermediate, m.n_moe_layers
        active = min(m.moe_experts, pos * m.moe_top_k)  # distinct experts whose weights are read
        router = 2.0 * pos * m.d_model * m.moe_experts
        flops = (router + 2.0 * pos * m.moe_top_k * D * inter * mats) * n
        moved = (active * mats * D * inter + pos * m.moe_top_k * (2 * D + mats * inter)) * w * n
        # the GEMM class curve's argument is a GEMM's rows: an expert's, not the batch's (at
        # the batch's count the dense curve's ridge bump made 128 tokens slower than 1,042)
        rows = max(1, round(pos * m.moe_top_k / m.moe_experts))
        return Op("moe", "gemm", flops, moved, 3 * n, rows, query=(pos,))

    def _moe_dense_parts(self, pos: int) -> list[Op]:
        """The MoE layers' always-active GEMMs: shared experts, latent down/up projections."""
        m = self.model
        ops, mats, w, D, n = [], 3 if m.mlp_gated else 2, m.dtype_bytes, m.d_model, m.n_moe_layers
        if m.moe_shared_intermediate:
            inter = m.moe_shared_intermediate
            flops = 2.0 * pos * D * inter * mats * n
            moved = (mats * D * inter + pos * (2 * D + mats * inter)) * w * n
            shape = (D, inter, int(m.mlp_gated), w)
            ops.append(Op("moe_shared", "gemm", flops, moved, 2 * n, pos, shape=shape, units=n))
        if m.moe_latent:
            ops.append(self._gemm_op("moe_latent_down", pos, D, m.moe_latent, n))
            ops.append(self._gemm_op("moe_latent_up", pos, m.moe_latent, D, n))
        return ops

    def _norms(self, pos: int) -> Op:
        m = self.model
        w, D, layers = m.dtype_bytes, m.d_model, self.n_layers
        flops, moved = 8.0 * pos * D * layers, 4.0 * pos * D * w * layers
        name, shape = "norms_residuals", (D, w)  # one unit: a norm and a residual add
        return Op(name, "elementwise", flops, moved, layers, pos, shape=shape, units=layers)

    def lm_head(self, sampled: int) -> Op:
        """The LM head over ``sampled`` positions."""
        return self._gemm("lm_head", sampled, self.model.d_model, self.model.vocab_size, 1)

    def allreduces(self, tokens: int) -> list[Op]:
        """The tensor-parallel all-reduces of an iteration over ``tokens`` positions: one call
        per layer of ``tokens x d_model x dtype`` bytes, and for Mamba1 one more per SSM layer
        of its ``x_proj`` output; each moves ``2 (tp-1)/tp`` of its message per GPU."""
        calls = {ALLREDUCE: self.n_layers, X_PROJ_ALLREDUCE: self.model.n_ssm_layers}
        ring = 2.0 * (self.tp - 1) / self.tp
        ops = []
        for name, per_token in self.message_bytes_per_token.items():
            n = calls[name]
            ops.append(
                Op(name, "allreduce", 0.0, ring * tokens * per_token * n, n, tokens, units=n)
            )
        return ops

    def fixed(self, batch: BatchShape, pos: int) -> list[Op]:
        """The :class:`~simlab.cost.terms.CostTerms` not tied to an op of the roofline, only
        when charged (> 0)."""
        terms, ops = self.terms, []
        seqs = len(batch.prefill) + len(batch.decode)
        engine = terms.iteration_overhead_s + terms.sequence_overhead_s * seqs
        if engine > 0:
            ops.append(Op(ENGINE_OVERHEAD, "overhead", 0.0, 0.0, 0, seqs, engine))
        dispatch = terms.moe_dispatch_s_per_token * pos * self.model.n_moe_layers
        if dispatch > 0:
            ops.append(Op("moe_dispatch", "overhead", 0.0, 0.0, 0, pos, dispatch))
        return ops


def _prefill_query(chunks: list[tuple[int, int]]) -> tuple[int, ...]:
    """Prefill attention's :attr:`Op.query`: the chunks, their compute-equivalent causal
    length ``sqrt(sum(new^2 + 2 new prefix) / chunks)`` (rounded), whether they are equal and
    without a prefix (the measured tables' shape), and the KV tokens they read."""
    pairs = sum(new * new + 2 * new * prefix for prefix, new in chunks)
    length = max(1, round(math.sqrt(pairs / len(chunks))))
    uniform = int(all(p == 0 and q == chunks[0][1] for p, q in chunks))
    return (len(chunks), length, uniform, sum(p + q for p, q in chunks))


def _kv_read(m: ModelSpec) -> float:
    """A token's KV elements, weighed by the KV cache's bytes against the model's (the byte
    terms multiply by ``dtype_bytes``): an FP8 cache beside BF16 weights reads half."""
    return kinds.kv_elements_per_token(m) * (m.kv_dtype_bytes / m.dtype_bytes)
