"""The pieces every architecture's parser shares: the trunk, attention, FFN, recurrent states."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from simlab.model.hf.fields import Fields

log = logging.getLogger(__name__)

Spec = dict[str, Any]  # ModelSpec fields
DTYPE_NAMES = {2: "bfloat16", 4: "float32"}


def trunk(f: Fields) -> Spec:
    """Width, vocabulary, tied head and the model dtype (KV cache, conv state, activations)."""
    dtype, why = f.dtype_bytes("torch_dtype", "dtype"), "config torch_dtype"
    if dtype is None:
        log.warning("%s: no torch_dtype/dtype; assuming bfloat16 (2 bytes)", f.path)
        dtype, why = 2, "assumed: the config sets no torch_dtype"
    return {
        "flop_formula": "exact",
        "d_model": f.integer("hidden_size"),
        "vocab_size": f.integer("vocab_size", 0, minimum=0),
        "tie_embeddings": bool(f.get("tie_word_embeddings", False)),
        "dtype_bytes": dtype,
        "ssm_state_dtype_bytes": dtype,
        "state_dtypes": f"KV cache {DTYPE_NAMES.get(dtype, dtype)} ({why})",
        "weight_quant": weight_format(f),
    }


def weight_format(f: Fields) -> str:
    """The checkpoint's weight format, lower case ("" for none): its config's
    ``quantization_config``, else a ModelOpt ``hf_quant_config.json`` beside the config (NVIDIA's
    FP8 and NVFP4 checkpoints; ``<name>_hf_quant_config.json`` beside ``<name>_config.json``).
    ModelOpt's ``quant_algo`` (``fp8``, ``nvfp4``, ``mixed_precision``), else the
    ``quant_method`` (``fp8``, ``mxfp4``, ``compressed-tensors``)."""
    quant = f.get("quantization_config")
    if not isinstance(quant, dict):
        path = Path(f.path)
        sibling = path.with_name(path.name.removesuffix("config.json") + "hf_quant_config.json")
        if not path.name.endswith("config.json") or not sibling.is_file():
            return ""
        try:
            quant = json.loads(sibling.read_text()).get("quantization")
        except (json.JSONDecodeError, AttributeError) as err:
            raise ValueError(f"{sibling}: not a ModelOpt quantization config ({err})") from None
        if not isinstance(quant, dict):
            return ""
    return str(quant.get("quant_algo") or quant.get("quant_method") or "quantized").lower()


def gqa(f: Fields, heads: str = "num_attention_heads", head_dim: str = "head_dim") -> Spec:
    """Multi-head / grouped-query attention."""
    n_heads = f.integer(heads)
    d = f.integer(head_dim) if f.has(head_dim) else 0  # 0: hidden_size // heads
    return {
        "n_heads": n_heads,
        "n_kv_heads": f.integer("num_key_value_heads", n_heads),
        "head_dim": d,
    }


def mla(f: Fields) -> Spec:
    """Multi-head latent attention (DeepSeek-V3, Kimi): the cache holds one compressed latent
    of ``kv_lora_rank + qk_rope_head_dim`` per token and layer."""
    rope = f.integer("qk_rope_head_dim")
    n_heads = f.integer("num_attention_heads")
    return {
        "attn_kind": "mla",
        "n_heads": n_heads,
        "n_kv_heads": n_heads,
        "head_dim": f.integer("qk_nope_head_dim") + rope,
        "v_head_dim": f.integer("v_head_dim"),
        "mla_q_rank": f.integer("q_lora_rank", 0, minimum=0),
        "mla_kv_rank": f.integer("kv_lora_rank"),
        "mla_rope_dim": rope,
    }


def moe(f: Fields, experts: str, top_k: str, inter: str, shared: int = 0) -> Spec:
    """A routed MoE: ``experts`` experts of ``inter`` width, ``top_k`` per token, plus shared
    experts of ``shared`` total intermediate width."""
    return {
        "moe_experts": f.integer(experts),
        "moe_top_k": f.integer(top_k),
        "moe_intermediate": f.integer(inter),
        "moe_shared_intermediate": shared,
    }


def layer_counts(kinds: list[str]) -> Spec:
    """``n_*_layers`` from one simlab kind per layer (``attn``, ``swa``, ``ssm``, ``mlp``,
    ``moe``)."""
    n = Counter(kinds)
    return {
        "n_attn_layers": n["attn"] + n["swa"],
        "n_swa_layers": n["swa"],
        "n_ssm_layers": n["ssm"],
        "n_mlp_layers": n["mlp"],
        "n_moe_layers": n["moe"],
    }


def ssm_dtype(f: Fields, spec: Spec, kind: str) -> Spec:
    """The recurrent state's dtype, as vLLM keeps it (``MambaStateDtypeCalculator``): KDA's in
    FP32 always; the others in the config's ``mamba_ssm_cache_dtype`` / ``mamba_ssm_dtype``
    when it sets one (vLLM copies it into ``mamba_ssm_cache_dtype``), else the model dtype. The
    conv state and the KV cache stay in the model dtype. Records why in ``state_dtypes``."""
    names = DTYPE_NAMES
    model = names.get(spec["dtype_bytes"], f"{spec['dtype_bytes']} bytes")
    ssm, why = spec["dtype_bytes"], "the model dtype"
    if kind == "short_conv":
        return {"state_dtypes": f"KV and conv state {model} (model dtype); no recurrent state"}
    if kind == "kda":
        ssm, why = 4, "vLLM's kda_state_dtype: float32 always"
    else:
        for name in ("mamba_ssm_cache_dtype", "mamba_ssm_dtype"):
            value = f.dtype_bytes(name)
            if value is not None:
                ssm, why = value, f"config {name}"
                break
    named = {"config_ssm_dtype": names.get(ssm, "")} if why.startswith("config") else {}
    return named | {
        "ssm_state_dtype_bytes": ssm,
        "state_dtypes": f"KV and conv state {model} (model dtype); recurrent state "
        f"{names.get(ssm, ssm)} ({why})",
    }


def recurrent(f: Fields, spec: Spec, kind: str, shapes: Spec) -> Spec:
    """A recurrent layer kind with vLLM's conv-state width (``kernel - 1`` steps) and dtypes."""
    out = {"ssm_kind": kind, **shapes}
    out["ssm_conv_state_width"] = out["ssm_conv_kernel"] - 1
    if out["ssm_conv_state_width"] < 1:
        raise f.error("conv kernel", f"must be >= 2, got {out['ssm_conv_kernel']}")
    return {**out, **ssm_dtype(f, spec, kind)}
