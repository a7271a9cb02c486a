"""Measured kernels (simlab.cost.measured): the interpolation reproduces measured points and
stays between their neighbours, the cost model takes them first with a source per op, decode
spans stay bit-identical to step-by-step times, and bad keys are one-line errors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import yaml

from simlab.config import ConfigError
from simlab.cost.hardware import Hardware
from simlab.cost.measured import select, tables
from simlab.cost.measured.heldout import main as heldout_main
from simlab.cost.measured.heldout import report
from simlab.cost.measured.interpolate import EXTRAPOLATION, Grid
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.sources import INTERPOLATED, MEASURED, ROOFLINE, SOURCES
from simlab.cost.shapes import BatchShape
from simlab.engines.timed.engine import TimedEngine, time_sources
from simlab.model.spec import ModelSpec
from tests.fixtures import CONFIGS

installed = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)


def preset(name: str) -> Hardware:
    return Hardware.from_config(yaml.safe_load((CONFIGS / "hardware" / f"{name}.yaml").read_text()))


def spec(name: str) -> ModelSpec:
    return ModelSpec.from_config(yaml.safe_load((CONFIGS / "model" / f"{name}.yaml").read_text()))


def synthetic() -> Grid:
    """A 2-axis grid, monotone in both, with one hole."""
    points = {
        (w, x): 0.01 + 1e-6 * w * x + (0.02 if x >= 512 else 0.0)
        for w, x in itertools.product((64, 128, 512), (1, 8, 64, 512, 4096))
    }
    del points[(512, 8)]
    return Grid.from_points(points)


def test_a_measured_point_is_reproduced_exactly_and_tagged_measured():
    grid = synthetic()
    for w, x in itertools.product((64, 128), (1, 8, 64, 512, 4096)):
        value, tag = grid.at((w, x))
        assert value == pytest.approx(0.01 + 1e-6 * w * x + (0.02 if x >= 512 else 0.0), rel=1e-12)
        assert tag == MEASURED


def test_an_interpolated_point_stays_between_its_measured_neighbours_and_is_monotone():
    grid = synthetic()
    rng = np.random.default_rng(0)
    for _ in range(200):
        w, x = float(rng.uniform(64, 128)), float(rng.uniform(1, 4096))
        value, tag = grid.at((w, x))
        i = int(np.searchsorted(grid.axes[1], x))
        corners = [
            grid.at((a, b))[0] for a in (64, 128) for b in grid.axes[1][max(i - 1, 0) : i + 1]
        ]
        assert min(corners) * (1 - 1e-12) <= value <= max(corners) * (1 + 1e-12)
        assert tag == INTERPOLATED
    xs = np.geomspace(1, 4096, 300)
    curve = grid.curve((100.0,))
    assert curve is not None and (np.diff(curve.at_many(xs)) >= 0).all()


def test_outside_the_measured_range_there_is_no_answer():
    grid = synthetic()
    assert grid.at((32, 64)) is None  # below the first width: no table covers it
    assert grid.at((1024, 64)) is None
    assert grid.at((128, 4096 * EXTRAPOLATION * 1.01)) is None  # too far past the last count
    value, tag = grid.at((128, 8192))  # within the extrapolation: proportional to the count
    assert value == pytest.approx(grid.at((128, 4096))[0] * 2) and tag == INTERPOLATED
    assert grid.at((64, 0.5))[0] == grid.at((64, 1))[0]  # launch-bound below the first count


def test_a_hole_is_skipped_along_the_primary_axis():
    value, tag = synthetic().at((512, 8))
    assert (
        tag == INTERPOLATED and synthetic().at((512, 1))[0] < value < synthetic().at((512, 64))[0]
    )


@installed
def test_real_tables_reproduce_their_points_and_bracket_the_rest():
    kernels = Kernels("a100_sxm", "vllm", "0.14.0")
    assert kernels.gemm(4096, 4096, 4096)[1] == MEASURED
    low, high = kernels.gemm(4096, 4096, 4096)[0], kernels.gemm(8192, 4096, 4096)[0]
    mid, tag = kernels.gemm(6000, 4096, 4096)
    assert low < mid < high and tag == INTERPOLATED
    assert kernels.context(1, 8192, 32, 8, 128)[1] == MEASURED
    # no table at head dim 96: the 128-wide heads' time, scaled (simlab.cost.measured.head_width)
    narrower, tag = kernels.context(1, 8192, 32, 8, 96)
    assert tag == INTERPOLATED and narrower < kernels.context(1, 8192, 32, 8, 128)[0]
    assert kernels.head_widths == {96: 128}
    assert kernels.context(1, 8192, 32, 8, 96, 4096) is None  # a window's: no reference


@installed
def test_held_out_median_error_is_at_most_five_percent_per_class():
    result = report(Kernels("a100_sxm", "vllm", "0.14.0"))
    for cls in ("gemm", "attention", "moe"):
        assert result[cls]["median"] <= 0.05, (cls, result[cls])
        assert result[cls]["points"] > 1000


@installed
def test_the_cost_model_takes_measured_kernels_first_and_tags_each_op():
    engine = TimedEngine(hardware=preset("a100_80gb"))
    cost = engine.cost_model(spec("llama3_8b"))
    roofline = TimedEngine(hardware=preset("a100_80gb"), kernels="roofline").cost_model(
        spec("llama3_8b")
    )
    batch = BatchShape(prefill=[(0, 2048)])
    tags = {op.name: cost.source(op) for op in cost.ops(batch)}
    assert tags["attn_prefill"] == MEASURED  # one chunk of a measured length, no prefix
    assert tags["attn_out_proj"] == MEASURED  # 2048 x 4096 x 4096: a measured GEMM
    assert tags["mlp"] == INTERPOLATED  # its gate-up GEMM's 28,672 outputs were not measured
    assert tags["norms_residuals"] == ROOFLINE  # no table, and no calibration given here
    assert cost.time(batch) != roofline.time(batch)
    sources = cost.sources(batch)
    assert set(sources) <= set(SOURCES) and sum(sources.values()) == pytest.approx(cost.time(batch))
    prefix = BatchShape(prefill=[(4000, 2048)], state_loads=0)
    assert {op.name: cost.source(op) for op in cost.ops(prefix)}["attn_prefill"] == INTERPOLATED
    assert cost.time(BatchShape(prefill=[(4000, 2048)])) > cost.time(batch)  # the prefix costs


@installed
@pytest.mark.parametrize("model", ["llama3_8b", "nemotron_h_8b", "jamba_1_5_mini"])
def test_decode_spans_are_the_step_by_step_times_bit_for_bit(model):
    cost = TimedEngine(hardware=preset("h100_sxm")).cost_model(spec(model))
    contexts = np.array([300, 2000, 7000, 120])
    span = cost.decode_span(contexts, 5)
    steps = [cost.time(BatchShape(decode=(contexts + j).tolist())) for j in range(5)]
    assert span.tolist() == steps


@installed
def test_a_run_records_its_time_sources():
    cost = TimedEngine(hardware=preset("h100_sxm")).cost_model(spec("llama3_8b"))
    cost.time(BatchShape(prefill=[(0, 1000)]))
    cost.decode_span_of(8, 8000, 10)
    shares = time_sources(cost, "lru")["time_sources"]
    assert set(shares) == set(SOURCES) and math.isclose(sum(shares.values()), 1.0)
    assert shares[ROOFLINE] < 0.1
    roofline = TimedEngine(hardware=preset("h100_sxm"), kernels="roofline")
    assert time_sources(roofline.cost_model(spec("llama3_8b")), "lru") == {}


@installed
def test_presets_fill_their_peaks_from_the_package():
    b200 = preset("b200_sxm")
    assert b200.peak_tflops == pytest.approx(2250) and b200.mem_bw_gbps == pytest.approx(7700)
    assert b200.system == "b200_sxm"


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("kernels", "magic", r"engine\.kernels must be one of"),
        ("backend", "tgi", r"engine\.backend must be one of vllm, sglang, trtllm"),
        ("dtype", "int3", r"engine\.dtype must be null or one of"),
        ("backend_version", 0.1, r"engine\.backend_version must be a string, .* quote it"),
    ],
)
def test_bad_keys_are_one_line_errors_naming_them(key, value, match):
    with pytest.raises(ConfigError, match=match):
        TimedEngine(hardware=preset("a100_40gb"), **{key: value})


@installed
def test_an_unmeasured_version_names_the_measured_ones():
    with pytest.raises(
        ConfigError, match=r"engine\.backend_version: vllm 0\.9 .*measured: .*0\.14\.0"
    ):
        TimedEngine(hardware=preset("a100_80gb"), backend_version="0.9")
    with pytest.raises(ConfigError, match=r"model\.dtype_bytes: 4 has no measured dtype"):
        TimedEngine(hardware=preset("a100_80gb")).cost_model(
            ModelSpec.from_config(
                {
                    **yaml.safe_load((CONFIGS / "model" / "llama3_8b.yaml").read_text()),
                    "dtype_bytes": 4,
                }
            )
        )
    assert heldout_main(["--gpu", "a999"]) == 2
    with pytest.raises(ValueError, match=r"hardware\.peak_tflops is not given"):
        Hardware.from_config({"name": "x", "mem_bw_gbps": 1, "mem_gb": 1, "link_bw_gbps": 1})
    assert select.resolve_version("a100_sxm", "vllm", None) == "0.14.0"


@installed
@pytest.mark.parametrize(
    ("gpu", "dtype", "measured"),
    [("a100_80gb", "fp8", "bf16"), ("a100_80gb", "fp4", "bf16"), ("h100_sxm", "fp4", "bf16, fp8")],
)
def test_a_dtype_the_gpus_tables_never_measured_is_an_error_naming_those_they_did(
    gpu, dtype, measured
):
    # before, every linear layer fell silently to the roofline at a peak the GPU lacks: an
    # FP8 Qwen3.5-27B prefilled 1,024 tokens on A100 in 248.6 ms, 97% of it roofline
    llama = ModelSpec.from_config(
        yaml.safe_load((CONFIGS / "model" / "llama3_8b.yaml").read_text())
    )
    engine = TimedEngine(hardware=preset(gpu), dtype=dtype)
    with pytest.raises(
        ConfigError, match=rf"^engine\.dtype: .* no {dtype} GEMM \(measured: {measured}\)"
    ):
        engine.cost_model(llama)
    assert TimedEngine(hardware=preset(gpu), dtype="bf16").cost_model(llama).kernels is not None
    roofline = TimedEngine(hardware=preset(gpu), dtype=dtype, kernels="roofline")
    assert roofline.cost_model(llama).kernels is None  # not measured: nothing to check


@installed
def test_an_fp8_moe_takes_the_block_scaled_rows_where_a_table_has_no_per_tensor_ones():
    """SGLang's tables measure its FP8 fused MoE with block-scaled weights only: DeepSeek-V3's
    experts (TP 8) at 4,096 tokens are the measured ``fp8_block`` row, not the roofline. vLLM's
    tables have per-tensor FP8 rows, and keep them."""
    shape = (7168, 2048, 8, 256, 8, 1)
    sglang = Kernels("b200_sxm", "sglang", "0.5.14", "fp8")
    ms, tag = sglang.moe(4096, shape)
    rows = tables.rows(sglang.path("moe"), (("moe_dtype", "fp8_block"),))
    row = rows[
        (rows.hidden_size == 7168)
        & (rows.inter_size == 2048)
        & (rows.num_experts == 256)
        & (rows.moe_tp_size == 8)
        & (rows.num_tokens == 4096)
        & (rows.distribution == "power_law_1.01")
    ]
    assert tag == MEASURED and ms == pytest.approx(float(row.latency.iloc[0]))
    vllm = Kernels("b200_sxm", "vllm", "0.19.0", "fp8")
    per_tensor = tables.rows(vllm.path("moe"), (("moe_dtype", "fp8"),))
    assert not per_tensor.empty and vllm.moe(4096, shape) is not None


@installed
def test_tables_measured_only_later_are_taken_at_the_oldest_later_version_and_said():
    """SGLang 0.5.9 on B200 has only its all-reduce measured at 0.5.9: its GEMM, attention and
    MoE come from 0.5.14 (not the roofline), and the run's caveat names them; a version whose
    tables are all at or below it has no caveat."""
    old = Kernels("b200_sxm", "sglang", "0.5.9")
    used = old.used_versions()
    assert used["allreduce"] == "0.5.9" and used["gemm"] == used["moe"] == "0.5.14"
    line = select.newer_tables(old)
    assert line is not None and "gemm 0.5.14" in line and "allreduce" not in line
    assert select.newer_tables(Kernels("b200_sxm", "sglang", "0.5.16")) is None
