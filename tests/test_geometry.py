"""The engines' hybrid geometry: simlab's computation against vLLM 0.33.0's own
(``tests/fixtures/crosscheck/geometry.json``, ``make crosscheck-geometry``), the engine defaults
the production policies take, and what ``summary.json`` says of them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from policies.production import VLLM, SGLang
from simlab.cache.engine_rules import vllm_block_size
from simlab.cache.state_pool import StatePool
from simlab.config import ConfigError
from simlab.experiments import geometry
from simlab.experiments.crosscheck import overrides_for
from simlab.model.hf import model_spec
from simlab.run.simulate import plan_run
from tests.fixtures import compose, model

FIXTURE = json.loads(geometry.FIXTURE.read_text())
NEMOTRON = model("nemotron_h_8b")


ADMISSIONS = geometry.admissions()


@pytest.mark.parametrize("engine", FIXTURE["models"], ids=lambda m: m["config"])
def test_simlab_computes_vllms_geometry_for_every_bundled_hybrid(engine):
    """``model=hf`` reads the config and the policies' hooks give vLLM's numbers (and
    SGLang's state bytes) exactly."""
    try:
        spec = model_spec(geometry.model_id(engine["config"]))
    except ValueError:
        pytest.skip("aiconfigurator-core is not installed")
    ours = geometry.simlab_geometry(spec, *ADMISSIONS)
    assert ours["ssm_dtype"] == engine["state_dtypes"][-1]
    keys = (
        "block_size",
        "block_size_hopper",
        "state_page_bytes",
        "state_bytes",
        "sglang_state_bytes",
    )
    for key in keys:
        assert ours.get(key) == engine.get(key), key
    assert ours["kv_bytes_per_token"] == engine["kv_bytes_per_token"]


def test_the_fixture_has_every_hybrid_family_and_the_reported_blocks():
    """Qwen3.6-27B gets 784-token blocks (vllm #36010, #47430); every family is there."""
    blocks = {m["config"]: m["block_size"] for m in FIXTURE["models"]}
    assert blocks["nvidia--Qwen3.6-27B-NVFP4_config.json"] == 784
    kinds = {m["model_type"] for m in FIXTURE["models"]}
    assert {"nemotron_h", "qwen3_5_text", "qwen3_5_moe_text", "kimi_linear"} <= kinds
    assert not FIXTURE["skipped"]


def test_the_block_rule():
    """Multiples of 16 (128 for MLA, 64-aligned for GDN on Hopper), never below the minimum."""
    assert vllm_block_size(3_207_168, 4096) == 784
    assert vllm_block_size(3_207_168, 4096, alignment=64) == 832
    assert vllm_block_size(6_512_640, 1152, mla=True) == 5760
    assert vllm_block_size(100, 4096, minimum=64) == 64


@pytest.mark.parametrize(
    ("hardware", "block", "kernel"),
    [("a100_80gb", 784, "triton"), ("h100_sxm", 832, "flashinfer"), ("b60", 784, "triton")],
)
def test_the_runs_gpu_picks_a_gdn_models_block(hardware, block, kernel):
    """vLLM prefills GDN layers with FlashInfer on Hopper, whose 64-token checkpoint alignment
    raises Qwen3.5-27B's block from 784 to 832 tokens; ``hardware`` decides, and
    ``engine_geometry`` says so (the B60 is no CUDA GPU: Triton)."""
    from simlab.run.policy import build_policy

    pytest.importorskip("aiconfigurator_core")
    overrides = ["+policy=vllm", "model=qwen3_5_27b", f"hardware={hardware}"]
    plan = plan_run(compose([*overrides, "engine.memory_check=false"]))
    admission, _ = build_policy(plan.policies["vllm"])
    engine = admission.engine_model(plan.model)
    geo = admission.for_model(engine).geometry(engine, 1, None)
    assert (geo["block_size"], geo["gdn_prefill_backend"]) == (block, kernel)
    assert admission.geometry(engine, 1, None)["defaults"]["gdn_prefill_backend"].startswith(kernel)


def test_a_mamba2_model_keeps_its_block_on_hopper():
    """FlashInfer's alignment is GDN's: Nemotron-H-8B's block is 1,040 tokens on any GPU."""
    for capability in (None, 8.0, 9.0, 10.0):
        engine = VLLM(compute_capability=capability).engine_model(NEMOTRON)
        geo = VLLM(compute_capability=capability).for_model(engine).geometry(engine, 1, None)
        assert geo["block_size"] == 1040
        assert "gdn_prefill_backend" not in geo


@pytest.mark.parametrize(
    ("policy", "name", "dtype", "block"),
    [
        (VLLM(), "nemotron_h_8b", "float32", 1040),  # NemotronHForCausalLMConfig
        (VLLM(mamba_ssm_cache_dtype="bfloat16"), "nemotron_h_8b", "bfloat16", 528),
        (VLLM(), "jamba_1_5_mini", "bfloat16", None),  # auto: the model's dtype
        (VLLM(), "marconi_7b", "bfloat16", None),
        (SGLang(), "nemotron_h_8b", "float32", None),  # mamba2_state_dtype's default
        (SGLang(mamba_ssm_dtype="bfloat16"), "nemotron_h_8b", "bfloat16", None),
    ],
)
def test_engine_defaults_set_the_state_dtype(policy, name, dtype, block):
    spec = model(name)
    engine = policy.engine_model(spec)
    assert engine.ssm_state_dtype_bytes == {"float32": 4, "bfloat16": 2}[dtype]
    geo = policy.for_model(engine).geometry(engine, 1, None)
    assert geo["ssm_state_dtype"] == dtype
    assert geo["state_bytes"] < engine.ssm_state_bytes  # kernel - 1 conv columns
    if block is not None:
        assert geo["block_size"] == block
        assert geo["attention_page_bytes"] >= geo["state_page_bytes"]


def test_a_transformer_keeps_its_model():
    llama = model("llama3_8b")
    assert VLLM().engine_model(llama) is llama
    assert VLLM().geometry(llama, 1, None) == {
        "engine": "vllm 0.33.0",
        "block_size": 16,
        "state_bytes": 0,
    }


def test_a_bad_dtype_names_the_key():
    with pytest.raises(ConfigError, match=r"policy\.mamba_ssm_cache_dtype"):
        plan_run(compose(["+policy=vllm", "policy.mamba_ssm_cache_dtype=fp8"]))
    with pytest.raises(ConfigError, match=r"policy\.mamba_ssm_dtype"):
        plan_run(compose(["+policy=sglang", "policy.mamba_ssm_dtype=int8"]))


def test_sglang_geometry_names_its_pool():
    engine = SGLang().engine_model(NEMOTRON)
    pool = StatePool.given(3e9, 1e9, engine.ssm_state_bytes)
    geo = SGLang().geometry(engine, 1, pool)
    assert geo["mamba_pool"] == {
        "shared_with_kv": False,
        "source": "cache.ssm_gb",
        "ssm_gb": 1.0,
        "kv_gb": 3.0,
        "slots": math.floor(1e9 / engine.ssm_state_bytes),
    }
    assert SGLang().geometry(engine, 1, None)["mamba_pool"] == {"shared_with_kv": True}
    assert geo["defaults"]["mamba_ssm_dtype"].startswith("float32")


def test_crosscheck_cases_run_at_the_fixtures_dtype():
    """The fixtures were driven with a BF16 state: the reader pins it for the faithful
    policies, whose own default is now the engine's."""
    case = {"engine": "vllm", "overrides": [], "size_gb": 1, "ssm_dtype": "bfloat16"}
    assert "policy.mamba_ssm_cache_dtype=bfloat16" in overrides_for(case)
    sglang = {"engine": "sglang", "overrides": [], "size_gb": 1}
    assert "policy.mamba_ssm_dtype=bfloat16" in overrides_for(sglang)
    assert not any("dtype" in o for o in overrides_for(sglang, policy="sglang_plus"))


def test_summary_states_the_geometry_and_the_defaults(tmp_path):
    from simlab.run.simulate import simulate

    overrides = ["+policy=vllm", "model=nemotron_h_8b", "engine=replay", "trace.limit=4"]
    simulate(compose([*overrides, "bounds.enabled=false", f"output_dir={tmp_path}"]))
    written = json.loads((tmp_path / "summary.json").read_text())["policies"]["vllm"]
    assert written["engine_geometry"]["block_size"] == 1040
    assert written["engine_geometry"]["state_bytes"] == 24 * 4_255_744
    assert written["engine_defaults"] == {
        "mamba_ssm_cache_dtype": "float32 (vLLM 0.33.0's default for NemotronHForCausalLM)"
    }


def test_the_study_page_ranks_points_by_hit_rate():
    """The report's Engine geometry page: one bar per point, best first, labelled with the
    geometry the engine took."""
    import pandas as pd

    from simlab.report.geometry_pages import geometry_note, study_rows
    from simlab.report.load import SweepResults

    geo = [
        {"block_size": b, "mamba_cache_mode": "align", "ssm_state_dtype": "float32"}
        for b in (1040, 4096)
    ]
    points = pd.DataFrame(
        {
            "policy": ["vllm", "vllm"],
            "policy.block_size": [16, 4096],
            "token_hit_rate": [0.9, 0.67],
            "ttft_p50": [0.1, 0.3],
            "ttft_p95": [0.2, 1.3],
            "engine_geometry": [json.dumps(g) for g in geo],
        }
    )
    sweep = SweepResults(Path("."), points, ["policy.block_size"], {0: Path("."), 1: Path(".")})
    rows = study_rows(sweep)
    assert list(rows["hit"]) == [67.0, 90.0]  # barh draws the last row on top
    assert rows["label"].iloc[-1] == "vllm: block_size=16 [block 1040, align, SSM float32]"
    assert geometry_note(None) == ""


def test_the_match_unit_and_the_shared_prefix_checkpoint(tmp_path):
    """vLLM 0.33.0 has both: ``prefix_match_unit`` equal to the block is its default, another
    grid is refused as not modelled (the error names the key and the block); the shared-prefix
    checkpoint acts only with EAGLE, so it changes no hit and the summary says so."""
    from simlab.run.simulate import simulate

    base = ["+policy=vllm", "model=nemotron_h_8b", "engine=replay", "trace.limit=4"]
    with pytest.raises(ConfigError, match=r"policy\.prefix_match_unit \(32\).*1040"):
        simulate(compose([*base, "policy.prefix_match_unit=32", f"output_dir={tmp_path}/a"]))
    hits = {}
    for flag, unit in (("false", "null"), ("true", "1040")):
        out = tmp_path / flag
        overrides = [
            f"policy.enable_mamba_shared_prefix_checkpoint={flag}",
            f"policy.prefix_match_unit={unit}",
        ]
        simulate(compose([*base, *overrides, "bounds.enabled=false", f"output_dir={out}"]))
        written = json.loads((out / "summary.json").read_text())["policies"]["vllm"]
        hits[flag] = written["token_hit_rate"]
        geo = written["engine_geometry"]
        assert geo["enable_mamba_shared_prefix_checkpoint"] is (flag == "true")
        assert geo["prefix_match_unit"] == (None if unit == "null" else 1040)
        assert geo["prefix_cache_retention_interval"] == 0
    assert hits["true"] == hits["false"]
    assert "EAGLE" in " ".join(written["caveats"])


def test_the_prefix_tree_says_it_keeps_no_periodic_state():
    """The retention interval is modelled in vLLM's pool; a step the prefix tree runs says
    it keeps the semantic states alone."""
    from policies.engine_lru import BlockLRU
    from simlab.engines.step import RequestStep

    assert not VLLM().tree_caveats(True)
    assert not VLLM(prefix_cache_retention_interval=None).tree_caveats(False)
    admission = VLLM(block_pool=False, prefix_cache_retention_interval=1040)
    engine = admission.engine_model(NEMOTRON)
    step = RequestStep.build(engine, math.inf, admission, BlockLRU(), "vllm")
    assert not step.pool
    assert admission.tree_caveats(True)[0] in step.summary()["caveats"]
