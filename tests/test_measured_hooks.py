"""Measured hooks of the hybrid layer kinds (simlab.cost.measured.hooks): each returns the
table's own value at a measured shape, interpolates monotonically between shapes, and leaves
the op to the roofline (None) outside coverage."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simlab.cost.measured.hooks import MeasuredOps
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.sources import INTERPOLATED, MEASURED, ROOFLINE
from simlab.cost.shapes import BatchShape, Op
from simlab.engines.timed.engine import TimedEngine
from tests.test_measured_kernels import installed, preset, spec

pytestmark = installed


def table(family: str, name: str, **where: object) -> pd.DataFrame:
    """The rows of one H100 vLLM table where every ``column=value`` holds."""
    path = Kernels("h100_sxm", "vllm", "0.24.0").path(family)
    assert path is not None and path.stem == name
    frame = pd.read_parquet(path)
    for column, value in where.items():
        frame = frame[frame[column] == value]
    return frame


def one(frame: pd.DataFrame, kernel: str) -> float:
    rows = frame[frame["kernel_source"].str.contains(kernel)]
    assert len(rows) == 1, rows
    return float(rows["latency"].iloc[0])


def op_of(cost, batch: BatchShape, name: str) -> Op:
    return next(op for op in cost.ops(batch) if op.name == name)


def qwen(tp: int = 1):
    return TimedEngine(hardware=preset("h100_sxm"), tp=tp).cost_model(spec("qwen3_5_27b"))


# ---------------------------------------------------------------------------- GDN / KDA
def gdn_rows(**where: object) -> pd.DataFrame:  # Qwen3.5-27B's own rows at TP 1
    return table("gdn", "gdn_perf", d_model=5120, num_k_heads=16, num_v_heads=48, **where)


def test_a_gdn_prefill_is_the_tables_conv_plus_scan_at_a_measured_shape():
    cost = qwen()
    op = op_of(cost, BatchShape(prefill=[(0, 8192)]), "ssm_scan")
    rows = gdn_rows(phase="context", batch_size=1, seq_len=8192)
    ms = one(rows, "causal_conv1d_fn") + one(rows, "chunk_gated_delta_rule")
    assert cost.op_time(op) == pytest.approx(48 * ms / 1e3, rel=1e-12)
    assert cost.source(op) == MEASURED
    two = op_of(cost, BatchShape(prefill=[(0, 4096), (0, 4096)]), "ssm_scan")
    rows = gdn_rows(phase="context", batch_size=2, seq_len=4096)
    ms = one(rows, "causal_conv1d_fn") + one(rows, "chunk_gated_delta_rule")
    assert cost.op_time(two) == pytest.approx(48 * ms / 1e3, rel=1e-12)


def test_a_gdn_decode_step_is_the_tables_conv_update_plus_recurrent_step():
    cost = qwen()
    op = op_of(cost, BatchShape(decode=[300] * 16), "ssm_step")
    rows = gdn_rows(phase="generation", batch_size=16)
    ms = one(rows, "causal_conv1d_update") + one(rows, "fused_recurrent")
    assert cost.op_time(op) == pytest.approx(48 * ms / 1e3, rel=1e-12)
    assert cost.source(op) == MEASURED


def test_gdn_times_interpolate_monotonically_between_measured_shapes():
    cost = qwen()
    lengths = [4096, 5000, 6000, 7000, 8192]
    ops = [op_of(cost, BatchShape(prefill=[(0, n)]), "ssm_scan") for n in lengths]
    times = [cost.op_time(op) for op in ops]
    assert np.all(np.diff(times) > 0)
    assert [cost.source(op) for op in ops[1:-1]] == [INTERPOLATED] * 3
    steps = [op_of(cost, BatchShape(decode=[300] * n), "ssm_step") for n in (16, 20, 24, 32)]
    assert np.all(np.diff([cost.op_time(op) for op in steps]) > 0)
    uneven = op_of(cost, BatchShape(prefill=[(0, 3000), (0, 5000)]), "ssm_scan")
    assert cost.source(uneven) == INTERPOLATED  # the mean length of unequal chunks


def test_gdn_outside_the_tables_falls_back_to_the_roofline():
    cost = qwen()
    many = op_of(cost, BatchShape(prefill=[(0, 256)] * 128), "ssm_scan")  # batch 64 at most
    assert cost.kernels.time(many) is None and cost.source(many) == ROOFLINE
    odd = MeasuredOps(cost.kernels.kernels, spec("qwen3_5_27b"), 3, preset("h100_sxm"))
    assert odd.time(op_of(cost, BatchShape(prefill=[(0, 8192)]), "ssm_scan")) is None
    # no vLLM GDN table on A100: SGLang's lends its conv, the class's GPUs the scan
    # (tests/test_delta_lend.py); at TP 2's heads, which A100's conv rows lack, the roofline
    for tp, source in ((1, INTERPOLATED), (2, ROOFLINE)):
        a100 = TimedEngine(hardware=preset("a100_80gb"), tp=tp).cost_model(spec("qwen3_5_27b"))
        op = op_of(a100, BatchShape(prefill=[(0, 8192)]), "ssm_scan")
        assert a100.source(op) == source


def test_tensor_parallelism_asks_the_table_for_the_heads_of_one_gpu():
    cost = qwen(tp=2)
    op = op_of(cost, BatchShape(prefill=[(0, 8192)]), "ssm_scan")
    rows = table("gdn", "gdn_perf", d_model=5120, num_k_heads=8, num_v_heads=24)
    rows = rows[(rows["phase"] == "context") & (rows["batch_size"] == 1)]
    rows = rows[rows["seq_len"] == 8192]
    ms = one(rows, "causal_conv1d_fn") + one(rows, "chunk_gated_delta_rule")
    assert cost.op_time(op) == pytest.approx(48 * ms / 1e3, rel=1e-12)


def test_a_kda_prefill_and_decode_step_are_the_kda_tables():
    model = spec("kimi_k3")
    ops = MeasuredOps(Kernels("h100_sxm", "vllm", "0.24.0"), model, 1, preset("h100_sxm"))
    rows = table("kda", "kda_perf", num_k_heads=96, num_v_heads=96)
    context = rows[(rows["phase"] == "context") & (rows["batch_size"] == 1)]
    context = context[context["seq_len"] == 4096]
    scan = Op("ssm_scan", "ssm_scan", 0.0, 0.0, 1, 4096, query=(1, 1))
    ms = one(context, "causal_conv1d_fn") + one(context, "flashkda_fwd")
    assert ops.time(scan) == (pytest.approx(69 * ms / 1e3, rel=1e-12), MEASURED)
    decode = rows[(rows["phase"] == "generation") & (rows["batch_size"] == 8)]
    step = Op("ssm_step", "ssm_step", 0.0, 0.0, 1, 8)
    ms = one(decode, "causal_conv1d_update") + one(decode, "fused_recurrent_kda_packed_decode")
    assert ops.time(step) == (pytest.approx(69 * ms / 1e3, rel=1e-12), MEASURED)


@pytest.mark.parametrize("model", ["qwen3_5_27b"])
def test_decode_spans_stay_the_step_by_step_times_bit_for_bit(model):
    cost = TimedEngine(hardware=preset("h100_sxm")).cost_model(spec(model))
    contexts = np.array([300, 2000, 7000, 120])
    span = cost.decode_span(contexts, 5)
    steps = [cost.time(BatchShape(decode=(contexts + j).tolist())) for j in range(5)]
    assert span.tolist() == steps


# ---------------------------------------------------------------------------- MLA, windows
def deepseek(backend: str = "sglang"):
    engine = TimedEngine(hardware=preset("h100_sxm"), tp=8, backend=backend)
    return engine.cost_model(spec("deepseek_v3"))


def mla_rows(name: str, **where: object) -> pd.DataFrame:
    path = Kernels("h100_sxm", "sglang", "0.5.14").path(name)
    frame = pd.read_parquet(path)
    frame = frame[(frame["kv_cache_dtype"] == "bfloat16") & (frame["num_heads"] == 16)]
    for column, value in where.items():
        frame = frame[frame[column] == value]
    assert len(frame) >= 1, frame
    return frame.head(1)  # a shape measured twice: its first row, as aiconfigurator reads it


def test_mla_prefill_and_decode_attention_are_the_mla_tables_at_measured_shapes():
    cost = deepseek()  # 128 heads over 8 GPUs: the tables' 16-head rows
    op = op_of(cost, BatchShape(prefill=[(0, 4096)]), "attn_prefill")
    ms = float(mla_rows("mla_context", batch_size=1, isl=4096)["latency"].iloc[0])
    assert cost.op_time(op) == pytest.approx(61 * ms / 1e3, rel=1e-12)
    assert cost.source(op) == MEASURED
    decode = op_of(cost, BatchShape(decode=[4096] * 8), "attn_decode")
    ms = float(mla_rows("mla_generation", batch_size=8, step=4095)["latency"].iloc[0])
    assert cost.op_time(decode) == pytest.approx(61 * ms / 1e3, rel=1e-12)
    assert cost.source(decode) == MEASURED


def test_mla_interpolates_monotonically_and_leaves_uncovered_shapes_to_the_roofline():
    cost = deepseek()
    ops = [op_of(cost, BatchShape(prefill=[(0, n)]), "attn_prefill") for n in (4096, 5000, 6144)]
    assert np.all(np.diff([cost.op_time(op) for op in ops]) > 0)
    assert cost.source(ops[1]) == INTERPOLATED
    steps = [op_of(cost, BatchShape(decode=[c] * 8), "attn_decode") for c in (4096, 5000, 8192)]
    assert np.all(np.diff([cost.op_time(op) for op in steps]) > 0)
    many = op_of(cost, BatchShape(prefill=[(0, 64)] * 1024), "attn_prefill")  # batch <= 256
    assert cost.source(many) == ROOFLINE
    vllm = deepseek("vllm")  # vLLM's tables time the whole MLA module, not its attention
    assert vllm.source(op_of(vllm, BatchShape(prefill=[(0, 4096)]), "attn_prefill")) == ROOFLINE


def test_mla_projections_are_gemms_split_as_the_engines_split_them():
    cost = deepseek()
    ops = {op.name: op for op in cost.ops(BatchShape(prefill=[(0, 4096)]))}
    kernels = cost.kernels.kernels
    q_a = kernels.gemm(4096, 1536, 7168)  # replicated: every GPU runs it whole
    q_b = kernels.gemm(4096, 128 * 192 // 8, 1536)  # column-parallel: its outputs split
    assert cost.op_time(ops["attn_q_a_proj"]) == pytest.approx(61 * q_a[0] / 1e3, rel=1e-12)
    assert cost.op_time(ops["attn_q_b_proj"]) == pytest.approx(61 * q_b[0] / 1e3, rel=1e-12)


def gpt_oss_rows(name: str, window: int, **where: object) -> float:
    frame = table(name, f"{name}_attention_perf", head_dim=64, window_size=window, num_heads=64)
    frame = frame[(frame["num_key_value_heads"] == 8) & (frame["kv_cache_dtype"] == "bfloat16")]
    for column, value in where.items():
        frame = frame[frame[column] == value]
    assert len(frame) == 1, frame
    return float(frame["latency"].iloc[0])


def test_sliding_window_layers_are_the_window_tables():
    cost = TimedEngine(hardware=preset("h100_sxm")).cost_model(spec("gpt_oss_120b"))
    op = op_of(cost, BatchShape(prefill=[(0, 8192)]), "attn_prefill")
    full = gpt_oss_rows("context", 0, batch_size=1, isl=8192)
    window = gpt_oss_rows("context", 128, batch_size=1, isl=8192)
    assert cost.op_time(op) == pytest.approx(18 * (full + window) / 1e3, rel=1e-12)
    assert cost.source(op) == MEASURED
    decode = op_of(cost, BatchShape(decode=[4096] * 8), "attn_decode")
    full = gpt_oss_rows("generation", 0, batch_size=8, step=4095)
    window = gpt_oss_rows("generation", 128, batch_size=8, step=4095)
    assert cost.op_time(decode) == pytest.approx(18 * (full + window) / 1e3, rel=1e-12)
    prefix = op_of(cost, BatchShape(prefill=[(4096, 4096)]), "attn_prefill")
    window = gpt_oss_rows("context", 128, batch_size=1, isl=4096)  # at most 128 keys a query
    full = cost.kernels.kernels.context(1, prefix.query[1], 64, 8, 64)[0]  # equivalent length
    assert cost.op_time(prefix) == pytest.approx(18 * (full + window) / 1e3, rel=1e-12)
    assert cost.source(prefix) == INTERPOLATED


@pytest.mark.parametrize(
    ("model", "backend", "tp"), [("gpt_oss_120b", "vllm", 1), ("deepseek_v3", "sglang", 8)]
)
def test_attention_decode_spans_stay_the_step_by_step_times(model, backend, tp):
    engine = TimedEngine(hardware=preset("h100_sxm"), tp=tp, backend=backend)
    cost = engine.cost_model(spec(model))
    contexts = np.array([300, 2000, 7000, 120])
    span = cost.decode_span(contexts, 5)
    steps = [cost.time(BatchShape(decode=(contexts + j).tolist())) for j in range(5)]
    assert span.tolist() == steps
