"""model=hf: configs resolve without downloads, every bundled hybrid loads, its KV bytes per token
and state bytes per request equal vLLM's ``MambaStateShapeCalculator`` /
``MambaStateDtypeCalculator`` (re-stated below as the oracle), FLOPs stay additive for every
layer kind, and bad input gets one line naming the field and the file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simlab.config import ConfigError
from simlab.cost.layers import LayerOps
from simlab.cost.shapes import BatchShape
from simlab.cost.terms import CostTerms
from simlab.model.hf import ARCHITECTURES, bundled_ids, model_spec, spec_fields
from simlab.model.hf.resolve import read_config
from simlab.model.spec import ModelSpec
from simlab.run.plan import plan_run
from tests.fixtures import CONFIGS, ROOT, compose

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
HYBRIDS = [
    "Qwen/Qwen3.5-27B",
    "Qwen/Qwen3.5-35B-A3B",
    "Qwen/Qwen3.5-122B-A10B",
    "Qwen/Qwen3.5-397B-A17B",
    "nvidia/Qwen3.6-27B-NVFP4",
    "nvidia/Qwen3.6-35B-A3B-NVFP4",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8",
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16",
    "nvidia/Nemotron-H-56B-Base-8K",
    "moonshotai/Kimi-K3",
]
bundled = pytest.mark.skipif(not bundled_ids(), reason="aiconfigurator-core is not installed")


def fixture(stem: str, **overrides: Any) -> ModelSpec:
    return model_spec(f"fixture/{stem}", FIXTURES / f"{stem}.json", **overrides)


# ---------------------------------------------------------------- vLLM's state shapes (oracle)
def mamba2_state(H: int, P: int, G: int, N: int, K: int, ssm: int, conv: int = 2) -> int:
    """``mamba2_state_shape``: conv ``(K-1, H*P + 2*G*N)``, temporal ``(H, P, N)``."""
    return (K - 1) * (H * P + 2 * G * N) * conv + H * P * N * ssm


def gdn_state(kh: int, vh: int, dk: int, dv: int, K: int, ssm: int, conv: int = 2) -> int:
    """``gated_delta_net_state_shape``: conv ``(K-1, 2*dk*kh + dv*vh)``, temporal
    ``(vh, dv, dk)``."""
    return (K - 1) * (2 * dk * kh + dv * vh) * conv + vh * dv * dk * ssm


def kda_state(H: int, d: int, K: int, conv: int = 2) -> int:
    """``kda_state_shape``: conv ``(K-1, 3*H*d)``; recurrent ``(H, d, d)`` in FP32
    (``kda_state_dtype``)."""
    return (K - 1) * 3 * H * d * conv + H * d * d * 4


def mamba1_state(di: int, N: int, K: int, ssm: int = 2, conv: int = 2) -> int:
    """``mamba1_state_shape``: conv ``(K-1, d_inner)``, temporal ``(d_inner, N)``."""
    return (K - 1) * di * conv + di * N * ssm


# (id, KV bytes per token, state bytes per request): 2 bytes KV (bfloat16)
EXPECTED = {
    # 16 of 64 layers full attention, 4 KV heads x 256; GDN 16 key / 48 value heads of 128,
    # mamba_ssm_dtype float32
    "Qwen/Qwen3.5-27B": (16 * 2 * 4 * 256 * 2, 48 * gdn_state(16, 48, 128, 128, 4, ssm=4)),
    "Qwen/Qwen3.5-397B-A17B": (15 * 2 * 2 * 256 * 2, 45 * gdn_state(16, 64, 128, 128, 4, ssm=4)),
    # 6 attention (2 KV heads x 128), 23 Mamba2 (64 heads x 64, 8 groups, N 128), cache fp32
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (
        6 * 2 * 2 * 128 * 2,
        23 * mamba2_state(64, 64, 8, 128, 4, ssm=4),
    ),
    # 10 attention (8 KV heads x 128), 54 Mamba2 (256 heads x 64, 8 groups, N 256), bfloat16
    "nvidia/Nemotron-H-56B-Base-8K": (
        10 * 2 * 8 * 128 * 2,
        54 * mamba2_state(256, 64, 8, 256, 4, ssm=2),
    ),
    # 24 MLA layers (latent 512 + rope 64), 69 KDA layers (96 heads x 128)
    "moonshotai/Kimi-K3": (24 * (512 + 64) * 2, 69 * kda_state(96, 128, 4)),
    # 61 MLA layers
    "deepseek-ai/DeepSeek-V3": (61 * (512 + 64) * 2, 0),
    # 36 layers (18 sliding, window 128), 8 KV heads x 64
    "openai/gpt-oss-120b": (36 * 2 * 8 * 64 * 2, 0),
}


@bundled
@pytest.mark.parametrize("model_id", HYBRIDS)
def test_every_bundled_hybrid_loads(model_id: str) -> None:
    spec = model_spec(model_id)
    assert spec.is_hybrid and spec.n_attn_layers and spec.ssm_state_bytes > 0
    assert spec.source.endswith(f"{model_id.replace('/', '--')}_config.json")
    assert "recurrent state" in spec.state_dtypes


@bundled
@pytest.mark.parametrize("model_id", list(EXPECTED))
def test_kv_and_state_bytes_are_vllms(model_id: str) -> None:
    spec = model_spec(model_id)
    assert (spec.kv_bytes_per_token, spec.ssm_state_bytes) == EXPECTED[model_id]


@bundled
def test_layer_mix_and_parameters_of_known_models() -> None:
    qwen = model_spec("Qwen/Qwen3.5-397B-A17B")
    assert (qwen.ssm_kind, qwen.n_ssm_layers, qwen.n_attn_layers, qwen.n_moe_layers) == (
        "gdn",
        45,
        15,
        60,
    )
    assert qwen.attn_gate and qwen.moe_shared_intermediate == 1024
    assert round(qwen.total_params / 1e9) == 396  # "397B-A17B"
    assert round((qwen.active_layer_params + qwen.embedding_params) / 1e9) == 17
    ds = model_spec("deepseek-ai/DeepSeek-V3")
    assert (ds.attn_kind, ds.n_mlp_layers, ds.n_moe_layers) == ("mla", 3, 58)
    assert round(ds.total_params / 1e9) == 671
    oss = model_spec("openai/gpt-oss-120b")
    assert (oss.n_swa_layers, oss.swa_window, oss.n_attn_layers) == (18, 128, 36)


def test_fixture_architectures_load_with_vllms_states() -> None:
    jamba = fixture("jamba_1_5_mini")
    assert jamba.ssm_state_bytes == 28 * mamba1_state(8192, 16, 4)
    falcon = fixture("falcon_h1_7b")  # attention and Mamba2 in every layer
    assert (falcon.n_attn_layers, falcon.n_ssm_layers, falcon.n_mlp_layers) == (44, 44, 44)
    assert falcon.ssm_state_bytes == 44 * mamba2_state(24, 128, 1, 256, 4, ssm=2)
    granite = fixture("granite_4_0_h_small")
    assert (granite.n_attn_layers, granite.n_ssm_layers, granite.n_moe_layers) == (4, 36, 40)
    assert granite.moe_shared_intermediate == 1536
    assert round(granite.total_params / 1e9) == 32  # "granite-4.0-h-small: 32B total, 9B active"
    assert round((granite.active_layer_params + granite.embedding_params) / 1e9) == 9
    nxt = fixture("qwen3_next_80b_a3b")  # no mamba_ssm_dtype: the model dtype
    assert nxt.ssm_state_bytes == 36 * gdn_state(16, 32, 128, 128, 4, ssm=2)
    assert nxt.n_attn_layers == 12
    kimi = fixture("kimi_linear_48b_a3b")
    assert kimi.kv_bytes_per_token == 7 * (512 + 64) * 2
    assert kimi.ssm_state_bytes == 20 * kda_state(32, 128, 4)
    assert 45 < kimi.total_params / 1e9 < 52  # "48B-A3B"
    lfm2 = fixture("lfm2_1_2b")  # short_conv_state_shape: conv (conv_dim, L_cache - 1)
    assert (lfm2.ssm_kind, lfm2.n_ssm_layers, lfm2.n_attn_layers) == ("short_conv", 10, 6)
    assert lfm2.ssm_state_bytes == 10 * 2048 * (3 - 1) * 2
    assert lfm2.mlp_intermediate == 8192  # Lfm2MLP's auto-adjusted 2/3 of 12288
    assert round(lfm2.total_params / 1e8) == 12  # "1.2B"


@pytest.mark.parametrize("name", ["nemotron_h_8b", "jamba_1_5_mini"])
def test_hand_written_presets_are_the_config_path_with_the_full_conv_width(name: str) -> None:
    """The presets count the conv state over the whole kernel (the Marconi reference code);
    with that one setting the config path gives the same model, number for number."""
    preset = ModelSpec.from_config(json.loads(json.dumps(_yaml(name))))
    hf = fixture(name, ssm_conv_state_width=4, ssm_state_dtype_bytes=2, name=name)
    numbers = ("kv_bytes_per_token", "ssm_state_bytes", "layer_params", "active_layer_params")
    for attr in (*numbers, "embedding_params", "prefill_coefficients"):
        assert getattr(hf, attr) == getattr(preset, attr), attr
    assert fixture(name).ssm_state_bytes < preset.ssm_state_bytes  # vLLM keeps kernel - 1


def _yaml(name: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(CONFIGS / "model" / f"{name}.yaml"))  # type: ignore[return-value]


# ---------------------------------------------------------------- additivity, every kind
def _kinds() -> dict[str, ModelSpec]:
    paths = sorted(FIXTURES.glob("*.json"))
    specs = {p.stem: fixture(p.stem) for p in paths if not p.stem.startswith("unsupported")}
    base: dict[str, Any] = {"d_model": 1024, "n_attn_layers": 2, "n_ssm_layers": 6}
    base.update(n_heads=8, n_mlp_layers=8)
    specs["short_conv"] = ModelSpec(**base, ssm_kind="short_conv", ssm_expand=1)
    specs["swa_gated_latent_moe"] = ModelSpec(
        **{**base, "n_mlp_layers": 0},
        n_swa_layers=1,
        swa_window=64,
        attn_gate=True,
        n_moe_layers=8,
        moe_experts=16,
        moe_top_k=2,
        moe_intermediate=512,
        moe_shared_intermediate=256,
        moe_latent=256,
    )
    return specs


KINDS = _kinds()


@pytest.mark.parametrize("name", list(KINDS))
@settings(max_examples=50, deadline=None)
@given(prefix=st.integers(0, 200_000), new=st.integers(0, 200_000))
def test_prefill_flops_are_additive_for_every_kind(name: str, prefix: int, new: int) -> None:
    spec = KINDS[name]
    whole = spec.prefill_flops(0, prefix + new) - spec.prefill_flops(0, prefix)
    assert spec.prefill_flops(prefix, new) == pytest.approx(whole, rel=1e-9, abs=1.0)
    parts = (spec.attention_flops, spec.ssm_flops, spec.mlp_flops)
    total = sum(f(prefix, new) for f in parts)
    assert total == pytest.approx(spec.prefill_flops(prefix, new), rel=1e-12)


def test_a_sliding_window_layer_costs_its_window_not_its_prefix() -> None:
    swa = KINDS["swa_gated_latent_moe"]
    full = ModelSpec(**{**swa.config_fields(), "n_swa_layers": 0, "swa_window": 0})
    assert swa.attention_flops(0, 1000) < full.attention_flops(0, 1000)
    # one full layer grows with the prefix, the sliding one does not
    assert swa.attention_flops(10_000, 1) - swa.attention_flops(0, 1) == pytest.approx(
        (full.attention_flops(10_000, 1) - full.attention_flops(0, 1)) / 2
    )


# ---------------------------------------------------------------- resolution and bad input
def _write(tmp_path: Path, cfg: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def test_the_local_hugging_face_cache_is_read(tmp_path: Path, monkeypatch) -> None:
    snap = tmp_path / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    cfg = json.loads((FIXTURES / "nemotron_h_8b.json").read_text())
    _write(snap, cfg)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    spec = model_spec("acme/tiny")
    assert spec.source == str(snap / "config.json") and spec.n_ssm_layers == 24
    assert model_spec("acme/tiny", config=snap).source == spec.source  # a folder is fine


def test_text_config_of_a_conditional_generation_config_is_used(tmp_path: Path) -> None:
    text = json.loads((FIXTURES / "qwen3_next_80b_a3b.json").read_text())
    wrapped = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": text}
    wrapped["vision_config"] = {"hidden_size": 1}
    merged = read_config(_write(tmp_path, wrapped))
    assert merged["hidden_size"] == 2048
    assert merged["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert model_spec("x/y", tmp_path).d_model == 2048


def _one_line_error(tmp_path: Path, cfg: dict[str, Any]) -> str:
    path = _write(tmp_path, cfg)
    with pytest.raises(ValueError, match=re.escape(str(path))) as err:
        model_spec("x/y", path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    return message


def _nemotron(**changes: Any) -> dict[str, Any]:
    cfg = json.loads((FIXTURES / "nemotron_h_8b.json").read_text())
    cfg.update(changes)
    return {k: v for k, v in cfg.items() if v is not None}


def test_bad_configs_get_one_line_naming_the_field_and_the_file(tmp_path: Path) -> None:
    assert "'hidden_size' is missing" in _one_line_error(tmp_path, _nemotron(hidden_size=None))
    message = _one_line_error(tmp_path, _nemotron(hybrid_override_pattern="M-M*X"))
    assert "'hybrid_override_pattern'" in message and "'X'" in message
    message = _one_line_error(tmp_path, _nemotron(num_hidden_layers=50))
    assert "'hybrid_override_pattern' has 52 layers but num_hidden_layers is 50" in message
    qwen = json.loads((FIXTURES / "qwen3_next_80b_a3b.json").read_text())
    message = _one_line_error(tmp_path, {**qwen, "layer_types": ["linear_attention", "mystery"]})
    assert "'layer_types'" in message and "mystery" in message
    message = _one_line_error(tmp_path, _nemotron(mamba_head_dim="64"))
    assert "'mamba_head_dim' must be an integer" in message


def test_an_unsupported_architecture_names_it_and_the_supported_ones(tmp_path: Path) -> None:
    message = _one_line_error(tmp_path, _nemotron(architectures=["GPT2LMHeadModel"]))
    assert "'GPT2LMHeadModel' is not supported" in message
    assert all(name in message for name in ARCHITECTURES)


def test_a_missing_config_lists_the_three_places(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match=r"no config\.json found") as err:
        spec_fields("nobody/nothing-1B")
    message = str(err.value)
    assert "\n" not in message
    for place in ("model.config", str(tmp_path), "aiconfigurator-core"):
        assert place in message
    with pytest.raises(ValueError, match=r"model\.config: no such file"):
        spec_fields("x/y", tmp_path / "absent.json")


@bundled
def test_model_hf_composes_plans_and_records_what_it_resolved() -> None:
    plan = plan_run(compose(["model=qwen3_5_27b", "+policy=vllm", "engine=replay", "report=false"]))
    assert plan.model.name == "Qwen/Qwen3.5-27B" and plan.model.ssm_kind == "gdn"
    resolved = plan.config["model_resolved"]
    assert resolved["source"] == plan.model.source and resolved["ssm_state_dtype_bytes"] == 4
    plan = plan_run(
        compose(
            [
                "model=hf",
                "model.id=Qwen/Qwen3.5-27B",
                "+model.ssm_state_dtype_bytes=2",
                "engine=replay",
            ]
        )
    )
    assert plan.model.ssm_state_dtype_bytes == 2  # any ModelSpec field overrides the config's
    with pytest.raises(ConfigError, match="'GPT2LMHeadModel' is not supported"):
        plan_run(compose(["model=hf", "model.id=x/y", f"model.config={_gpt2()}"]))


def _gpt2() -> Path:
    return FIXTURES / "unsupported_gpt2.json"


def test_model_id_must_name_org_and_model() -> None:
    with pytest.raises(ValueError, match=r"model\.id must be"):
        ModelSpec.from_config({"id": "just-a-name", "config": None})


@bundled
def test_python_m_simlab_runs_a_bundled_hybrid_end_to_end(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["model=hf", "model.id=Qwen/Qwen3.5-27B", "trace=swebench", "trace.limit=3"]
    args += ["+policy=vllm", "engine=replay", "cache.size_gb=60", "hardware=h200"]
    args += ["report=false", f"hydra.run.dir={run}"]
    proc = subprocess.run(
        [sys.executable, "-m", "simlab", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert list(summary["policies"]) == ["vllm"]
    assert summary["config"]["model_resolved"]["ssm_kind"] == "gdn"


@pytest.mark.parametrize("name", list(KINDS))
def test_the_cost_models_ops_count_the_specs_flops(name: str) -> None:
    """Differential: the roofline's per-op FLOPs of one prefill chunk (no norms, no LM head)
    sum to the spec's (past a sliding window, where both count ``window`` keys per query)."""
    spec = KINDS[name]
    layers = LayerOps(spec, 1, CostTerms())
    prefix, new = 3000, 700
    batch = BatchShape(prefill=[(prefix, new)])
    ops = [*layers.attention_proj(new), *layers.attention(batch), *layers.ssm_proj(new)]
    ops += [*layers.ssm(batch), *layers.mlp_and_norms(new)]
    flops = sum(op.flops for op in ops if op.name != "norms_residuals")
    assert flops == pytest.approx(spec.prefill_flops(prefix, new), rel=1e-12)
