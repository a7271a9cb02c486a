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
    a100 = TimedEngine(hardware=preset("a100_80gb")).cost_model(spec("qwen3_5_27b"))
    op = op_of(a100, BatchShape(prefill=[(0, 8192)]), "ssm_scan")  # no vLLM GDN table on A100
    assert a100.source(op) == ROOFLINE


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
