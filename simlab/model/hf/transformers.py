"""Parsers of pure-attention architectures: dense, MoE, MLA and sliding-window."""

from __future__ import annotations

from simlab.model.hf.common import Spec, gqa, layer_counts, mla, moe, trunk
from simlab.model.hf.fields import Fields


def ffn_kinds(f: Fields, layers: int, sparse: bool) -> list[str]:
    """``moe``/``mlp`` per layer from Qwen's ``mlp_only_layers`` and ``decoder_sparse_step``."""
    if not sparse:
        return ["mlp"] * layers
    dense = f.indices("mlp_only_layers", f.get("mlp_only_layers", []), layers, 0)
    step = f.integer("decoder_sparse_step", 1)
    return ["moe" if i not in dense and (i + 1) % step == 0 else "mlp" for i in range(layers)]


def _sliding(f: Fields, layers: int) -> list[str]:
    """``attn``/``swa`` per layer: ``layer_types`` where given, else every layer sliding when
    ``use_sliding_window`` and ``sliding_window`` say so (Qwen2/3, Mistral)."""
    if f.has("layer_types"):
        kinds = {"full_attention": "attn", "sliding_attention": "swa"}
        return f.pattern("layer_types", kinds, layers)
    window = f.get("sliding_window") if f.get("use_sliding_window", True) else None
    return ["swa" if window else "attn"] * layers


def dense(f: Fields) -> Spec:
    """Llama, Qwen3, Mistral: every layer attention + a gated MLP."""
    layers = f.integer("num_hidden_layers")
    attn = _sliding(f, layers)
    spec = {
        **trunk(f),
        **gqa(f),
        "mlp_gated": True,
        "mlp_intermediate": f.integer("intermediate_size"),
    }
    spec.update(layer_counts(attn + ["mlp"] * layers))
    if spec["n_swa_layers"]:
        spec["swa_window"] = f.integer("sliding_window")
    return spec


def qwen3_moe(f: Fields) -> Spec:
    """Qwen3-MoE: attention + MoE (``mlp_only_layers`` dense)."""
    layers = f.integer("num_hidden_layers")
    spec = dense(f)
    spec.update(moe(f, "num_experts", "num_experts_per_tok", "moe_intermediate_size"))
    ffn = ffn_kinds(f, layers, sparse=True)
    spec.update(n_mlp_layers=ffn.count("mlp"), n_moe_layers=ffn.count("moe"))
    return spec


def mixtral(f: Fields) -> Spec:
    """Mixtral, MiniMax-M2: attention + MoE of ``intermediate_size`` experts in every layer (no
    shared expert; MiniMax-M2's QK norms, partial rotary and multi-token-prediction modules,
    which its serving runs without, are not costed)."""
    spec = dense(f)
    spec.update(moe(f, "num_local_experts", "num_experts_per_tok", "intermediate_size"))
    spec.update(n_mlp_layers=0, n_moe_layers=spec["n_attn_layers"])
    return spec


def deepseek_v3(f: Fields) -> Spec:
    """DeepSeek-V3/R1, Kimi-K2: MLA; the first ``first_k_dense_replace`` layers dense, the
    others MoE with ``n_shared_experts`` shared experts."""
    layers = f.integer("num_hidden_layers")
    first = f.integer("first_k_dense_replace", 0, minimum=0)
    if first > layers:
        raise f.error("first_k_dense_replace", f"({first}) exceeds num_hidden_layers ({layers})")
    inter = f.integer("moe_intermediate_size")
    shared = f.integer("n_shared_experts", 0, minimum=0) * inter
    spec = {
        **trunk(f),
        **mla(f),
        "mlp_gated": True,
        "mlp_intermediate": f.integer("intermediate_size"),
    }
    spec.update(moe(f, "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", shared))
    spec.update(layer_counts(["attn"] * layers + ["mlp"] * first + ["moe"] * (layers - first)))
    return spec


def gpt_oss(f: Fields) -> Spec:
    """gpt-oss: alternating sliding-window and full attention (``layer_types``), MoE in every
    layer."""
    layers = f.integer("num_hidden_layers")
    spec = {**trunk(f), **gqa(f), "mlp_gated": True}
    spec.update(moe(f, "num_local_experts", "num_experts_per_tok", "intermediate_size"))
    spec.update(layer_counts(_sliding(f, layers) + ["moe"] * layers))
    if spec["n_swa_layers"]:
        spec["swa_window"] = f.integer("sliding_window")
    return spec
