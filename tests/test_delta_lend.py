"""The delta-rule kernels a GPU's tables lack (simlab.cost.measured.delta_lend): another
engine's table on the same GPU lends its measured rows (never FlashInfer's own scan), GDN's
chunked scan on a GPU no engine measured it on comes from the GPUs of its class at this GPU's
bandwidth, recorded, bounded by the transfer's held-out error, and only for that class."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from simlab.cost.measured import delta_lend, ssd_scan, tables, unmeasured
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.sources import INTERPOLATED, ROOFLINE
from simlab.cost.shapes import BatchShape
from simlab.engines.timed.engine import TimedEngine, time_sources
from simlab.experiments.predict import predict
from simlab.report.describe import time_sources_note
from tests.fixtures import CONFIGS
from tests.test_measured_kernels import installed, preset, spec

pytestmark = installed

SCAN = ("gdn", "context", "scan")
QWEN_HEADS = (16, 32)  # Qwen3.5-35B-A3B's GDN key and value heads at TP 1


def a100(backend: str = "vllm") -> Kernels:
    return Kernels("a100_sxm", backend, tables.versions("a100_sxm", backend)[-1])


def sglang_a100_rows(**where: object) -> pd.DataFrame:
    path = a100("sglang").path("gdn")
    frame = pd.read_parquet(path)
    for column, value in where.items():
        frame = frame[frame[column] == value]
    return frame


def test_an_engine_without_a_gdn_table_takes_another_engines_measured_rows_on_its_gpu():
    kernels = a100("vllm")
    assert kernels.path("gdn") is None  # vLLM 0.14 measured no GDN kernel on A100
    rows = sglang_a100_rows(
        phase="context", d_model=2048, num_k_heads=16, num_v_heads=32, batch_size=1, seq_len=4096
    )
    conv = rows[rows["kernel_source"].str.contains("causal_conv1d")]
    assert len(conv) == 1
    ms, _ = kernels.delta_rule("gdn", "context", "conv", 1, 4096, QWEN_HEADS, 2048)
    assert ms == pytest.approx(float(conv["latency"].iloc[0]), rel=1e-12)  # exp(log(t))
    assert kernels.lent()["delta_rule_lent"]["gdn context conv"] == "sglang 0.5.10"
    # the engine's own table, where it has one, is never replaced
    own = a100("sglang")
    assert own.delta_rule("gdn", "context", "conv", 1, 4096, QWEN_HEADS, 2048)[0] == ms
    assert "delta_rule_lent" not in own.lent()


def test_flashinfers_own_scan_never_lends():
    path = Kernels("h100_sxm", "vllm", "0.24.0").path("gdn")
    assert delta_lend.grid(path, "context", "scan", 0) is not None  # FlashInfer's, vLLM's own
    assert delta_lend.grid(path, "context", "scan", 0, lent=True) is None
    assert delta_lend.grid(path, "context", "conv", 0, lent=True) is not None
    # nor do KDA's kernels (vLLM's FlashKDA, SGLang's chunk_kda): TensorRT-LLM has no KDA table
    trt = Kernels("h100_sxm", "trtllm", tables.versions("h100_sxm", "trtllm")[-1])
    sglang = Kernels("h100_sxm", "sglang", tables.versions("h100_sxm", "sglang")[-1])
    heads = (24, 24)  # a measured head count
    assert sglang.delta_rule("kda", "context", "scan", 1, 4096, heads, 0) is not None
    assert trt.delta_rule("kda", "context", "scan", 1, 4096, heads, 0) is None


def test_the_scan_no_engine_measured_on_a100_comes_from_its_class_at_its_bandwidth():
    kernels = a100("vllm")
    for backend in tables.BACKENDS:  # no engine's A100 table holds the chunked scan
        path = a100(backend).path("gdn")
        assert path is None or delta_lend.grid(path, "context", "scan", 0) is None
    lenders = delta_lend.sources("a100_sxm", None)
    assert sorted(g for g, *_ in lenders) == ["l40s", "rtx_pro_6000_server"]  # Ada, SM 120
    ms, tag = kernels.delta_rule(*SCAN, 1, 4096, QWEN_HEADS, 0)
    assert tag == INTERPOLATED
    assert delta_lend.GPU_LENT in kernels.lent()["delta_rule_lent"]
    # the geometric mean of each source's measured time scaled by floor + bytes / bandwidth
    moved = delta_lend.scan_bytes(QWEN_HEADS, 1, 4096)
    floor = math.exp(np.mean([math.log(f) for *_, f in lenders]))
    bandwidth = tables.peaks("a100_sxm")["mem_bw_gbps"] * 1e6
    scaled = [
        source.delta_rule(*SCAN, 1, 4096, QWEN_HEADS, 0)[0]
        * (floor + moved / bandwidth)
        / (own + moved / bw)
        for _, source, bw, own in lenders
    ]
    assert ms == pytest.approx(math.exp(np.mean(np.log(scaled))), rel=1e-12)
    # longer prompts take longer; a GPU lent its own bandwidth and floor gets its own times
    assert kernels.delta_rule(*SCAN, 1, 16384, QWEN_HEADS, 0)[0] > 3 * ms
    gpu, source, bw, own = lenders[0]
    alone = delta_lend.transferred(((gpu, source, bw, own),), bw, (QWEN_HEADS, 2, 8192), 0)
    assert alone == pytest.approx(source.delta_rule(*SCAN, 2, 8192, QWEN_HEADS, 0)[0])


def test_heads_no_lender_measured_are_left_to_the_roofline_not_lent_back_and_forth():
    # Nemotron-H-56B at TP 1: 256 value heads, more than any source GPU's scan table holds.
    # Each source is asked for its own measurement only: before, an uncovered source lent
    # the shape from the class again, and the two sources asked each other without end.
    heads = (8, 256)
    lenders = delta_lend.sources("a100_sxm", None)
    for _, source, *_ in lenders:
        assert source.grid(("gdn", *delta_lend.SCAN, 0)).at((*heads, 1, 4096)) is None
        assert source.delta_rule(*SCAN, 1, 4096, heads, 0, from_class=False) is None
    assert a100("vllm").delta_rule(*SCAN, 1, 4096, heads, 0) is None
    overrides = ["model=hf", "model.id=nvidia/Nemotron-H-56B-Base-8K", "hardware=a100_80gb"]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        out = predict(compose(config_name="predict", overrides=[*overrides, "prefill=[1024]"]))
    assert out["breakdown_sources"]["ssm_scan"] == [ROOFLINE]
    ((low, high),) = out["unmeasured"]["ops_ms"]["ssm_scan"]
    assert low < out["breakdown_ms"]["ssm_scan"][0] < high


def test_a_gpu_outside_the_class_keeps_its_scan_on_the_roofline():
    assert delta_lend.sm_version("h100_sxm") == 90  # wgmma: the class's times do not transfer
    assert delta_lend.sources("h100_sxm", None) == ()
    kernels = Kernels("h100_sxm", "trtllm", tables.versions("h100_sxm", "trtllm")[-1])
    # TensorRT-LLM's H100 table measured TP 1's heads only: TP 2's stay unanswered
    assert kernels.delta_rule(*SCAN, 1, 4096, (8, 16), 0) is None


def test_each_source_gpu_left_out_is_timed_within_the_stated_error():
    errors = delta_lend.held_out_errors("a100_sxm", None)
    assert errors.size > 3000
    assert float(np.median(errors)) < 0.25
    assert delta_lend.transfer_p90(a100()) == pytest.approx(float(np.quantile(errors, 0.9)))


def test_the_transferred_scan_is_bounded_by_that_error_and_the_roofline_one_by_it_too():
    model = spec("qwen3_5_35b_a3b")
    p90 = delta_lend.transfer_p90(a100())
    assert p90 is not None
    for tp in (1, 2):
        cost = preset_cost(model, tp)
        batch = BatchShape(prefill=[(0, 8192)])
        op = next(o for o in cost.ops(batch) if o.name == "ssm_scan")
        seconds = cost.op_time(op)
        low, high = unmeasured.ranges(cost, batch)["ssm_scan"]
        if tp == 1:  # conv lent by SGLang's A100 table, scan from the class: interpolated
            assert cost.source(op) == INTERPOLATED
            assert (low, high) == pytest.approx((seconds / (1 + p90), seconds * (1 + p90)))
        else:  # A100's conv rows hold TP 1's heads only: the op stays on the roofline, and its
            assert cost.source(op) == ROOFLINE  # high end is the class's scan, far above 2x
            assert high > 2 * seconds
            assert low <= seconds
        # the roofline alone is more than twice too fast, as on every GPU that measured it
        roofline = preset_cost(model, tp, kernels=False).op_time(op)
        assert high > 2 * roofline
    assert "GDN" in unmeasured.assumption("ssm_scan", "gdn")
    assert "SSD" in unmeasured.assumption("ssm_scan", "mamba2")
    assert "Mamba1 selective scan" in unmeasured.assumption("ssm_scan", "mamba1")


def preset_cost(model, tp: int, kernels: bool = True):
    engine = TimedEngine(
        hardware=preset("a100_80gb"), tp=tp, kernels="measured" if kernels else "roofline"
    )
    return engine.cost_model(model)


def test_a_prediction_records_what_was_lent_and_bounds_it():
    overrides = ["model=qwen3_5_35b_a3b", "hardware=a100_80gb", "engine.backend=vllm"]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        out = predict(compose(config_name="predict", overrides=[*overrides, "prefill=[4096]"]))
    lent = out["kernels"]["delta_rule_lent"]
    assert lent["gdn context conv"] == "sglang 0.5.10"
    assert lent[delta_lend.GPU_LENT].startswith("l40s, rtx_pro_6000_server")
    assert out["breakdown_sources"]["ssm_scan"] == [INTERPOLATED]
    assert "GDN" in out["unmeasured"]["assumptions"]["ssm_scan"]
    ((low, high),) = out["unmeasured"]["ops_ms"]["ssm_scan"]
    assert low < out["breakdown_ms"]["ssm_scan"][0] < high


@pytest.mark.parametrize(
    ("gpu", "agrees"), [("l40s", True), ("rtx_pro_6000_server", True), ("h100_sxm", False)]
)
def test_vllms_triton_scan_is_sglangs_and_flashinfers_is_another_kernel(gpu, agrees):
    """Why a lent scan must be FLA's Triton kernel: vLLM's Triton scan (Ada, SM 120) times as
    SGLang's at the shapes both measured; its FlashInfer scan (Hopper) does not."""
    grids = [
        Kernels(gpu, backend, tables.versions(gpu, backend)[-1]).grid(("gdn", "context", "scan", 0))
        for backend in ("vllm", "sglang")
    ]
    both = np.isfinite(grids[0].log_y) & np.isfinite(grids[1].log_y)
    assert grids[0].axes == grids[1].axes and both.sum() > 1000
    ratio = float(np.exp(np.median(grids[0].log_y[both] - grids[1].log_y[both])))
    assert (0.9 < ratio < 1.1) == agrees


@pytest.mark.parametrize("gpu", ["l40s", "rtx_pro_6000_server", "h100_sxm", "b200_sxm"])
def test_vllm_and_sglang_time_the_same_conv_and_decode_kernels_alike(gpu):
    """Why another engine's conv and decode rows lend: each of vLLM's over SGLang's has a
    median ratio of 0.88-1.06 at the shapes both measured."""
    for kernel in (("context", "conv"), ("generation", "conv"), ("generation", "scan")):
        grids = [
            Kernels(gpu, backend, tables.versions(gpu, backend)[-1]).grid(("gdn", *kernel, 0))
            for backend in ("vllm", "sglang")
        ]
        both = np.isfinite(grids[0].log_y) & np.isfinite(grids[1].log_y)
        assert both.sum() > 150
        ratio = float(np.exp(np.median(grids[0].log_y[both] - grids[1].log_y[both])))
        assert 0.85 < ratio < 1.15, (kernel, ratio)


def test_a_mamba2_scan_on_a100_comes_from_the_transferred_gdn_scan_and_is_recorded():
    # vLLM 0.14's SSD kernels have a public timing: FLA's scan, transferred from the class,
    # at vLLM's factor; the range widened by that transfer's P90
    overrides = ["model=nemotron_3_nano", "hardware=a100_80gb", "engine.backend=vllm"]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        out = predict(compose(config_name="predict", overrides=[*overrides, "prefill=[8192]"]))
    lent = out["kernels"]["delta_rule_lent"]
    assert lent[delta_lend.GPU_LENT] == "l40s, rtx_pro_6000_server at this GPU's bandwidth"
    assert ssd_scan.LENT in lent
    assert "SSD" in out["unmeasured"]["assumptions"]["ssm_scan"]
    ((low, high),) = out["unmeasured"]["ops_ms"]["ssm_scan"]
    (scan,) = out["breakdown_ms"]["ssm_scan"]
    p90 = delta_lend.transfer_p90(ssd_scan.fla("a100_sxm", "bf16", None))
    assert low < scan < high == pytest.approx(ssd_scan.SPREAD * scan * (1 + p90))


def test_a_timed_run_records_the_lent_gdn_kernels_and_the_report_names_them():
    cost = preset_cost(spec("qwen3_5_35b_a3b"), 1)
    cost.time(BatchShape(prefill=[(0, 1000)], decode=[1000]))
    summary = time_sources(cost, "lru")
    lent = summary["kernels"]["delta_rule_lent"]
    assert lent["gdn context conv"] == lent["gdn generation scan"] == "sglang 0.5.10"
    assert lent[delta_lend.GPU_LENT] == "l40s, rtx_pro_6000_server at this GPU's bandwidth"
    config = {"engine": {"backend": "vllm", "hardware": {"system": "a100_sxm"}}}
    note = time_sources_note(config, {"lru": summary})
    assert f"; {delta_lend.GPU_LENT} from l40s, rtx_pro_6000_server" in note
    assert "; gdn context conv from sglang 0.5.10" in note


def test_a_mamba1_scan_states_its_own_assumption_and_twice_its_model():
    # Jamba's selective scan is op ssm_scan as every kind's is; nothing bounds it but 2x
    overrides = ["model=jamba_1_5_mini", "hardware=a100_80gb", "engine.tp=2", "prefill=[8192]"]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        out = predict(compose(config_name="predict", overrides=overrides))
    assert out["unmeasured"]["assumptions"]["ssm_scan"].startswith("Mamba1 selective scan")
    ((low, high),) = out["unmeasured"]["ops_ms"]["ssm_scan"]
    (scan,) = out["breakdown_ms"]["ssm_scan"]
    assert low < scan and high == pytest.approx(2 * scan)


def test_a_mamba2_scans_high_end_covers_the_public_timing_of_vllms_ssd_kernels():
    # Nemotron-H-8B's layer has those heads and that state (eight groups): the same GDN bound
    lengths = sorted(ssd_scan.VLLM_TOKENS_PER_S)
    overrides = ["model=nemotron_h_8b", "hardware=h100_sxm", "engine.token_budget=32768"]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        out = predict(compose(config_name="predict", overrides=[*overrides, f"prefill={lengths}"]))
    layers = 24
    for length, (low, high), scan in zip(
        lengths,
        out["unmeasured"]["ops_ms"]["ssm_scan"],
        out["breakdown_ms"]["ssm_scan"],
        strict=True,
    ):
        public = length / ssd_scan.VLLM_TOKENS_PER_S[length] * 1e3
        assert low / layers < scan / layers < public <= high / layers * 1.001, length
        # the GDN scan at the same state size alone was below it: the factor is needed
        assert high / layers / unmeasured.SSD_OVER_GDN < public, length
