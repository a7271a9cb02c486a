"""The ops no public table measures, and how far their modelled time may be off
(:func:`bounds`).

Each is timed by the calibrated roofline (:mod:`simlab.cost.model`: FLOPs and bytes of the
kernel's real traffic, :mod:`simlab.cost.layers`); here each gets a stated assumption and a
``[low, high]`` range of seconds:

* ``ssm_scan`` (Mamba2's SSD chunked scan, conv1d included), for an engine whose SSD kernels
  have a public timing (SGLang; vLLM before 0.19): FLA's GDN scan at the equal state x the
  engine's factor (:mod:`~simlab.cost.measured.ssd_scan`); low, its bytes at the peak
  bandwidth; high, :data:`~simlab.cost.measured.ssd_scan.SPREAD` x it.
* ``ssm_scan`` (Mamba2's SSD chunked scan, conv1d included) for the other engines, on the
  roofline: low, its bytes at the peak
  bandwidth (activations in and out once, each sequence's state read and written); high,
  :data:`SSD_OVER_GDN` x the measured GDN chunked prefill scan (``chunk_gated_delta_rule``)
  with as many 128 x 128 state elements per token as the SSD scan updates (``ssm_n_heads x
  head_dim x state_dim``): the delta rule does at least the SSD scan's chunked work per state
  element (its WY transform adds to it), but vLLM's SSD kernels were timed at up to that factor
  over the GDN scan; without a GDN table, twice the model.
* ``ssm_scan`` of a GDN layer (conv1d and chunked delta-rule scan) on a GPU whose tables lack
  the scan: transferred from the GPUs of its class that measured it
  (:mod:`~simlab.cost.measured.delta_lend`), within a factor ``1 + P90`` of that transfer with
  each source GPU left out; on the roofline (a shape no table covers), low its bytes at the
  peak bandwidth, high that transferred or measured scan at ``1 + P90`` (else twice the model):
  the measured scan takes 2-11x its roofline from 4,096 tokens on every GPU that measured it.
* ``selective_scan`` (Mamba1): sequential in time on CUDA cores in FP32; low, its bytes at the
  peak bandwidth; high, twice the model (no public measurement of it).
* ``ssm_step`` (the recurrent decode step): low, its bytes at the peak bandwidth; high, the
  measured GDN recurrent decode step at the equivalent heads, else twice the model.
* ``ssm_state_copy`` (a checkpoint saved or restored): a device copy of the state's bytes;
  low, at the peak bandwidth; high, at half of it plus :data:`COPY_LAUNCH_S` per copy.
* ``attn_prefill`` over a cached prefix or unequal chunks: the compute-equivalent length of
  :mod:`simlab.cost.measured.hooks`, +-:data:`~simlab.cost.measured.hooks.PREFIX_ATTENTION_UNCERTAINTY`;
  at a head width the tables lack (:mod:`~simlab.cost.measured.head_width`), within a factor
  ``1 + P90`` of that transfer on the GPUs of the class that measured both widths as well.
* ``moe`` of a shape no table holds, timed from the nearest measured one
  (:mod:`~simlab.cost.measured.transfer`): within a factor ``1 + P90`` of that transfer's
  error with each measured model left out, on the same tables.

Every other op is measured, interpolated from measurements, or an elementwise op (norms)
whose calibration profile gives its own held-back error.
"""

from __future__ import annotations

from simlab.cost.measured import delta_lend, head_width, ssd_scan
from simlab.cost.measured.hooks import PREFIX_ATTENTION_UNCERTAINTY, MeasuredOps
from simlab.cost.measured.sources import INTERPOLATED
from simlab.cost.model import CostModel
from simlab.cost.shapes import BatchShape, Op

#: one copy kernel's launch and synchronisation (the high end of a state copy)
COPY_LAUNCH_S = 10e-6
#: the high end of a term with no measurement to bound it, as a factor on its model
UNBOUNDED_HIGH = 2.0
#: the most an engine's Mamba2 SSD chunked scan was found to take over FLA's GDN chunked scan
#: at the same state size: vLLM's SSD kernels before its March 2026 optimization, timed on one
#: H100 at granite-4.0-h-small's layer (128 heads of 64, state 128, one group) in vLLM pull
#: request 27299, took 0.34 / 0.65 / 1.27 / 2.78 ms at 4,096 / 8,192 / 16,384 / 32,768 tokens,
#: 1.70 / 1.66 / 1.65 / 1.82x the H100 tables' GDN scan at its state size (64 value heads).
#: The delta rule does at least the SSD scan's work; the kernels are not equally tuned.
SSD_OVER_GDN = 1.82

ASSUMPTIONS = {
    "ssm_scan": "SSD chunked scan: roofline of its traffic; low: bytes at peak bandwidth; "
    f"high: {SSD_OVER_GDN:g}x the GDN chunk scan at equal state size (vLLM's SSD kernels took "
    "up to that on H100), measured here or from this GPU's class x(1 + P90) (else 2x)",
    "selective_scan": "Mamba1 selective scan on FP32 CUDA cores; low: bytes at peak "
    "bandwidth; high: 2x (no public measurement)",
    "ssm_step": "recurrent decode step; low: bytes at peak bandwidth; high: measured GDN "
    "recurrent step at equal state size (else 2x)",
    "ssm_state_copy": "device copy of each checkpoint; low: peak bandwidth; high: half of it "
    f"plus {COPY_LAUNCH_S * 1e6:.0f} us per copy",
    "attn_prefill": "cached prefix / unequal chunks at the compute-equivalent causal length, "
    f"+-{100 * PREFIX_ATTENTION_UNCERTAINTY:.0f}%; a head width the tables lack from the "
    "nearest they hold, x/(1 + P90) to x(1 + P90) on the class's GPUs",
    "moe": "fused MoE of a shape no table holds, from the nearest measured shape at equal "
    "rows per expert; x/(1 + P90) to x(1 + P90), P90 of that transfer with each measured "
    "model left out",
}
#: a GDN layer's ``ssm_scan`` (:func:`assumption`)
GDN_SCAN = (
    "GDN conv + chunked scan: the scan this GPU's tables lack from its class's GPUs at its "
    "bandwidth, x/(1 + P90) to x(1 + P90) with each source GPU left out; on the roofline, low: "
    "bytes at peak bandwidth, high: that scan x(1 + P90) (else 2x)"
)


def assumption(op: str, ssm_kind: str, lent: dict[str, str] | None = None) -> str:
    """The stated assumption of unmeasured ``op`` in a model of ``ssm_kind`` layers (a
    layer's scan is op ``ssm_scan`` of each kind: GDN's, Mamba1's selective scan or Mamba2's
    SSD scan); ``lent``: the kernels' ``delta_lent`` (a Mamba2 scan from its engine's public
    timing, :mod:`~simlab.cost.measured.ssd_scan`)."""
    if op == "ssm_scan" and ssm_kind in ("gdn", "mamba1"):
        return GDN_SCAN if ssm_kind == "gdn" else ASSUMPTIONS["selective_scan"]
    if op == "ssm_scan" and lent and ssd_scan.LENT in lent:
        return (
            f"SSD chunked scan: {lent[ssd_scan.LENT]}; low: bytes at peak bandwidth; high: "
            f"{ssd_scan.SPREAD:g}x (one shape on one GPU), x(1 + P90) where FLA's scan is "
            "from this GPU's class"
        )
    return ASSUMPTIONS[op]


def bounds(
    op: Op, seconds: float, mem_bw: float, measured: MeasuredOps | None
) -> tuple[float, float] | None:
    """``[low, high]`` seconds of an unmeasured ``op`` modelled at ``seconds`` (None: the op
    is measured, or not one of :data:`ASSUMPTIONS`)."""
    if op.name == "attn_prefill":
        prefix = PREFIX_ATTENTION_UNCERTAINTY if op.query and not op.query[2] else 0.0
        width = lent_width_p90(measured) or 0.0
        if not prefix and not width:
            return None
        return seconds * (1 - prefix) / (1 + width), seconds * (1 + prefix) * (1 + width)
    if op.name == "moe" or (op.name == "ssm_scan" and measured and measured.time(op)):
        return _timed_bounds(op, seconds, mem_bw, measured)
    if op.name not in ASSUMPTIONS:
        return None
    floor = op.bytes / mem_bw + op.fixed_s
    if op.name == "ssm_state_copy":
        return floor, 2 * op.bytes / mem_bw + op.launches * COPY_LAUNCH_S + op.fixed_s
    high = _gdn_bound(op, measured)
    high = seconds * UNBOUNDED_HIGH if high is None else high
    return min(floor, seconds), max(high, seconds)


def _timed_bounds(
    op: Op, seconds: float, mem_bw: float, measured: MeasuredOps | None
) -> tuple[float, float] | None:
    """The range of a MoE or scan timed from another shape or GPU (``1 + P90`` of that
    transfer), or of a Mamba2 scan timed from its engine's public timing (its bytes at the
    peak bandwidth to :data:`~simlab.cost.measured.ssd_scan.SPREAD` x it, :mod:`.ssd_scan`);
    None where a table measured it here."""
    if measured is not None and op.name == "ssm_scan" and measured.model.ssm_kind == "mamba2":
        if ssd_scan.LENT not in measured.kernels.delta_lent:  # a local table measured it
            return None
        floor = op.bytes / mem_bw + op.fixed_s
        widen = 1 + (ssd_scan.lend_p90(measured.kernels) or 0.0)
        return min(floor, seconds), seconds * ssd_scan.SPREAD * widen
    p90 = _lent_p90(op, measured)
    return None if p90 is None else (seconds / (1 + p90), seconds * (1 + p90))


def lent_moe_p90(measured: MeasuredOps) -> float | None:
    """The held-out P90 of the MoE transfer when the model's fused MoE was timed from another
    shape (:mod:`~simlab.cost.measured.transfer`; None: measured, or not a MoE)."""
    if not measured.model.moe_experts or measured.moe_shape() not in measured.kernels.transfers:
        return None
    return measured.kernels.moe_transfer_p90()


def lent_width_p90(measured: MeasuredOps | None) -> float | None:
    """The held-out P90 of the width transfer where the model's prefill attention heads are a
    width its GPU's tables lack (:mod:`~simlab.cost.measured.head_width`; else None)."""
    if measured is None or measured.model.attn_kind == "mla" or not measured.attention_layers:
        return None
    return head_width.transfer_p90(measured.kernels, measured.heads[2])


def _lent_p90(op: Op, measured: MeasuredOps | None) -> float | None:
    """The held-out P90 of the transfer that timed ``op`` (a MoE shape or a GDN scan the
    tables lack; None: measured, or not timed)."""
    if measured is None:
        return None
    return lent_moe_p90(measured) if op.name == "moe" else lent_scan_p90(measured)


def lent_scan_p90(measured: MeasuredOps) -> float | None:
    """The held-out P90 of the GDN scan's transfer from other GPUs where the model is GDN and
    its GPU's tables lack the scan (:mod:`~simlab.cost.measured.delta_lend`; else None)."""
    kernels = measured.kernels
    if measured.model.ssm_kind != "gdn" or delta_lend.GPU_LENT not in kernels.delta_lent:
        return None
    return delta_lend.transfer_p90(kernels)


def _gdn_bound(op: Op, measured: MeasuredOps | None) -> float | None:
    """The GDN scan at the state size of ``op``'s Mamba2 scan or step, or a GDN layer's own
    scan, measured on this GPU or transferred from its class (then at ``1 + P90``); None: no
    table, or neither kind."""
    if measured is None or op.name not in ("ssm_scan", "ssm_step"):
        return None
    timed = _gdn_time(op, measured)
    if timed is None:
        return None
    kernels = measured.kernels
    p90 = delta_lend.transfer_p90(kernels) if delta_lend.GPU_LENT in kernels.delta_lent else None
    ssd = SSD_OVER_GDN if measured.model.ssm_kind == "mamba2" and op.name == "ssm_scan" else 1.0
    return measured.model.n_ssm_layers * timed / 1e3 * (1 + (p90 or 0.0)) * ssd


def _gdn_time(op: Op, measured: MeasuredOps) -> float | None:
    """One layer's GDN scan (ms) that bounds ``op`` (:func:`_gdn_bound`)."""
    m, tp = measured.model, measured.tp
    if m.ssm_kind == "gdn" and op.name == "ssm_scan" and op.query and m.ssm_n_heads % tp == 0:
        seqs = op.query[0]
        heads = (max(1, m.ssm_n_groups // tp), m.ssm_n_heads // tp)
        timed = measured.kernels.gdn("context", seqs, max(1, round(op.tokens / seqs)), *heads)
        return None if timed is None else timed[0]
    if m.ssm_kind != "mamba2":
        return None
    v_heads = ssd_scan.value_heads(m.ssm_n_heads // tp, m.ssm_head_dim, m.ssm_state_dim)
    for k_heads in ssd_scan.key_heads(v_heads):
        if op.name == "ssm_scan":
            timed = measured.kernels.gdn("context", 1, max(op.tokens, 1), k_heads, v_heads)
        else:
            timed = measured.kernels.gdn("generation", max(op.tokens, 1), 1, k_heads, v_heads)
        if timed is not None:
            return timed[0]
    return None


def ranges(cost: CostModel, batch: BatchShape) -> dict[str, tuple[float, float]]:
    """``{op name: (low, high)}`` seconds of ``batch``'s unmeasured ops (:func:`bounds`)."""
    out = {}
    for op in cost.ops(batch):
        seconds = cost.op_time(op)
        timed = cost.kernels is not None and cost.kernels.time(op) is not None
        if op.name == "attn_prefill":
            if cost.source(op) != INTERPOLATED:
                continue
        elif op.name in ("moe", "ssm_scan") and timed:
            pass  # bounded where it was timed from another shape or GPU
        elif timed or cost.measured(op) or op.op_class == "overhead":
            continue
        bound = bounds(op, seconds, cost.hw.mem_bw, cost.kernels)
        if bound is not None:
            out[op.name] = bound
    return out
