"""A fused MoE shape no table measured (simlab.cost.measured.transfer): timed from the nearest
measured gated shape at equal tokens per expert, tagged interpolated, recorded in the run's
kernels, and checked by leaving each measured model out."""

from __future__ import annotations

import math

import pytest
from hydra import compose, initialize_config_dir

from simlab.cost.measured import reference, tables, transfer
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.sources import INTERPOLATED, MEASURED, ROOFLINE
from simlab.experiments.predict import predict
from simlab.report.describe import time_sources_note
from tests.fixtures import CONFIGS, timed_prefill_summary

installed = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)

QWEN3_30B = (2048, 768, 8, 128, 1, 1)  # measured on every vLLM table below
NEMOTRON_NANO = (2688, 1856, 6, 128, 1, 1)  # non-gated (ReLU^2) experts
QWEN3_5_35B = (2048, 512, 8, 256, 1, 1)  # not measured on A100's vLLM 0.14


def test_the_nearest_shape_keeps_the_expert_parallelism_and_lends_only_gated_experts(
    monkeypatch,
):
    monkeypatch.setattr(transfer, "bundled_gating", lambda: {NEMOTRON_NANO[:4]: False})
    measured = [QWEN3_30B, NEMOTRON_NANO, (2048, 768, 8, 128, 1, 4), (4096, 1536, 8, 128, 1, 1)]
    # Nemotron-3-Nano is nearer in shape than Qwen3-235B, but its experts are not gated
    assert transfer.nearest(measured, (2600, 1800, 6, 128, 1, 1)) == (4096, 1536, 8, 128, 1, 1)
    assert transfer.nearest(measured, (2048, 768, 8, 128, 1, 4)) == (2048, 768, 8, 128, 1, 4)
    assert transfer.nearest(measured, (2048, 768, 8, 128, 1, 8)) is None
    # the held-out check never lends a model its own shape at another MoE TP
    with_own_tp2 = [*measured, (2048, 768, 8, 128, 2, 1)]
    assert transfer.nearest(with_own_tp2, QWEN3_30B, True) == (4096, 1536, 8, 128, 1, 1)


def test_tokens_are_matched_per_expert():
    # 16 experts top-2 at 1,000 tokens: 125 rows an expert; 8 experts top-2 reach it at 500
    jamba, mixtral = (4096, 14336, 2, 16, 1, 1), (4096, 14336, 2, 8, 1, 1)
    assert transfer.source_tokens(1000, jamba, mixtral) == pytest.approx(500)


@installed
def test_the_bundled_configs_say_which_experts_are_gated():
    gating = transfer.bundled_gating()
    assert gating[NEMOTRON_NANO[:4]] is False
    assert gating[QWEN3_30B[:4]] is True


@installed
def test_an_unmeasured_shape_is_the_sources_time_scaled_by_the_references():
    kernels = Kernels("a100_sxm", "vllm", "0.14.0")
    assert kernels.grid(("moe", *QWEN3_5_35B)) is None
    assert QWEN3_5_35B not in kernels.transfers
    ms, tag = kernels.moe(1024, QWEN3_5_35B)
    source = kernels.transfers[QWEN3_5_35B]
    assert tag == INTERPOLATED and source in kernels.moe_shapes() and transfer.gated(source)
    at = transfer.source_tokens(1024, QWEN3_5_35B, source)
    source_ms = kernels.grid(("moe", *source)).at((at,))[0]
    peaks = tables.peaks("a100_sxm")
    refs = [reference.roofline(peaks, reference.moe(s, "bf16")) for s in (QWEN3_5_35B, source)]
    assert ms == pytest.approx(source_ms * refs[0](1024) / refs[1](at), rel=1e-12)
    # non-gated experts do two GEMMs of the three
    assert kernels.moe(4096, QWEN3_5_35B, gated=False)[0] < kernels.moe(4096, QWEN3_5_35B)[0]
    # a measured shape is its measurement
    assert kernels.moe(1024, QWEN3_30B)[1] == MEASURED
    assert QWEN3_30B not in kernels.transfers


@installed
@pytest.mark.parametrize("gpu", ["a100_sxm", "h100_sxm"])
def test_leaving_each_model_out_its_shape_is_timed_within_ten_percent_at_the_median(gpu):
    version = tables.versions(gpu, "vllm")[-1]
    errors = transfer.held_out_errors(Kernels(gpu, "vllm", version))
    assert errors.size > 1000
    assert float(sorted(errors)[len(errors) // 2]) < 0.10


@installed
@pytest.mark.parametrize(
    ("model", "shape"),
    [
        ("mistralai/Mixtral-8x7B-v0.1", "measured"),  # 8 experts: the router below the table
        ("Qwen/Qwen3.5-35B-A3B", "transferred"),
    ],
)
def test_the_moe_leaves_the_roofline_and_the_prediction_names_its_source_shape(model, shape):
    overrides = [f"model.id={model}", "hardware=a100_80gb", "engine.backend=vllm", "prefill=[1024]"]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        prediction = predict(compose(config_name="predict", overrides=["model=hf", *overrides]))
    assert prediction["breakdown_sources"]["moe"] != [ROOFLINE]
    moe_shapes = prediction["kernels"].get("moe_shapes", {})
    assert bool(moe_shapes) == (shape == "transferred")
    # a lent shape is bounded by the transfer's held-out P90; a measured one is not bounded
    ranges = (prediction["unmeasured"] or {}).get("ops_ms", {})
    assert ("moe" in ranges) == (shape == "transferred")
    if "moe" in ranges:
        ((low, high),) = ranges["moe"]
        moe = prediction["breakdown_ms"]["moe"][0]
        p90 = Kernels("a100_sxm", "vllm", "0.14.0").moe_transfer_p90()
        assert low == pytest.approx(moe / (1 + p90)) and high == pytest.approx(moe * (1 + p90))
    if moe_shapes:
        ((query, source),) = moe_shapes.items()
        assert query == transfer.label(QWEN3_5_35B) and "of 128" in source
    assert math.isfinite(prediction["prefill_ms"][0])


@installed
def test_a_timed_run_records_the_lent_shape_and_the_report_names_it():
    summary = timed_prefill_summary("a100_80gb", "qwen3_5_35b_a3b")
    ((query, source),) = summary["kernels"]["moe_shapes"].items()
    assert query == transfer.label(QWEN3_5_35B)
    config = {"engine": {"backend": "vllm", "hardware": {"system": "a100_sxm"}}}
    note = time_sources_note(config, {"lru": summary})
    assert f"fused MoE {query} timed from {source}" in note


@installed
def test_an_fp8_shape_measured_only_block_scaled_takes_those_rows():
    # TensorRT-LLM's B200 table has per-tensor FP8 rows of other models, DeepSeek's FP8 experts
    # only block-scaled (the checkpoint it serves)
    kernels = Kernels("b200_sxm", "trtllm", "1.3.0rc20", "fp8")
    deepseek = (7168, 2048, 8, 256, 8, 1)
    assert deepseek in kernels.moe_shapes()
    assert kernels.moe(1024, deepseek)[1] == MEASURED
    assert deepseek not in kernels.transfers


@installed
def test_a_shape_the_versions_table_lacks_comes_from_the_nearest_version_that_has_it():
    # TensorRT-LLM 1.3.0rc23's H200 MoE table adds two Nemotron-3 models only; 1.3.0rc20's has
    # DeepSeek's experts
    kernels = Kernels("h200_sxm", "trtllm", "1.3.0rc23", "fp8")
    deepseek = (7168, 2048, 8, 256, 8, 1)
    assert kernels.grid(("moe", *deepseek)) is None
    assert kernels.moe(1024, deepseek)[1] == MEASURED
    assert kernels.moe_versions == {deepseek: "1.3.0rc20"} and not kernels.transfers
    assert kernels.lent() == {"moe_versions": {transfer.label(deepseek): "1.3.0rc20"}}


@installed
def test_a_moe_no_table_of_its_dtype_times_stays_on_the_roofline_and_says_why(caplog):
    # SGLang's L40S tables measure no FP8 fused MoE, per-tensor or block-scaled, of any shape
    overrides = [
        "model=hf",
        "model.id=Qwen/Qwen3-30B-A3B",
        "hardware=l40s",
        "engine.backend=sglang",
        "engine.dtype=fp8",
        "prefill=[4096]",
    ]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        out = predict(compose(config_name="predict", overrides=overrides))
    assert out["breakdown_sources"]["moe"] == [ROOFLINE]
    assert "fused MoE 2048x768 top-8 of 128 (MoE TP 1, EP 1): the fp8 tables hold no row" in (
        caplog.text
    )
