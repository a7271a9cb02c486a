"""ModelSpec: published byte figures, closed-form FLOPs, additivity, presets and validation."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf

from simlab.model.spec import ModelSpec

PRESET_DIR = Path(__file__).resolve().parents[1] / "configs" / "model"
PRESETS = ("marconi_7b", "llama3_8b", "nemotron_h_8b", "jamba_1_5_mini")


def load_yaml(name: str) -> DictConfig:
    cfg = OmegaConf.load(PRESET_DIR / f"{name}.yaml")
    assert isinstance(cfg, DictConfig)
    return cfg


def load(name: str) -> ModelSpec:
    return ModelSpec.from_config(load_yaml(name))


SPECS = {name: load(name) for name in PRESETS}
D, N = 4096, 128


# ---------------------------------------------------------------- the paper's memory figures
def paper_transformer(layers: int = 32) -> ModelSpec:
    return ModelSpec(
        name="paper_transformer",
        d_model=D,
        n_attn_layers=layers,
        n_ssm_layers=0,
        n_mlp_layers=layers,
        n_heads=32,
        flop_formula="paper",
    )


def test_marconi_7b_10k_sequence_checkpointed_every_16_tokens_is_17_4_gb() -> None:
    spec = SPECS["marconi_7b"]
    checkpoints = math.ceil(10_000 / 16)
    assert checkpoints == 625
    total = spec.cache_bytes(10_000, checkpoints)
    assert total == 24 * 625 * spec.ssm_state_bytes_per_layer + 4 * 10_000 * 2 * D * 2
    assert round(total / 1e9, 1) == 17.4


def test_hybrid_needs_3_3x_the_memory_of_a_same_size_transformer() -> None:
    hybrid = SPECS["marconi_7b"].cache_bytes(10_000, 625)
    transformer = paper_transformer().cache_bytes(10_000)
    assert round(transformer / 1e9, 2) == 5.24
    assert round(hybrid / transformer, 1) == 3.3


def test_paper_state_sizes_follow_the_reference_code() -> None:
    spec = SPECS["marconi_7b"]
    assert spec.kv_bytes_per_token_per_layer == 2 * D * 2
    # get_mamba_state_size: d*n*2 + (expand*d + 2n) * conv_kernel * 2
    assert spec.ssm_state_bytes_per_layer == D * N * 2 + (2 * D + 2 * N) * 4 * 2
    assert spec.ssm_state_channels == D
    assert spec.ssm_conv_channels == 2 * D + 2 * N


# ---------------------------------------------------------------- closed forms
@pytest.mark.parametrize("length", [1, 16, 1000, 10_000, 131_072])
def test_paper_formulas_equal_the_closed_forms_at_prefix_0(length: int) -> None:
    spec, L = SPECS["marconi_7b"], length
    attn = 8 * L * D**2 + 4 * L**2 * D
    mlp = 16 * L * D**2
    ssm = 12 * L * D**2 + 16 * L * D * N + 10 * L * D
    assert spec.attention_flops(0, L) == pytest.approx(4 * attn, rel=1e-12)
    assert spec.mlp_flops(0, L) == pytest.approx(28 * mlp, rel=1e-12)
    assert spec.ssm_flops(0, L) == pytest.approx(24 * ssm, rel=1e-12)
    assert spec.prefill_flops(0, L) == pytest.approx(4 * attn + 28 * mlp + 24 * ssm, rel=1e-12)


def test_paper_cost_after_a_prefix_is_the_saving_relative_to_the_parent() -> None:
    spec = SPECS["marconi_7b"]

    def layer_attn(L: int) -> int:
        return 8 * L * D**2 + 4 * L**2 * D

    assert spec.attention_flops(3000, 500) == pytest.approx(
        4 * (layer_attn(3500) - layer_attn(3000)), rel=1e-12
    )


def brute_force_attention(spec: ModelSpec, prefix: int, new: int) -> int:
    qdim, kvdim = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    total = 0
    for i in range(1, new + 1):
        keys = prefix + i  # causal: the token attends to every earlier token and itself
        proj = 2 * spec.d_model * (qdim + 2 * kvdim) + 2 * qdim * spec.d_model
        scores = 2 * spec.head_dim * keys * spec.n_heads
        av = 2 * spec.head_dim * keys * spec.n_heads
        total += proj + scores + av
    return total * spec.n_attn_layers


@pytest.mark.parametrize("name", ["llama3_8b", "nemotron_h_8b", "jamba_1_5_mini"])
@pytest.mark.parametrize(("prefix", "new"), [(0, 1), (0, 7), (0, 300), (123, 45)])
def test_exact_attention_equals_a_brute_force_sum(name: str, prefix: int, new: int) -> None:
    spec = SPECS[name]
    assert spec.attention_flops(prefix, new) == pytest.approx(
        brute_force_attention(spec, prefix, new), rel=1e-12
    )


def test_exact_counts_reduce_to_the_paper_ones_for_an_mha_non_gated_model() -> None:
    mha = dataclasses.replace(paper_transformer(), flop_formula="exact")
    paper = paper_transformer()
    # projections 8 L D^2 and MLP 16 L D^2 agree; scores are causal (about half of 4 L^2 D)
    assert mha.mlp_flops(0, 1000) == paper.mlp_flops(0, 1000)
    proj = 8 * 1000 * D**2 * 32
    assert mha.attention_flops(0, 1000) - proj == pytest.approx(
        (paper.attention_flops(0, 1000) - proj) / 2, rel=2e-3
    )


def test_exact_llama3_8b_per_token_flops_are_twice_the_non_embedding_params() -> None:
    spec = SPECS["llama3_8b"]
    # at prefix 0 and one token, attention adds only 4 * qdim per layer over 2 * params
    per_token = spec.prefill_flops(0, 1)
    norms = 65 * spec.d_model
    assert per_token == 2 * (spec.layer_params - norms) + 4 * 4096 * 32


def test_ssm_and_mlp_flops_do_not_depend_on_the_prefix() -> None:
    for spec in SPECS.values():
        assert spec.ssm_flops(0, 100) == spec.ssm_flops(50_000, 100)
        assert spec.mlp_flops(0, 100) == spec.mlp_flops(50_000, 100)


def test_components_sum_to_prefill_and_decode_is_one_token() -> None:
    for spec in SPECS.values():
        p, q = 777, 333
        parts = spec.attention_flops(p, q) + spec.ssm_flops(p, q) + spec.mlp_flops(p, q)
        assert spec.prefill_flops(p, q) == pytest.approx(parts, rel=1e-12)
        assert spec.decode_flops(p) == pytest.approx(spec.prefill_flops(p, 1), rel=1e-12)
        assert spec.prefill_flops(p, 0) == 0


# ---------------------------------------------------------------- additivity (both formulas)
@pytest.mark.parametrize("name", PRESETS)
@given(prefix=st.integers(0, 200_000), new=st.integers(0, 200_000))
def test_prefill_flops_are_additive(name: str, prefix: int, new: int) -> None:
    spec = SPECS[name]
    whole = spec.prefill_flops(0, prefix + new) - spec.prefill_flops(0, prefix)
    assert spec.prefill_flops(prefix, new) == pytest.approx(whole, rel=1e-9, abs=1.0)


@given(cuts=st.lists(st.integers(1, 5000), min_size=1, max_size=8))
def test_chunked_prefill_costs_the_same_as_one_pass(cuts: list[int]) -> None:
    for spec in SPECS.values():
        done, chunked = 0, 0.0
        for c in cuts:
            chunked += spec.prefill_flops(done, c)
            done += c
        assert chunked == pytest.approx(spec.prefill_flops(0, done), rel=1e-9)


def test_array_version_matches_the_scalar_one() -> None:
    prefix = np.array([0, 10, 1000, 65_536])
    new = np.array([1, 500, 0, 4096])
    for spec in SPECS.values():
        got = spec.prefill_flops_array(prefix, new)
        want = [spec.prefill_flops(int(p), int(q)) for p, q in zip(prefix, new, strict=True)]
        np.testing.assert_allclose(got, want, rtol=1e-12)


# ---------------------------------------------------------------- GQA and bytes
@pytest.mark.parametrize(("kv_heads", "fraction"), [(32, 1.0), (16, 0.5), (8, 0.25), (1, 1 / 32)])
def test_gqa_shrinks_kv_bytes(kv_heads: int, fraction: float) -> None:
    mha = dataclasses.replace(SPECS["llama3_8b"], n_kv_heads=32)
    gqa = dataclasses.replace(SPECS["llama3_8b"], n_kv_heads=kv_heads)
    assert gqa.kv_bytes_per_token == mha.kv_bytes_per_token * fraction
    assert gqa.kv_bytes_per_token == 2 * kv_heads * 128 * 2 * 32


def test_preset_byte_sizes() -> None:
    assert SPECS["llama3_8b"].kv_bytes_per_token == 128 * 1024  # 128 KiB/token, well known
    assert SPECS["llama3_8b"].ssm_state_bytes == 0
    nemo = SPECS["nemotron_h_8b"]
    assert nemo.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2
    # mamba2: nheads*headdim*N*2 + (d_inner + 2*G*N) * conv * 2, 24 layers
    assert nemo.ssm_state_bytes == 24 * (128 * 64 * 128 * 2 + (8192 + 2 * 8 * 128) * 4 * 2)
    jamba = SPECS["jamba_1_5_mini"]
    assert jamba.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2
    # mamba1: d_inner * N + d_inner * conv, 28 layers
    assert jamba.ssm_state_bytes == 28 * (8192 * 16 + 8192 * 4) * 2


def test_hybrid_state_sizes_are_in_the_published_ballpark() -> None:
    # Nemotron-H-8B: tens of MB per sequence (~50 MB in BF16); Jamba's d_state 16: a few MB.
    assert 20e6 < SPECS["nemotron_h_8b"].ssm_state_bytes < 100e6
    assert 2e6 < SPECS["jamba_1_5_mini"].ssm_state_bytes < 20e6
    # one SSM checkpoint is worth thousands of tokens of KV for these hybrids
    nemo = SPECS["nemotron_h_8b"]
    assert 1000 < nemo.ssm_state_bytes / nemo.kv_bytes_per_token < 10_000
    fp32 = dataclasses.replace(nemo, ssm_state_dtype_bytes=4)
    assert fp32.ssm_state_bytes > 1.9 * nemo.ssm_state_bytes


def test_preset_parameter_counts_match_the_published_sizes() -> None:
    assert SPECS["llama3_8b"].total_params == 8_030_261_248  # Meta-Llama-3-8B, exact
    assert 7.8e9 < SPECS["nemotron_h_8b"].total_params < 8.4e9  # "8B"
    jamba = SPECS["jamba_1_5_mini"]
    assert 51e9 < jamba.total_params < 52.5e9  # "52B total"
    assert 11.5e9 < jamba.active_layer_params + jamba.embedding_params < 12.5e9  # "12B active"


# ---------------------------------------------------------------- presets and validation
@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_from_yaml(name: str) -> None:
    raw = load_yaml(name)
    assert (PRESET_DIR / f"{name}.yaml").read_text().startswith("# @package model")
    spec = ModelSpec.from_config(raw)
    assert spec.name == name
    assert spec.prefill_flops(0, 1024) > 0


def test_preset_layer_compositions() -> None:
    def layers(s: ModelSpec) -> tuple[int, int, int, int]:
        return (s.n_attn_layers, s.n_ssm_layers, s.n_mlp_layers, s.n_moe_layers)

    assert layers(SPECS["marconi_7b"]) == (4, 24, 28, 0)
    assert layers(SPECS["llama3_8b"]) == (32, 0, 32, 0)
    assert layers(SPECS["nemotron_h_8b"]) == (4, 24, 24, 0)
    assert layers(SPECS["jamba_1_5_mini"]) == (4, 28, 16, 16)
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"  # Nemotron-H-8B
    assert (pattern.count("*"), pattern.count("M"), pattern.count("-")) == (4, 24, 24)
    jamba = [("attn" if i % 8 == 4 else "ssm", "moe" if i % 2 == 1 else "mlp") for i in range(32)]
    assert sum(a == "attn" for a, _ in jamba) == 4
    assert sum(m == "moe" for _, m in jamba) == 16
    assert SPECS["marconi_7b"].is_hybrid and not SPECS["marconi_7b"].is_transformer
    assert SPECS["llama3_8b"].is_transformer and not SPECS["llama3_8b"].is_hybrid


def test_spec_is_frozen_and_ignores_underscore_keys() -> None:
    spec = SPECS["llama3_8b"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.d_model = 1  # type: ignore[misc]
    cfg = {"_target_": "simlab.model.spec.ModelSpec.from_config", "d_model": 64, "n_attn_layers": 1}
    assert ModelSpec.from_config({**cfg, "n_ssm_layers": 0, "n_heads": 4}).head_dim == 16


def plain(name: str) -> dict[str, Any]:
    return {str(k): v for k, v in load_yaml(name).items()}


BASE = plain("nemotron_h_8b")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("d_model", 0),
        ("d_model", -4096),
        ("d_model", 4096.5),
        ("d_model", "4096"),
        ("n_attn_layers", -1),
        ("n_ssm_layers", -2),
        ("n_mlp_layers", -1),
        ("flop_formula", "chinchilla"),
        ("ssm_kind", "mamba3"),
        ("n_kv_heads", 5),
        ("n_heads", 0),
        ("ssm_state_dim", 0),
        ("ssm_n_heads", 100),
        ("ssm_n_groups", 3),
        ("dtype_bytes", 0),
        ("ssm_state_dtype_bytes", -4),
        ("mlp_gated", "yes"),
        ("vocab_size", -1),
    ],
)
def test_from_config_rejects_bad_values_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        ModelSpec.from_config({**BASE, field: value})


def test_from_config_rejects_structural_mistakes() -> None:
    with pytest.raises(ValueError, match="n_attn_layers"):
        ModelSpec.from_config({**BASE, "n_attn_layers": 0, "n_ssm_layers": 0})
    with pytest.raises(ValueError, match="d_modle"):
        ModelSpec.from_config({**BASE, "d_modle": 4096})
    with pytest.raises(ValueError, match="n_ssm_layers"):
        ModelSpec.from_config({k: v for k, v in BASE.items() if k != "n_ssm_layers"})
    with pytest.raises(ValueError, match="moe_top_k"):
        ModelSpec.from_config({**BASE, "n_moe_layers": 2, "moe_experts": 4, "moe_top_k": 8})
    with pytest.raises(ValueError, match="kv_bytes_per_token"):  # derived, not a config field
        ModelSpec.from_config({**BASE, "kv_bytes_per_token": 1})
    # the paper formulas assume MHA and a non-gated 4D MLP
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelSpec.from_config({**BASE, "flop_formula": "paper"})
    marconi = plain("marconi_7b")
    with pytest.raises(ValueError, match="mlp_intermediate"):
        ModelSpec.from_config({**marconi, "mlp_intermediate": 14336})
