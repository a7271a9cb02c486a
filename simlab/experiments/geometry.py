"""vLLM's hybrid geometry for every bundled hybrid ``config.json``: simlab's computation beside
vLLM's own (``tests/fixtures/crosscheck/geometry.json``, written by ``make crosscheck-geometry``
with vLLM 0.33.0's code on the CPU).

    python -m simlab.crosscheck geometry            # the table (markdown), exit 1 on a mismatch

simlab reads each config itself (:func:`layers`: the attention and recurrent layers' kinds,
counts and sizes, from the fields the engines read) and computes with
:mod:`simlab.cache.scoring` (the rules ``policies.production`` uses) what vLLM does: the recurrent state's dtype (vLLM's per-model default,
:data:`simlab.cache.scoring.VLLM_SSM_DTYPE`), its page (``kernel - 1`` conv columns plus the
recurrent state) and the attention block forced to hold it
(:func:`simlab.cache.scoring.vllm_block_size`), with the 64-token checkpoint alignment of
FlashInfer's GDN prefill on Hopper. The configs come from aiconfigurator-core (imported lazily;
without it the table says so in one line).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simlab.cache.scoring import (
    DTYPE_BYTES,
    SGLANG_CONV_DTYPE,
    SGLANG_SSM_DTYPE,
    VLLM_SSM_DTYPE,
    vllm_block_size,
)

log = logging.getLogger(__name__)

FIXTURE = (
    Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "crosscheck" / "geometry.json"
)
#: vLLM's prefill checkpoint alignment of FlashInfer's GDN kernel, its choice on Hopper
GDN_HOPPER_ALIGNMENT = 64
#: the values compared, simlab's against the fixture's
COMPARED = (
    "block_size",
    "block_size_hopper",
    "state_page_bytes",
    "state_bytes",
    "kv_bytes_per_token",
    "ssm_dtype",
    "sglang_state_bytes",
)


@dataclass(frozen=True)
class Layers:
    """What the geometry needs of a hybrid: per attention layer one token's KV bytes, per
    recurrent layer its state's elements (conv over ``kernel - 1`` steps, and recurrent)."""

    kind: str  # mamba2 | gdn | kda
    attention: int
    recurrent: int
    token_bytes: int
    conv_elems: int
    ssm_elems: int
    mla: bool = False


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The language model's config (a ``ForConditionalGeneration`` config keeps it inside)."""
    return dict(raw.get("text_config") or raw)


def layers(raw: dict[str, Any]) -> Layers | None:
    """A hybrid's layers from its config (None for a model without recurrent layers)."""
    text = text_config(raw)
    if "linear_attn_config" in text:
        return kda_layers(text)
    if text.get("model_type") == "nemotron_h":
        return mamba2_layers(text)
    kinds = text.get("layer_types") or []
    if "linear_attention" in kinds:
        return gdn_layers(text, kinds)
    return None


def gqa_token_bytes(text: dict[str, Any], head_dim: int) -> int:
    return 2 * text["num_key_value_heads"] * head_dim * 2  # K and V, BF16


def mamba2_layers(text: dict[str, Any]) -> Layers:
    """NemotronH: ``hybrid_override_pattern`` (``M`` Mamba2, ``*`` attention) or its
    ``layers_block_type`` list."""
    pattern = text.get("hybrid_override_pattern")
    kinds = list(pattern) if pattern else text["layers_block_type"]
    heads, head, state = text["mamba_num_heads"], text["mamba_head_dim"], text["ssm_state_size"]
    d_inner = heads * head
    conv = (d_inner + 2 * text["n_groups"] * state) * (text["conv_kernel"] - 1)
    head_dim = text.get("head_dim") or text["attention_head_dim"]
    return Layers(
        "mamba2",
        sum(k in ("*", "attention") for k in kinds),
        sum(k in ("M", "mamba") for k in kinds),
        gqa_token_bytes(text, head_dim),
        conv,
        d_inner * state,
    )


def gdn_layers(text: dict[str, Any], kinds: list[str]) -> Layers:
    """Qwen3-Next / Qwen3.5 / Qwen3.6: gated DeltaNet (``linear_attention``) and full
    attention layers."""
    k_heads, k_dim = text["linear_num_key_heads"], text["linear_key_head_dim"]
    v_heads, v_dim = text["linear_num_value_heads"], text["linear_value_head_dim"]
    conv = (2 * k_heads * k_dim + v_heads * v_dim) * (text["linear_conv_kernel_dim"] - 1)
    return Layers(
        "gdn",
        kinds.count("full_attention"),
        kinds.count("linear_attention"),
        gqa_token_bytes(text, text["head_dim"]),
        conv,
        v_heads * v_dim * k_dim,
    )


def kda_layers(text: dict[str, Any]) -> Layers:
    """Kimi Linear / K3: KDA layers (q, k and v short convolutions and a per-head recurrent
    state) and MLA layers (one latent and one RoPE key a token)."""
    linear = text["linear_attn_config"]
    heads, dim = linear["num_heads"], linear["head_dim"]
    conv = 3 * heads * dim * (linear["short_conv_kernel_size"] - 1)
    latent = (text["kv_lora_rank"] + text["qk_rope_head_dim"]) * 2
    return Layers(
        "kda",
        len(linear["full_attn_layers"]),
        len(linear["kda_layers"]),
        latent,
        conv,
        heads * dim * dim,
        mla=True,
    )


def vllm_ssm_dtype(raw: dict[str, Any], kind: str) -> str:
    """vLLM 0.33.0's recurrent state dtype for the config at its defaults: KDA always keeps it
    in float32 (``kda_state_dtype``); NemotronH the config's ``mamba_ssm_cache_dtype``, else
    float32; Qwen3.5 the config's ``mamba_ssm_dtype``; others the model's dtype."""
    text, arch = text_config(raw), raw.get("architectures", [""])[0]
    if kind == "kda":
        return "float32"
    for key in ("mamba_ssm_cache_dtype", "mamba_ssm_dtype"):
        if text.get(key) in DTYPE_BYTES:
            return str(text[key])
    return VLLM_SSM_DTYPE.get(arch, "bfloat16")


def sglang_ssm_dtype(raw: dict[str, Any]) -> str:
    """SGLang 0.5.23's SSM state dtype: the config's ``mamba_ssm_dtype`` (its text config's
    first), else float32 (``mamba2_state_dtype``)."""
    for config in (raw.get("text_config") or {}, raw):
        if config.get("mamba_ssm_dtype") in DTYPE_BYTES:
            return str(config["mamba_ssm_dtype"])
    return SGLANG_SSM_DTYPE


def simlab_geometry(raw: dict[str, Any]) -> dict[str, Any] | None:
    """simlab's values for the config (:data:`COMPARED`); None for a model it does not read."""
    found = layers(raw)
    if found is None:
        return None
    dtype = vllm_ssm_dtype(raw, found.kind)
    page = found.conv_elems * 2 + found.ssm_elems * DTYPE_BYTES[dtype]
    out = {
        "kind": found.kind,
        "ssm_dtype": dtype,
        "state_page_bytes": page,
        "state_bytes": page * found.recurrent,
        "kv_bytes_per_token": found.token_bytes * found.attention,
        "block_size": vllm_block_size(page, found.token_bytes, mla=found.mla),
    }
    sglang = found.conv_elems * DTYPE_BYTES[SGLANG_CONV_DTYPE]
    sglang += found.ssm_elems * DTYPE_BYTES[sglang_ssm_dtype(raw)]
    out["sglang_state_bytes"] = sglang * found.recurrent
    if found.kind == "gdn":
        hopper = vllm_block_size(page, found.token_bytes, alignment=GDN_HOPPER_ALIGNMENT)
        out["block_size_hopper"] = hopper
    return out


def bundled_configs() -> Path | None:
    """aiconfigurator-core's ``model_configs`` (None, with one log line, when it is missing)."""
    try:
        import aiconfigurator_core
    except ImportError:
        log.warning("aiconfigurator-core is not installed (Linux x86-64 only): no bundled configs")
        return None
    return Path(aiconfigurator_core.__file__).parent / "model_configs"


def rows(fixture: Path = FIXTURE) -> list[dict[str, Any]]:
    """Per hybrid of the fixture: vLLM's values, simlab's, and whether they agree."""
    configs = bundled_configs()
    out = []
    for engine in json.loads(fixture.read_text())["models"]:
        engine = engine | {"ssm_dtype": engine["state_dtypes"][-1]}
        path = None if configs is None else configs / engine["config"]
        ours = simlab_geometry(json.loads(path.read_text())) if path and path.exists() else None
        same = ours is not None and all(ours.get(k) == engine.get(k) for k in COMPARED)
        out.append({"config": engine["config"], "vllm": engine, "simlab": ours, "agree": same})
    return out


def table(found: list[dict[str, Any]]) -> str:
    """The docs' table: one row per bundled hybrid, vLLM's numbers (simlab's where they
    differ, after a slash)."""
    head = (
        "| model | layers (attn + recurrent) | SSM dtype | state MB / request (vLLM, SGLang) | "
        "KV bytes / token | vLLM block | on Hopper | simlab |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for row in found:
        v, ours = row["vllm"], row["simlab"] or {}

        def cell(
            key: str, v: dict[str, Any] = v, ours: dict[str, Any] = ours, scale: float = 1
        ) -> str:
            value, mine = v.get(key, ""), ours.get(key)
            shown = f"{value / scale:.1f}" if scale != 1 and value != "" else f"{value}"
            return shown if mine is None or mine == value else f"{shown} / {mine}"

        name = row["config"].removesuffix("_config.json").replace("--", "/")
        layers_cell = f"{v['attention_layers']} + {v['recurrent_layers']}"
        state = f"{v['state_bytes'] / 1e6:.1f}, {cell('sglang_state_bytes', scale=1e6)}"
        verdict = "agrees" if row["agree"] else ("not read" if not ours else "differs")
        lines.append(
            f"| {name} | {layers_cell} | {cell('ssm_dtype')} | {state} | "
            f"{cell('kv_bytes_per_token')} | {cell('block_size')} | "
            f"{cell('block_size_hopper') or '='} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 1 when simlab disagrees with vLLM on a model."""
    logging.basicConfig(level=logging.WARNING)
    fixture = Path(argv[0]) if argv else FIXTURE
    found = rows(fixture)
    print(table(found))
    return 0 if all(r["agree"] for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
