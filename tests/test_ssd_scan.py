"""A Mamba2 layer's SSD scan from FLA's GDN scan (simlab.cost.measured.ssd_scan), for the
engines whose SSD kernels have a public timing: each public point sits at a steady factor of
FLA's scan at the equal state, the prediction takes it, tagged and bounded, and the engines
without one keep the roofline."""

from __future__ import annotations

import json
import statistics

import pytest
from hydra import compose, initialize_config_dir

from simlab.cost.measured import ssd_scan, tables
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.sources import INTERPOLATED, ROOFLINE
from simlab.experiments.predict import predict
from tests.fixtures import CONFIGS

pytestmark = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)

#: Falcon-H1-1.5B-Instruct's config.json, the fields simlab reads: the SGLang public timing's
#: model (attention and Mamba2 in every one of its 24 layers)
FALCON_H1_1_5B = {
    "architectures": ["FalconH1ForCausalLM"],
    "model_type": "falcon_h1",
    "num_hidden_layers": 24,
    "hidden_size": 2048,
    "intermediate_size": 4608,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "vocab_size": 65537,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_n_groups": 1,
    "mamba_n_heads": 48,
    "mamba_d_head": 64,
    "mamba_d_ssm": 3072,
    "mamba_chunk_size": 128,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def ratios(name: str) -> list[float]:
    public = ssd_scan.PUBLIC[name]
    v = ssd_scan.value_heads(*public.layer)
    out = []
    for batch, length, ms in public.points:
        timed = ssd_scan.fla_scan(public.gpu, "bf16", None, v, batch, length)
        assert timed is not None, (name, length)
        out.append(ms / timed[0])
    return out


def test_vllms_public_ssd_timing_is_a_steady_half_of_flas_gdn_scan():
    # four lengths, 4,096 to 32,768 tokens: one factor within 4% of each
    got = ratios("vllm")
    assert len(got) == 4
    assert ssd_scan.factor("vllm") == pytest.approx(statistics.median(got))
    assert all(abs(r / ssd_scan.factor("vllm") - 1) < 0.04 for r in got)
    assert 0.45 < ssd_scan.factor("vllm") < 0.52
    # SGLang's untuned 16-wide tiles: twice vLLM's old kernels at FLA's scan
    assert 0.9 < ssd_scan.factor("sglang") < 1.05


@pytest.mark.parametrize(
    ("system", "backend", "version", "public"),
    [
        ("h100_sxm", "sglang", "0.5.16", "sglang"),
        ("a100_sxm", "sglang", "0.5.10", "sglang"),
        ("a100_sxm", "vllm", "0.14.0", "vllm"),
        ("h100_sxm", "vllm", "0.14.0", "vllm"),
        ("h100_sxm", "vllm", "0.24.0", None),  # after vLLM's SSD optimization
        ("h100_sxm", "trtllm", "1.3.0rc23", None),
    ],
)
def test_only_engines_whose_kernels_were_timed_take_the_public_factor(
    system, backend, version, public
):
    assert ssd_scan.engine(Kernels(system, backend, version)) == public


def prefill(overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return predict(compose(config_name="predict", overrides=overrides))


def test_sglangs_scan_is_flas_scan_at_the_factor_tagged_bounded_and_recorded():
    base = ["model=nemotron_h_8b", "hardware=h100_sxm", "prefill=[1024,8192]"]
    out = prefill([*base, "engine.backend=sglang"])
    assert out["breakdown_sources"]["ssm_scan"] == [INTERPOLATED, INTERPOLATED]
    lent = out["kernels"]["delta_rule_lent"][ssd_scan.LENT]
    assert lent.startswith("FLA's GDN chunked scan at equal state x 0.98")
    assert out["unmeasured"]["assumptions"]["ssm_scan"].startswith(
        "SSD chunked scan: FLA's GDN chunked scan"
    )
    roofline = prefill([*base, "engine.backend=sglang", "engine.kernels=roofline"])
    for scan, (low, high), model in zip(
        out["breakdown_ms"]["ssm_scan"],
        out["unmeasured"]["ops_ms"]["ssm_scan"],
        roofline["breakdown_ms"]["ssm_scan"],
        strict=True,
    ):
        # 3-23x the roofline of its traffic, as the public timings are
        assert 2.5 * model < scan and low < model
        assert high == pytest.approx(ssd_scan.SPREAD * scan)
    # vLLM 0.24's kernels have no public timing: the roofline, as before
    vllm = prefill(base)
    assert vllm["breakdown_sources"]["ssm_scan"] == [ROOFLINE, ROOFLINE]
    assert ssd_scan.LENT not in vllm["kernels"].get("delta_rule_lent", {})


def test_the_public_sglang_timing_is_what_the_model_of_its_config_predicts(tmp_path):
    # Falcon-H1-1.5B-Instruct, four prompts of 4,000 tokens in one prefill on one H200: the
    # three SSD kernels profiled took 6.2 ms a layer; simlab's scan holds them, the conv
    # (and the two kernels the profile's sum leaves out) on top, within the range
    config = tmp_path / "config.json"
    config.write_text(json.dumps(FALCON_H1_1_5B))
    out = prefill(
        [
            "model=hf",
            f"model.config={config}",
            "model.id=tiiuae/Falcon-H1-1.5B-Instruct",
            "hardware=h200",
            "engine.backend=sglang",
            "engine.token_budget=16384",
            "batch=4",
            "prefill=[4000]",
        ]
    )
    ((scan,),) = [out["breakdown_ms"]["ssm_scan"]]
    ((low, high),) = out["unmeasured"]["ops_ms"]["ssm_scan"]
    per_layer = scan / 24
    assert 6.2 <= per_layer < 6.2 * 1.1
    assert low < 148.8 < high
