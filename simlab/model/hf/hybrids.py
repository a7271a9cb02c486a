"""Parsers of hybrid architectures: attention mixed with Mamba1, Mamba2, GDN or KDA layers."""

from __future__ import annotations

import math

from simlab.model.hf.common import Spec, gqa, layer_counts, mla, moe, recurrent, trunk
from simlab.model.hf.fields import Fields
from simlab.model.hf.transformers import ffn_kinds


def _mamba2(f: Fields, spec: Spec, prefix: str = "mamba_") -> Spec:
    shapes = {
        "ssm_expand": 0,  # d_inner = heads x head dim
        "ssm_n_heads": f.first(f"{prefix}num_heads", f"{prefix}n_heads"),
        "ssm_head_dim": f.first(f"{prefix}head_dim", f"{prefix}d_head"),
        "ssm_n_groups": f.first("n_groups", f"{prefix}n_groups", default=1),
        "ssm_state_dim": f.first("ssm_state_size", f"{prefix}d_state"),
        "ssm_conv_kernel": f.first("conv_kernel", f"{prefix}d_conv"),
    }
    return recurrent(f, spec, "mamba2", shapes)


def nemotron_h(f: Fields) -> Spec:
    """Nemotron-H and Nemotron-3: Mamba2 (``M``), attention (``*``), squared-ReLU MLP (``-``)
    and MoE with shared experts (``E``), by ``hybrid_override_pattern`` or
    ``layers_block_type``."""
    letters = {"M": "ssm", "*": "attn", "-": "mlp", "E": "moe"}
    names = {"mamba": "ssm", "attention": "attn", "mlp": "mlp", "moe": "moe"}
    layers = f.integer("num_hidden_layers") if f.has("num_hidden_layers") else None
    if f.has("hybrid_override_pattern"):
        kinds = f.pattern("hybrid_override_pattern", letters, layers)
    else:
        kinds = f.pattern("layers_block_type", names, layers)
    spec = {
        **trunk(f),
        **gqa(f, head_dim="head_dim" if f.has("head_dim") else "attention_head_dim"),
    }
    gated = str(f.get("mlp_hidden_act", "relu2")) not in ("relu2", "relu")
    spec.update(
        layer_counts(kinds), mlp_gated=gated, mlp_intermediate=f.integer("intermediate_size")
    )
    if "moe" in kinds:
        shared = f.integer("moe_shared_expert_intermediate_size", 0, minimum=0)
        spec.update(moe(f, "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"))
        spec.update(
            moe_shared_intermediate=shared, moe_latent=f.integer("moe_latent_size", 0, minimum=0)
        )
    return {**spec, **_mamba2(f, spec)}


def qwen3_next(f: Fields) -> Spec:
    """Qwen3-Next and Qwen3.5/3.6: gated delta net (``linear_attention``) and gated full
    attention (``full_attention``) by ``layer_types`` or ``full_attention_interval``; every
    layer has a dense MLP or a MoE with a shared expert."""
    layers = f.integer("num_hidden_layers")
    if f.has("layer_types"):
        kinds = {"linear_attention": "ssm", "full_attention": "attn"}
        mixers = f.pattern("layer_types", kinds, layers)
    else:
        every = f.integer("full_attention_interval")
        mixers = ["attn" if (i + 1) % every == 0 else "ssm" for i in range(layers)]
    sparse = f.has("num_experts") and f.integer("num_experts", 0, minimum=0) > 0
    spec = {**trunk(f), **gqa(f), "attn_gate": bool(f.get("attn_output_gate", True))}
    spec.update(mlp_gated=True, mlp_intermediate=f.integer("intermediate_size", 0, minimum=0))
    if sparse:
        shared = f.integer("shared_expert_intermediate_size", 0, minimum=0)
        spec.update(moe(f, "num_experts", "num_experts_per_tok", "moe_intermediate_size", shared))
    spec.update(layer_counts(mixers + ffn_kinds(f, layers, sparse)))
    shapes = {
        "ssm_expand": 0,
        "ssm_n_heads": f.integer("linear_num_value_heads"),
        "ssm_head_dim": f.integer("linear_value_head_dim"),
        "ssm_n_groups": f.integer("linear_num_key_heads"),
        "ssm_state_dim": f.integer("linear_key_head_dim"),
        "ssm_conv_kernel": f.integer("linear_conv_kernel_dim"),
    }
    return {**spec, **recurrent(f, spec, "gdn", shapes)}


def jamba(f: Fields) -> Spec:
    """Jamba: Mamba1 with one attention layer every ``attn_layer_period`` (at
    ``attn_layer_offset``) and MoE every ``expert_layer_period`` (at ``expert_layer_offset``)."""
    layers = f.integer("num_hidden_layers")
    a_period, a_off = f.integer("attn_layer_period"), f.integer("attn_layer_offset", minimum=0)
    e_period, e_off = f.integer("expert_layer_period"), f.integer("expert_layer_offset", minimum=0)
    mixers = ["attn" if i % a_period == a_off else "ssm" for i in range(layers)]
    ffn = ["moe" if i % e_period == e_off else "mlp" for i in range(layers)]
    spec = {
        **trunk(f),
        **gqa(f),
        "mlp_gated": True,
        "mlp_intermediate": f.integer("intermediate_size"),
    }
    spec.update(moe(f, "num_experts", "num_experts_per_tok", "intermediate_size"))
    spec.update(layer_counts(mixers + ffn))
    dt_rank = f.get("mamba_dt_rank", "auto")
    shapes = {
        "ssm_expand": f.integer("mamba_expand"),
        "ssm_state_dim": f.integer("mamba_d_state"),
        "ssm_conv_kernel": f.integer("mamba_d_conv"),
        "ssm_dt_rank": math.ceil(spec["d_model"] / 16)
        if dt_rank == "auto"
        else f.integer("mamba_dt_rank"),
    }
    return {**spec, **recurrent(f, spec, "mamba1", shapes)}


def granite_moe_hybrid(f: Fields) -> Spec:
    """Granite-4.0-H: Mamba2 and attention by ``layer_types``; every layer has a MoE whose
    shared expert is ``shared_intermediate_size`` wide (a dense MLP when there are no experts)."""
    layers = f.integer("num_hidden_layers")
    mixers = f.pattern("layer_types", {"mamba": "ssm", "attention": "attn"}, layers)
    shared = f.integer("shared_intermediate_size")
    spec = {**trunk(f), **gqa(f), "mlp_gated": True, "mlp_intermediate": shared}
    sparse = f.integer("num_local_experts", 0, minimum=0) > 0
    if sparse:
        spec.update(moe(f, "num_local_experts", "num_experts_per_tok", "intermediate_size", shared))
    spec.update(layer_counts(mixers + ["moe" if sparse else "mlp"] * layers))
    return {**spec, **_mamba2(f, spec)}


def falcon_h1(f: Fields) -> Spec:
    """Falcon-H1: every layer runs attention and Mamba2 in parallel, then a gated MLP."""
    layers = f.integer("num_hidden_layers")
    spec = {
        **trunk(f),
        **gqa(f),
        "mlp_gated": True,
        "mlp_intermediate": f.integer("intermediate_size"),
    }
    spec.update(layer_counts(["attn", "ssm", "mlp"] * layers))
    out = {**spec, **_mamba2(f, spec)}
    d_ssm = f.integer("mamba_d_ssm", out["ssm_n_heads"] * out["ssm_head_dim"])
    if d_ssm != out["ssm_n_heads"] * out["ssm_head_dim"]:
        raise f.error("mamba_d_ssm", f"({d_ssm}) must equal mamba_n_heads * mamba_d_head")
    return out


def kimi_linear(f: Fields) -> Spec:
    """Kimi Linear and Kimi-K3: KDA layers and MLA layers (``linear_attn_config``'s 1-based
    ``kda_layers`` / ``full_attn_layers``); dense FFN in the first ``first_k_dense_replace``
    layers, MoE with ``num_shared_experts`` after."""
    layers = f.integer("num_hidden_layers")
    lin = f.get("linear_attn_config")
    if not isinstance(lin, dict):
        raise f.error("linear_attn_config", "is missing or not an object")
    sub = Fields(lin, f"{f.path} linear_attn_config")
    kda = sub.indices("kda_layers", sub.get("kda_layers", []), layers, 1)
    full = sub.indices("full_attn_layers", sub.get("full_attn_layers", []), layers, 1)
    if kda & full or len(kda | full) != layers:
        raise sub.error("kda_layers", f"and full_attn_layers must split the {layers} layers")
    first = f.integer("first_k_dense_replace", 0, minimum=0)
    inter = f.integer("moe_intermediate_size")
    spec = {**trunk(f), **mla(f), "attn_gate": bool(f.get("mla_use_output_gate", False))}
    spec.update(mlp_gated=True, mlp_intermediate=f.integer("intermediate_size"))
    spec.update(moe(f, "num_experts", "num_experts_per_token", "moe_intermediate_size"))
    spec["moe_shared_intermediate"] = f.integer("num_shared_experts", 0, minimum=0) * inter
    spec["moe_latent"] = f.integer("routed_expert_hidden_size", 0, minimum=0)
    mixers = ["attn" if i in full else "ssm" for i in range(layers)]
    spec.update(layer_counts(mixers + ["mlp"] * first + ["moe"] * (layers - first)))
    heads, dim = sub.integer("num_heads"), sub.integer("head_dim")
    shapes = {
        "ssm_expand": 0,
        "ssm_n_heads": heads,
        "ssm_head_dim": dim,
        "ssm_n_groups": heads,
        "ssm_state_dim": dim,
        "ssm_conv_kernel": sub.integer("short_conv_kernel_size"),
    }
    return {**spec, **recurrent(f, spec, "kda", shapes)}


def lfm2(f: Fields) -> Spec:
    """LFM2: short gated convolutions (``conv``) and attention (``full_attention``) by
    ``layer_types``, each followed by a gated MLP (``block_auto_adjust_ff_dim`` shrinks
    ``intermediate_size`` to 2/3, times ``block_ffn_dim_multiplier``, rounded up to
    ``block_multiple_of``, as vLLM's ``Lfm2MLP``). The original configs' keys are read as
    transformers' ``Lfm2Config`` reads them: ``full_attn_idxs`` (the attention layers) when
    ``layer_types`` is absent, ``block_ff_dim`` before ``intermediate_size``."""
    layers = f.integer("num_hidden_layers")
    kinds = {"conv": "ssm", "full_attention": "attn"}
    if f.has("layer_types") or not f.has("full_attn_idxs"):
        mixers = f.pattern("layer_types", kinds, layers)
    else:
        attn = f.indices("full_attn_idxs", f.get("full_attn_idxs"), layers, 0)
        mixers = ["attn" if i in attn else "ssm" for i in range(layers)]
    inter = f.integer("block_ff_dim" if f.has("block_ff_dim") else "intermediate_size")
    if f.get("block_auto_adjust_ff_dim", False):
        inter = int(inter * 2 / 3)
        inter = int(float(f.get("block_ffn_dim_multiplier", 1.0)) * inter)
        step = f.integer("block_multiple_of", 1)
        inter = step * -(-inter // step)
    spec = {**trunk(f), **gqa(f), "mlp_gated": True, "mlp_intermediate": inter}
    spec["tie_embeddings"] = bool(f.get("tie_word_embeddings", f.get("tie_embedding", False)))
    spec.update(layer_counts(mixers + ["mlp"] * layers))
    conv_dim = f.integer("conv_dim", spec["d_model"])
    if conv_dim % spec["d_model"]:
        raise f.error("conv_dim", f"({conv_dim}) must be a multiple of hidden_size")
    shapes = {
        "ssm_expand": conv_dim // spec["d_model"],
        "ssm_conv_kernel": f.integer("conv_L_cache"),
    }
    return {**spec, **recurrent(f, spec, "short_conv", shapes)}
