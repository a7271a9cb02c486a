"""``python -m simlab.predict``: the timed engine's cost model, asked for one prefill."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from simlab.cache.prefix import PrefixCache
from simlab.config import ConfigError
from simlab.cost.model import CostModel
from simlab.cost.shapes import BatchShape
from simlab.engines.step import RequestStep
from simlab.experiments.predict import predict
from simlab.model.spec import ModelSpec
from simlab.run.simulate import build_engine
from tests.fixtures import CONFIGS, ROOT, policy_plugins
from traces.format import Request


def config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="predict", overrides=overrides)


def test_the_prediction_is_the_timed_engines_prefill_time():
    cfg = config(["model=nemotron_h_8b", "engine.tp=2", "prefix=4000", "prefill=[500,5000]"])
    prediction = predict(cfg)
    cost: CostModel = build_engine(cfg).cost_model(ModelSpec.from_config(cfg.model))
    expected = [1000 * cost.prefill_time(4000, n) for n in (500, 5000)]
    assert prediction["prefill_ms"] == pytest.approx(expected, rel=1e-12)
    parts = prediction["breakdown_ms"]
    for i, total in enumerate(prediction["prefill_ms"]):
        assert sum(ms[i] for ms in parts.values()) == pytest.approx(total)
    assert prediction["prefill_ms"][0] < prediction["prefill_ms"][1]
    assert prediction["tp"] == 2 and prediction["calibration"].endswith("a100_40gb.json")


def test_the_preset_calibration_is_the_default_and_null_reverts():
    """a100_40gb uses gpu_validate/calibration/a100_40gb.json unless engine.calibration says
    otherwise; null goes back to the default efficiencies (every GEMM and elementwise op of the
    prediction differs; the totals may nearly coincide)."""
    roofline = "engine.kernels=roofline"  # the calibration times what no measured kernel does
    calibrated = predict(config(["prefill=[100,1000]", roofline]))
    default = predict(config(["prefill=[100,1000]", "engine.calibration=null", roofline]))
    assert calibrated["calibration"] == "gpu_validate/calibration/a100_40gb.json"
    assert calibrated["calibration_held_back_error"]["gemm"]["median"] > 0
    assert default["calibration"].startswith("default efficiencies")
    assert default["calibration_held_back_error"] == {}
    assert default["measured_ops"] == [] and default["measured_held_back_error"] == {}
    assert default["measured_share"] == [0.0, 0.0]
    measured = sum(calibrated["breakdown_ms"][op][1] for op in calibrated["measured_ops"])
    assert calibrated["measured_share"][1] == pytest.approx(measured / calibrated["prefill_ms"][1])
    assert 0.5 < calibrated["measured_share"][1] < 1  # llama3_8b on A100: all but attention
    measured_ops = {"attn_qkv_proj", "attn_out_proj", "mlp", "norms_residuals"}
    assert measured_ops <= set(calibrated["measured_ops"])  # timed from Vidur's measurements
    for op in (*sorted(measured_ops), "lm_head"):
        for a, b in zip(calibrated["breakdown_ms"][op], default["breakdown_ms"][op], strict=True):
            assert a != b, op
    heads = zip(
        calibrated["breakdown_ms"]["lm_head"], default["breakdown_ms"]["lm_head"], strict=True
    )
    for a, b in heads:
        assert abs(a / b - 1) > 0.005  # the fitted GEMM class model
    h200 = predict(config(["hardware=h200", "prefill=[1000]"]))  # no calibration file
    assert h200["calibration"].startswith("default efficiencies")


def test_a_calibration_for_another_gpu_is_a_one_line_error():
    with pytest.raises(ConfigError) as err:
        predict(
            config(
                ["hardware=h100_sxm", "engine.calibration=gpu_validate/calibration/a100_80gb.json"]
            )
        )
    message = str(err.value)
    assert message.startswith(
        "engine.calibration: calibration file gpu_validate/calibration/a100_80gb.json"
    )
    assert "fitted for hardware 'a100_80gb', not for the preset 'h100_sxm'" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("term", "value", "op"),
    [
        ("iteration_overhead_s", 0.002, "engine_overhead"),
        ("sequence_overhead_s", 0.001, "engine_overhead"),
        ("moe_dispatch_s_per_token", 1e-7, "moe_dispatch"),
    ],
)
def test_a_fixed_term_adds_exactly_its_charge(term, value, op):
    """3 requests of 2000 tokens prefilled together on Jamba (MoE): one iteration of 3
    sequences and 6000 tokens through every MoE layer; the term's op holds exactly its charge."""
    base = ["model=jamba_1_5_mini", "batch=3", "prefill=[2000]"]
    plain = predict(config(base))
    charged = predict(config([*base, f"engine.costs.{term}={value}"]))
    moe_layers = ModelSpec.from_config(config(base).model).n_moe_layers
    assert moe_layers > 0
    expected = {
        "iteration_overhead_s": value,  # one iteration
        "sequence_overhead_s": 3 * value,  # three sequences in it
        "moe_dispatch_s_per_token": value * 3 * 2000 * moe_layers,
    }[term]
    assert charged["breakdown_ms"][op] == [pytest.approx(1000 * expected)]
    assert charged["prefill_ms"][0] - plain["prefill_ms"][0] == pytest.approx(1000 * expected)
    assert op not in plain["breakdown_ms"]


def test_zero_terms_leave_the_prediction_unchanged():
    base = ["model=jamba_1_5_mini", "engine.tp=2", "prefix=3000", "prefill=[500,4000]"]
    zeros = [
        "engine.costs.iteration_overhead_s=0",
        "engine.costs.moe_dispatch_s_per_token=0",
        "engine.costs.mamba1_scan_scale=1",
        "engine.costs.state_load_s=0",
    ]
    assert predict(config(base)) == predict(config(base + zeros))


def test_scan_scales_and_allreduce_latency_change_their_own_ops():
    base = ["engine.tp=4", "prefill=[200,8000]", "engine.kernels=roofline"]
    for model, key, other in (
        ("jamba_1_5_mini", "mamba1_scan_scale", "mamba2_scan_scale"),
        ("nemotron_h_8b", "mamba2_scan_scale", "mamba1_scan_scale"),
    ):
        plain = predict(config([f"model={model}", *base]))
        slow = predict(config([f"model={model}", *base, f"engine.costs.{key}=0.5"]))
        untouched = predict(config([f"model={model}", *base, f"engine.costs.{other}=0.5"]))
        assert untouched == plain  # the other kind's scan is not this model's
        changed = {op for op, ms in slow["breakdown_ms"].items() if ms != plain["breakdown_ms"][op]}
        assert changed == {"ssm_scan"}
        assert slow["breakdown_ms"]["ssm_scan"][1] > 1.5 * plain["breakdown_ms"]["ssm_scan"][1]
    # an explicit latency replaces the measured all-reduce by the class model with that t0
    assert "tp_allreduce" in predict(config(base))["measured_ops"]
    plain = predict(config([*base, "engine.profiles=false"]))
    slow = predict(config([*base, "engine.costs.allreduce_latency_s=0.001"]))
    assert "tp_allreduce" not in slow["measured_ops"]
    layers = 64  # llama3_8b: 32 attention + 32 MLP sublayers, one all-reduce each
    extra = slow["breakdown_ms"]["tp_allreduce"][0] - plain["breakdown_ms"]["tp_allreduce"][0]
    cal = json.loads((ROOT / "gpu_validate/calibration/a100_40gb.json").read_text())
    t0 = cal["ops"]["allreduce"]["by_tp"]["4"]["t0"]
    assert extra == pytest.approx(1000 * layers * (0.001 - t0))


def test_state_copies_are_charged_per_hit():
    base = ["model=nemotron_h_8b", "prefix=4000", "prefill=[500]", "batch=2"]
    plain = predict(config(base))
    charged = predict(config([*base, "engine.costs.state_load_s=0.001"]))
    extra = (
        charged["breakdown_ms"]["ssm_state_copy"][0] - plain["breakdown_ms"]["ssm_state_copy"][0]
    )
    assert extra == pytest.approx(2 * 1.0)  # two hits, 1 ms each


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("prefill=[0]", "prefill: must be"),
        ("prefix=-1", "prefix: must be"),
        ("batch=0", "batch: must be"),
        ("engine=replay", "needs a timed engine"),
        (
            "engine.costs.iteration_overhead_s=-0.001",
            "engine.costs.iteration_overhead_s must be >= 0",
        ),
        ("engine.costs.mamba1_scan_scale=0", "engine.costs.mamba1_scan_scale must be > 0"),
        ("hardware.fp32_tflops=0", "hardware.fp32_tflops must be a number > 0"),
        ("+engine.costs.warp=1", "engine.costs.warp: unknown key"),
    ],
)
def test_bad_input_names_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        predict(config([override]))


def test_the_command_writes_prediction_json(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "simlab.predict",  # the documented command (the shim of simlab.experiments.predict)
            "prefill=[1000,2000]",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "prediction.json").read_text())
    assert saved["prefill_tokens"] == [1000, 2000] and len(saved["prefill_ms"]) == 2
    assert "prefill   1,000 tokens:" in proc.stdout


def test_a_tensor_parallel_degree_that_does_not_split_the_heads_is_a_one_line_error():
    with pytest.raises(ConfigError) as err:
        predict(config(["model=llama3_8b", "engine.tp=3"]))
    assert str(err.value).startswith("engine.tp: 3 does not divide llama3_8b's 32 attention heads")
    assert "\n" not in str(err.value)


def test_mamba1_projections_are_gemms_and_x_proj_adds_an_all_reduce_under_tp():
    """vLLM's and SGLang's MambaMixer: ``x_proj`` (d_inner -> dt_rank + 2N) is a
    RowParallelLinear, so each Mamba1 layer all-reduces its output under tensor parallelism;
    ``dt_proj`` (dt_rank -> d_inner) is column-parallel. Both are GEMMs, timed as such: the
    selective scan keeps only the recurrence, the convolution and the gating."""
    cfg = config(
        ["model=jamba_1_5_mini", "engine.tp=4", "prefill=[3000]", "engine.kernels=roofline"]
    )
    m = ModelSpec.from_config(cfg.model)
    cost: CostModel = build_engine(cfg).cost_model(m)
    T, tp, ns, w = 3000, 4, m.n_ssm_layers, m.dtype_bytes
    di, N, R, K = m.ssm_d_inner, m.ssm_state_dim, m.ssm_dt_rank, m.ssm_conv_kernel
    ops = {op.name: op for op in cost.ops(BatchShape(prefill=[(0, T)]))}
    x_proj, dt_proj, scan = ops["ssm_x_proj"], ops["ssm_dt_proj"], ops["ssm_scan"]
    assert (x_proj.op_class, x_proj.shape) == ("gemm", (di, R + 2 * N, w))
    assert (dt_proj.op_class, dt_proj.shape) == ("gemm", (R, di, w))
    assert x_proj.flops == pytest.approx(2 * T * di * (R + 2 * N) * ns / tp)
    assert dt_proj.flops == pytest.approx(2 * T * R * di * ns / tp)
    assert scan.op_class == "selective_scan"
    assert scan.flops == pytest.approx((9 * di * N + 2 * K * di + 10 * di) * T * ns / tp)
    # the layer's FLOPs are unchanged, only where they are timed
    per_layer = sum(ops[n].flops for n in ("ssm_in_proj", "ssm_x_proj", "ssm_dt_proj"))
    per_layer += scan.flops + ops["ssm_out_proj"].flops
    assert per_layer == pytest.approx(m.ssm_flops(0, T) / tp)
    # one more all-reduce per Mamba1 layer, of dt_rank + 2N values per token, timed from the
    # measured NCCL profile at that message size
    reduce = ops["ssm_x_proj_allreduce"]
    assert (reduce.op_class, reduce.units, reduce.launches) == ("allreduce", ns, ns)
    assert reduce.bytes == pytest.approx(2 * (tp - 1) / tp * T * (R + 2 * N) * w * ns)
    assert cost.measured(reduce) and cost.measured(ops["tp_allreduce"])
    profile = cost.calibration.profiles[("tp_allreduce", (), tp)]
    assert cost.op_time(reduce) == pytest.approx(ns * profile.at(T * (R + 2 * N) * w))
    # one GPU has nothing to reduce; a Mamba2 model has no x_proj
    single = build_engine(config(["model=jamba_1_5_mini"])).cost_model(m)
    assert not {"ssm_x_proj_allreduce", "tp_allreduce"} & {
        op.name for op in single.ops(BatchShape(prefill=[(0, T)]))
    }
    nemotron = config(["model=nemotron_h_8b", "engine.tp=4"])
    names = {
        op.name
        for op in build_engine(nemotron)
        .cost_model(ModelSpec.from_config(nemotron.model))
        .ops(BatchShape(prefill=[(0, T)]))
    }
    assert "tp_allreduce" in names and not {"ssm_x_proj", "ssm_x_proj_allreduce"} & names


def test_the_selective_scan_never_beats_the_cuda_cores_fp32_peak():
    """Mamba1's selective scan runs in FP32 on CUDA cores (``selective_scan_cuda``), not on
    tensor cores: on an A100 (19.5 TFLOP/s FP32, 312 BF16 tensor) its compute rate is at most
    19.5 TFLOP/s, whatever the efficiency; the default 0.30 of the tensor peak was 93.6. A
    preset without ``fp32_tflops`` keeps the efficiency as it is."""
    base = ["model=jamba_1_5_mini", "hardware=a100_40gb", "prefill=[8000]"]
    m = ModelSpec.from_config(config(base).model)
    capped = build_engine(config(base)).cost_model(m)
    plain = build_engine(config([*base, "hardware.fp32_tflops=null"])).cost_model(m)
    assert capped.efficiency["selective_scan"].eta_c == pytest.approx(19.5 / 312)
    assert plain.efficiency["selective_scan"].eta_c == pytest.approx(0.30)
    scan = next(op for op in capped.ops(BatchShape(prefill=[(0, 8000)])) if op.name == "ssm_scan")
    assert capped.op_time(scan) >= scan.flops / 19.5e12 > plain.op_time(scan)
    gemms = [op for op in capped.ops(BatchShape(prefill=[(0, 8000)])) if op.op_class == "gemm"]
    assert all(capped.op_time(op) == plain.op_time(op) for op in gemms)  # tensor cores


@pytest.mark.parametrize(("new", "batch", "iterations"), [(20_000, 1, 3), (6_000, 2, 2)])
def test_a_prompt_longer_than_the_token_budget_is_predicted_as_the_engine_chunks_it(
    new, batch, iterations
):
    """Alone on the GPU, the timed engine prefills in iterations of at most
    ``engine.token_budget`` tokens (the requests in order, logits only in a prompt's last
    chunk): the prediction is the last request's first token in that engine, not one
    iteration of every token."""
    cfg = config(["engine.token_budget=8192", f"prefill=[{new}]", f"batch={batch}"])
    prediction = predict(cfg)
    assert prediction["iterations"] == [iterations] and prediction["token_budget"] == 8192
    engine = build_engine(cfg)
    spec = ModelSpec.from_config(cfg.model)
    requests = [  # distinct contents: nothing one request computes is a hit for the other
        Request(
            i,
            i,
            0,
            0.0,
            np.arange(i * new, (i + 1) * new, dtype=np.int32),
            np.zeros(0, np.int32),
            4,
        )
        for i in range(batch)
    ]
    admission, eviction = policy_plugins("sglang_plus")
    step = RequestStep(PrefixCache(spec, math.inf), admission, eviction, "sglang_plus")
    records = engine.run(requests, step).records
    assert max(r.ttft for r in records) == pytest.approx(
        prediction["prefill_ms"][0] / 1000, rel=1e-12
    )
    cost = engine.cost_model(spec)
    one_iteration = cost.time(BatchShape(prefill=[(0, new)] * batch))
    assert prediction["prefill_ms"][0] > 1000 * one_iteration  # weights read per chunk
    total = sum(ms[0] for ms in prediction["breakdown_ms"].values())
    assert total == pytest.approx(prediction["prefill_ms"][0])


def test_without_chunked_prefill_every_prompt_is_one_iteration():
    """``engine.token_budget=null`` (SGLang's ``--chunked-prefill-size -1``): the batch's
    prompts are prefilled in one iteration, as with a budget past all of them."""
    sglang = ["engine.request_admission=sglang", "engine.batching=prefill_first"]
    lengths = ["prefill=[20000]", "batch=2"]
    off = predict(config(["engine.token_budget=null", *sglang, *lengths]))
    wide = predict(config(["engine.token_budget=1000000", *sglang, *lengths]))
    assert off["iterations"] == [1] and off["token_budget"] is None
    assert off["prefill_ms"] == wide["prefill_ms"]


SGLANG_SHARED = [
    "engine.kv_pool=shared",
    "engine.running_memory_gb=100",
    "engine.request_admission=sglang",
    "engine.memory_check=false",
]


@pytest.mark.parametrize(
    ("overrides", "iterations"),
    [
        # SGLang's defaults but a 1,024-token cap: a pass ends once its chunks spend the cap
        ([*SGLANG_SHARED, "engine.token_budget=2048", "engine.max_prefill_tokens=1024"], 5),
        (
            [
                *SGLANG_SHARED,
                "engine.token_budget=2048",
                "engine.max_prefill_tokens=1024",
                "engine.batching=prefill_first",
            ],
            5,
        ),
        # chunked prefill off: a prompt reaching what the cap left waits for the next pass
        (
            [
                *SGLANG_SHARED,
                "engine.token_budget=null",
                "engine.max_prefill_tokens=4000",
                "engine.batching=prefill_first",
            ],
            3,
        ),
        ([*SGLANG_SHARED, "engine.token_budget=null", "engine.batching=prefill_first"], 1),
        # whole admission: every request starts at once; prefill_first runs no decode beside
        (["engine.token_budget=2048", "engine.batching=prefill_first"], 5),
        (["engine.token_budget=2048"], 5),
    ],
)
def test_the_prediction_follows_the_engines_scheduling(overrides, iterations):
    """Three 3,000-token prompts arriving together: the prediction's iterations are the timed
    engine's under its batching and admission (SGLang's pass with its prefill cap, chunked
    prefill on or off), to the last first token, bit for bit. (Before the prediction followed
    them it took 0.5-1.7% longer or shorter than the engine here.)"""
    cfg = config([*overrides, "prefill=[3000]", "batch=3", "model=llama3_8b"])
    prediction = predict(cfg)
    assert prediction["iterations"] == [iterations]
    engine = build_engine(cfg)
    spec = ModelSpec.from_config(cfg.model)
    requests = [
        Request(i, i, 0, 0.0, np.arange(i * 3000, (i + 1) * 3000, dtype=np.int32),
                np.zeros(0, np.int32), 64)
        for i in range(3)
    ]  # fmt: skip
    admission, eviction = policy_plugins("sglang_plus")
    step = RequestStep.build(spec, 1e12, admission, eviction, "sglang_plus")
    records = engine.run(requests, step).records
    assert max(r.ttft for r in records) == pytest.approx(
        prediction["prefill_ms"][0] / 1000, rel=1e-12
    )


def test_a_batch_past_max_running_is_a_one_line_error():
    with pytest.raises(ConfigError, match=r"batch: 3 requests exceed engine\.max_running=2"):
        predict(config(["batch=3", "engine.max_running=2"]))
