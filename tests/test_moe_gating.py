"""A non-gated model's fused MoE on a table's rows (simlab.cost.measured.moe_gating): each
table's rows of Nemotron-3's shapes are judged run gated or not, against how aiconfigurator's
collectors ran them, and rows run gated time the model's two expert GEMMs, interpolated,
warned and recorded."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from simlab.cost.measured import moe_gating, tables
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.moe_gating import GATED, NON_GATED, UNDECIDED
from simlab.cost.measured.sources import INTERPOLATED, MEASURED
from simlab.experiments.predict import kernel_lines, predict
from simlab.report.describe import time_sources_note
from tests.fixtures import CONFIGS, timed_prefill_summary

pytestmark = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)

NANO = (2688, 1856, 6, 128)  # Nemotron-3-Nano: ReLU^2 experts
SUPER_LATENT = (1024, 2688, 22, 512)  # Nemotron-3-Super's latent MoE
QWEN3_30B = (2048, 768, 8, 128)  # gated experts


@pytest.mark.parametrize(
    ("system", "backend", "version", "model", "verdict"),
    [
        # the vLLM collector built every shape's w1 at 2 x intermediate until 0.24
        ("a100_sxm", "vllm", "0.14.0", NANO, GATED),
        ("a100_sxm", "vllm", "0.14.0", (4096, 2688, 22, 512), GATED),
        ("h200_sxm", "vllm", "0.19.0", NANO, GATED),
        ("b200_sxm", "vllm", "0.22.0", NANO, GATED),
        ("h100_sxm", "vllm", "0.24.0", NANO, NON_GATED),
        ("rtx_pro_6000_server", "vllm", "0.24.0", NANO, NON_GATED),
        # the SGLang collector ran Nemotron-H non-gated from 0.5.14, except the FP8 Super case
        ("a100_sxm", "sglang", "0.5.10", NANO, GATED),
        ("h100_sxm", "sglang", "0.5.10", NANO, GATED),
        ("l40s", "sglang", "0.5.14", NANO, NON_GATED),
        ("h100_sxm", "sglang", "0.5.14", SUPER_LATENT, GATED),
        # FlashInfer CUTLASS rows on Hopper: no gated shape of that kernel to judge them by
        ("h100_sxm", "sglang", "0.5.14", NANO, UNDECIDED),
        # TensorRT-LLM names its non-gated kernel
        ("l40s", "trtllm", "1.3.0rc20", NANO, NON_GATED),
        ("h100_sxm", "trtllm", "1.3.0rc23", SUPER_LATENT, NON_GATED),
    ],
)
def test_the_verdicts_agree_with_how_the_collectors_ran_the_experts(
    system, backend, version, model, verdict
):
    got, figures = moe_gating.judge(system, backend, version, "bf16", None, model)
    assert got == verdict
    if figures:  # judged, not named: the winner within the P90, the two ~1.5x apart
        assert abs(figures[GATED] - figures[NON_GATED]) > 0.08


def test_every_trtllm_nemotron_row_is_named_nongated_and_judged_so():
    for system in ("h100_sxm", "b200_sxm", "l40s"):
        verdicts = moe_gating.verdicts(system, "trtllm", "1.3.0rc20")
        assert verdicts and all(v.startswith(NON_GATED) for v in verdicts.values())


@pytest.mark.parametrize(
    ("system", "gated_rows", "non_gated_rows"),
    [
        ("h200_sxm", ("vllm", "0.19.0"), ("vllm", "0.24.0")),
        ("h100_sxm", ("sglang", "0.5.10"), ("vllm", "0.24.0")),
    ],
)
def test_gated_rows_scaled_to_two_gemms_reproduce_a_table_that_ran_them_non_gated(
    system, gated_rows, non_gated_rows
):
    # both Triton's fused MoE: they agree on a gated model, and not on Nemotron-3-Nano's
    # experts until the gated rows are scaled
    pair = (system, gated_rows, non_gated_rows)
    assert pair in moe_gating.CHECKS
    assert np.median(moe_gating.check(*pair, QWEN3_30B, scaled=False)) < 0.05
    assert np.median(moe_gating.check(*pair, NANO, scaled=False)) > 0.35
    scaled = moe_gating.check(*pair, NANO)
    assert np.median(scaled) < 0.06 and np.quantile(scaled, 0.9) < 0.11


def test_a_non_gated_model_on_gated_rows_is_interpolated_warned_once_and_recorded(
    caplog, monkeypatch
):
    monkeypatch.setattr("simlab.cost.measured.kernels._WARNED", set())  # once per process
    moe_gating.judge.cache_clear()
    kernels = Kernels("a100_sxm", "vllm", "0.14.0")
    shape = (*NANO, 1, 1)
    row = kernels.grid(("moe", *shape)).at((1024,))
    # a gated model of that shape would be its measured row; Nemotron's experts are two GEMMs
    assert kernels.moe(1024, shape) == row and row[1] == MEASURED
    assert not kernels.moe_gating
    with caplog.at_level(logging.WARNING):
        ms, tag = kernels.moe(1024, shape, gated=False)
        kernels.moe(4096, shape, gated=False)
    two, three = kernels.moe_reference(shape, False), kernels.moe_reference(shape, True)
    assert ms == pytest.approx(row[0] * two(1024) / three(1024), rel=1e-12)
    assert tag == INTERPOLATED and 0.6 < ms / row[0] < 0.75
    warned = [r for r in caplog.records if "kernels.moe_gating" in r.getMessage()]
    assert len(warned) == 1 and "rows run gated" in warned[0].getMessage()
    # the verdict reads every shape of the table as measured: no other shape's spikes are
    # warned, nor recorded, in a run of this one
    assert not [r for r in caplog.records if "kernels.spikes" in r.getMessage()]
    assert "spikes" not in kernels.lent()
    (line,) = kernels.lent()["moe_gating"].values()
    assert "scaled to 2 GEMMs of 3" in line and "transfer P90 22%" in line


def test_rows_run_non_gated_are_taken_as_measured_and_undecided_ones_are_said():
    shape = (*NANO, 1, 1)
    l40s = Kernels("l40s", "vllm", "0.24.0")
    assert l40s.moe(1024, shape, gated=False) == l40s.grid(("moe", *shape)).at((1024,))
    assert not l40s.moe_gating
    hopper = Kernels("h100_sxm", "sglang", "0.5.14")
    assert hopper.moe(1024, shape, gated=False)[1] == MEASURED
    assert (
        "taken as measured"
        in hopper.lent()["moe_gating"]["2688x1856 top-6 of 128 (MoE TP 1, EP 1)"]
    )


def test_the_prediction_and_the_report_name_the_scaled_rows():
    overrides = ["model=nemotron_3_nano", "hardware=a100_80gb", "engine.backend=vllm"]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        prediction = predict(
            compose(config_name="predict", overrides=[*overrides, "prefill=[1024]"])
        )
    assert prediction["breakdown_sources"]["moe"] == [INTERPOLATED]
    (label,) = prediction["kernels"]["moe_gating"]
    assert any(
        line.startswith(f"fused MoE {label}: non-gated")
        for line in kernel_lines(prediction["kernels"])
    )
    summary = timed_prefill_summary("a100_80gb", "nemotron_3_nano")
    assert label in summary["kernels"]["moe_gating"]
    config = {"engine": {"backend": "vllm", "hardware": {"system": "a100_sxm"}}}
    assert f"fused MoE {label}: non-gated experts on rows run gated" in time_sources_note(
        config, {"lru": summary}
    )
