"""Which measured kernel times each op of an iteration (:class:`MeasuredOps`).

Each op name of :class:`~simlab.cost.layers.LayerOps` that a table covers has a hook here,
keyed by name in :data:`HOOKS`; an op without one (the norms, the scans, the state copies, a
layer kind added later) keeps the calibrated roofline until a hook is added for it. A hook
returns the op's seconds and source (:mod:`~simlab.cost.measured.sources`), or None when no
table covers its shape (then the roofline times it too).

* GEMMs, per GPU: a column-parallel projection splits its outputs ``n`` over the GPUs, a
  row-parallel one its inputs ``k`` (vLLM's and SGLang's ``ColumnParallelLinear`` /
  ``RowParallelLinear``), a replicated one runs whole on each; the dense MLP and the MoE's
  shared experts are the fused gate-up GEMM and the down GEMM. A projection of none of the
  lists keeps the roofline until its split is listed.
* MoE: the fused MoE kernel at the model's (hidden, intermediate, top-k, experts) with
  MoE EP = ``ep`` and MoE TP = ``tp / ep`` (the tables' rows of each, measured at a skewed
  routing where they have it, so the busiest GPU's share), where the table lacks it from
  another version's table or the nearest measured shape (:meth:`.Kernels.moe`), plus the
  router GEMM.
* Attention (grouped-query, its sliding-window layers, MLA): :mod:`.attention`.
* All-reduce: the custom all-reduce (CUDA-graph kernel) at the message's elements.
* GDN and KDA layers (the delta rule): a prefill's scan is the causal conv1d plus the chunked
  scan at ``b`` sequences of ``tokens / b`` tokens (both linear in the tokens: unequal chunks
  are ``interpolated``), a decode step the conv update plus the recurrent step at the batch;
  heads per GPU, the rows measured for the model's ``d_model`` where the table has them. A
  Mamba2 layer's scan and step: a local table of ``gpu_validate tables``; else, for an engine
  whose SSD kernels have a public timing, the scan from FLA's GDN scan at the equal state
  (:mod:`~simlab.cost.measured.ssd_scan`); else the roofline, whose range
  :mod:`~simlab.cost.measured.unmeasured` states.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from simlab.cost.hardware import Hardware
from simlab.cost.measured import attention, ssd_scan, transfer
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.sources import INTERPOLATED, worst
from simlab.cost.profiles import ALLREDUCE, X_PROJ_ALLREDUCE
from simlab.cost.shapes import Op, kv_heads_per_gpu
from simlab.model import layers as kinds
from simlab.model.spec import ModelSpec

#: GEMMs whose outputs tensor parallelism splits (column-parallel) / whose inputs it splits /
#: that every GPU runs whole (replicated: MLA's down projections, fused in vLLM's
#: ``fused_qkv_a_proj``, and latent MoE's ``fc1/fc2_latent_proj``)
COLUMN = (
    "attn_qkv_proj",
    "attn_q_proj",
    "attn_q_b_proj",
    "attn_kv_b_proj",
    "attn_gate_proj",
    "ssm_in_proj",
    "ssm_dt_proj",
    "lm_head",
)
ROW = ("attn_out_proj", "ssm_out_proj", "ssm_x_proj")
REPLICATED = ("attn_q_a_proj", "attn_kv_a_proj", "moe_latent_down", "moe_latent_up")
#: stated relative uncertainty of prefill attention over a cached prefix or unequal chunks
#: (the compute-equivalent length; the tables hold neither)
PREFIX_ATTENTION_UNCERTAINTY = 0.25
#: the recurrent kinds whose tables (``gdn_perf``, ``kda_perf``) the delta-rule hook reads
DELTA_RULE = ("gdn", "kda")

Timed = tuple[float, str] | None  # (seconds, source)


class MeasuredOps:
    """The measured time of ``model``'s ops at tensor-parallel degree ``tp`` (its experts split
    over ``ep`` of those GPUs) from ``kernels``."""

    def __init__(
        self, kernels: Kernels, model: ModelSpec, tp: int, hardware: Hardware, ep: int = 1
    ):
        self.kernels = kernels
        self.model = model
        self.tp = tp
        self.ep = ep
        self.hw = hardware
        self.heads = (model.n_heads // tp, kv_heads_per_gpu(model, tp), model.head_dim)
        #: ``(window, layers)`` of each kind of attention layer the tables measure
        self.attention_layers = attention.layer_kinds(self)
        self._memo: dict[Op, Timed] = {}

    def time(self, op: Op) -> Timed:
        """``op``'s seconds (its ``fixed_s`` not included) and source, or None (memoised)."""
        if op in self._memo:
            return self._memo[op]
        hook = HOOKS.get(op.name)
        if hook is None and op.name in COLUMN + ROW + REPLICATED:
            hook = MeasuredOps.projection
        result = None if hook is None else hook(self, op)
        if len(self._memo) >= 1 << 16:
            self._memo.clear()
        self._memo[op] = result
        return result

    # ------------------------------------------------------------------ hooks
    def gemms(self, m: int, shapes: list[tuple[int, int]], units: int) -> Timed:
        """``units`` x the sum of GEMMs ``(n, k)`` over ``m`` rows."""
        parts = [self.kernels.gemm(m, n, k) for n, k in shapes]
        if any(p is None for p in parts):
            return None
        done = [p for p in parts if p is not None]
        return units * sum(ms for ms, _ in done) / 1e3, worst([s for _, s in done])

    def projection(self, op: Op) -> Timed:
        d_in, d_out = op.shape[0], op.shape[1]
        if op.name in COLUMN:
            d_out = math.ceil(d_out / self.tp)
        elif op.name in ROW:
            d_in = math.ceil(d_in / self.tp)
        return self.gemms(max(op.tokens, 1), [(d_out, d_in)], op.units)

    def mlp(self, op: Op) -> Timed:
        d, inter, gated = op.shape[0], math.ceil(op.shape[1] / self.tp), op.shape[2]
        up = (inter * (2 if gated else 1), d)
        return self.gemms(max(op.tokens, 1), [up, (d, inter)], op.units)

    def moe_shape(self) -> tuple[int, ...]:
        """The fused MoE's table key: (hidden, intermediate, top-k, experts, MoE TP, MoE EP)."""
        m = self.model
        width, tp, ep = kinds.moe_width(m), self.tp // self.ep, self.ep
        return (width, m.moe_intermediate, m.moe_top_k, m.moe_experts, tp, ep)

    def moe(self, op: Op) -> Timed:
        m, pos = self.model, op.query[0]
        fused = self.kernels.moe(pos, self.moe_shape(), m.mlp_gated)
        # a router narrower than the table's narrowest GEMM (Mixtral's 8 experts, Jamba's 16;
        # the tables start at 32 outputs) takes that GEMM's time, an upper bound on a
        # launch-bound kernel reading the same activations and fewer weights
        grid = self.kernels.grid(("gemm",))
        narrowest = m.moe_experts if grid is None else int(grid.axes[0][0])
        router = self.kernels.gemm(pos, max(m.moe_experts, narrowest), m.d_model)
        if fused is None:
            self.kernels.warn_once(
                f"fused MoE {transfer.label(self.moe_shape())}: the {self.kernels.dtype} tables "
                "hold no row of it, nor a measured shape of that dtype to time it from: on the "
                "roofline"
            )
        if fused is None or router is None:
            return None
        seconds = m.n_moe_layers * (fused[0] + router[0]) / 1e3
        tags = [fused[1], router[1]] + ([INTERPOLATED] if m.moe_experts < narrowest else [])
        return seconds, worst(tags)

    def allreduce(self, op: Op) -> Timed:
        per_token = {ALLREDUCE: self.model.d_model}
        if self.model.ssm_kind == "mamba1":
            per_token[X_PROJ_ALLREDUCE] = self.model.ssm_dt_rank + 2 * self.model.ssm_state_dim
        timed = self.kernels.allreduce(op.tokens * per_token[op.name], self.tp)
        return None if timed is None else (op.units * timed[0] / 1e3, timed[1])

    def decode_seconds(self, n: int, context_sums: np.ndarray) -> np.ndarray | None:
        """Decode attention's seconds at each context sum of ``n`` requests (None: uncovered)."""
        return attention.decode_seconds(self, n, context_sums)

    def recurrent(self, op: Op) -> Timed:
        """A recurrent layer's prefill scan (``ssm_scan``) or decode step (``ssm_step``)."""
        if self.model.ssm_kind in DELTA_RULE:
            return self.delta_rule(op)
        return self.mamba2(op)

    def delta_rule(self, op: Op) -> Timed:
        """GDN's or KDA's conv + scan (prefill) or conv update + recurrent step (decode)."""
        m, tp = self.model, self.tp
        if m.ssm_n_groups % tp or m.ssm_n_heads % tp:
            return None
        heads = (m.ssm_n_groups // tp, m.ssm_n_heads // tp)
        if op.name == "ssm_scan":
            seqs, uniform = op.query
            phase, batch, length = "context", seqs, op.tokens / seqs
        else:
            phase, batch, length, uniform = "generation", op.tokens, 1, 1
        parts = [
            self.kernels.delta_rule(m.ssm_kind, phase, part, batch, length, heads, m.d_model)
            for part in ("conv", "scan")
        ]
        done = [p for p in parts if p is not None]
        if len(done) < len(parts):
            return None
        tags = [tag for _, tag in done] + ([] if uniform else [INTERPOLATED])
        return m.n_ssm_layers * sum(ms for ms, _ in done) / 1e3, worst(tags)

    def mamba2(self, op: Op) -> Timed:
        """Mamba2's scan (per prefill sequence) or decode step, where a local table of
        ``gpu_validate tables`` measured it; else the scan from its engine's public timing
        (:mod:`~simlab.cost.measured.ssd_scan`)."""
        m, tp = self.model, self.tp
        if m.ssm_kind != "mamba2" or m.ssm_n_heads % tp:
            return None
        shape = (m.ssm_n_heads // tp, m.ssm_head_dim, m.ssm_state_dim, max(1, m.ssm_n_groups // tp))
        if op.name == "ssm_scan":
            seqs = op.query[0] if op.query else 1
            timed = self.kernels.mamba2(seqs, max(1, round(op.tokens / seqs)), shape)
            if timed is None:
                return ssd_scan.scan(self, op)
        else:
            timed = self.kernels.mamba2(op.tokens, 0, shape)
        return None if timed is None else (m.n_ssm_layers * timed[0] / 1e3, timed[1])


HOOKS: dict[str, Callable[[MeasuredOps, Op], Timed]] = {
    "moe_shared": MeasuredOps.mlp,
    "ssm_scan": MeasuredOps.recurrent,
    "ssm_step": MeasuredOps.recurrent,
    "mlp": MeasuredOps.mlp,
    "moe": MeasuredOps.moe,
    ALLREDUCE: MeasuredOps.allreduce,
    X_PROJ_ALLREDUCE: MeasuredOps.allreduce,
    "attn_prefill": attention.prefill,
    "attn_decode": attention.decode,
}
