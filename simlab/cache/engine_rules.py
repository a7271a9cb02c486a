"""The engines' rules for a hybrid's recurrent state, which the production policies
(``policies/production.py``) and the state pool share: the dtypes vLLM and SGLang keep it in,
its page, the attention block vLLM forces to hold it (and the GPU's kernel that aligns it), the
states vLLM keeps on that block, and the checks of the settings that shape them.

Like :mod:`simlab.cache.contract`, this module imports nothing from ``simlab`` at run time.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simlab.model.spec import ModelSpec

#: bytes of each dtype an engine may keep a recurrent state in
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: ``auto`` and the dtypes a user may set (``policy.mamba_ssm_cache_dtype``, ``policy.mamba_ssm_dtype``)
SSM_DTYPES = ("auto", *DTYPE_BYTES)
#: vLLM 0.33.0's per-architecture SSM dtype (``model_executor/models/config.py``:
#: ``NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE``, "only float32 is known to have no
#: accuracy issues"; the config's own ``mamba_ssm_cache_dtype`` first). Others: ``auto``, the
#: conv state's dtype, which is the model's.
VLLM_SSM_DTYPE = {"NemotronHForCausalLM": "float32"}
#: SGLang 0.5.23's state dtypes (``srt/configs/mamba_utils.py`` ``mamba2_state_dtype``): the SSM
#: state in float32 unless the config says ``mamba_ssm_dtype`` (or ``SGLANG_MAMBA_SSM_DTYPE``),
#: the conv state in bfloat16 (``SGLANG_MAMBA_CONV_DTYPE``), for every Mamba2 / GDN hybrid
SGLANG_SSM_DTYPE, SGLANG_CONV_DTYPE = "float32", "bfloat16"


#: the prefill checkpoint alignment of FlashInfer's GDN kernel (vLLM 0.33.0
#: ``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``): vLLM's blocks for GDN layers are multiples of it
GDN_FLASHINFER_ALIGNMENT = 64


def vllm_gdn_prefill(capability: float | None, head_k_dim: int) -> str:
    """The GDN prefill kernel vLLM 0.33.0 picks (``--gdn-prefill-backend auto``,
    ``_resolve_gdn_prefill_backend``) on a GPU of CUDA compute ``capability`` (None: not CUDA):
    FlashInfer on SM 9.0 (Hopper), and on SM 10.x and 12.x (Blackwell) with 128-wide key heads
    and a CUDA 13 runtime (assumed); Triton elsewhere."""
    if capability is None:
        return "triton"
    blackwell = int(capability) in (10, 12) and head_k_dim == 128
    return "flashinfer" if capability == 9.0 or blackwell else "triton"


def vllm_block_size(
    state_page: int, token_page: int, minimum: int = 16, alignment: int = 1, mla: bool = False
) -> int:
    """vLLM 0.33.0's attention block for a hybrid (``Platform._align_hybrid_block_size``): the
    fewest tokens, in multiples of ``max(16, minimum)`` (the kernels' block; 128 for MLA) and of
    the layers' prefill checkpoint ``alignment`` (64 for GDN on Hopper), whose attention page
    (``token_page`` bytes a token) holds one recurrent state page (``state_page``)."""
    align = math.lcm(max(128 if mla else 16, minimum), alignment)
    block = align * -(-state_page // (align * token_page))
    return max(minimum, 16 * -(-block // 16))


def positive_int(value: object, key: str) -> int:
    """``value`` if it is an integer >= 1, else a ValueError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def check_bool(value: object, key: str) -> None:
    """A ValueError naming ``key`` unless ``value`` is true or false."""
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")


def check_capability(value: object) -> None:
    """A ValueError unless ``value`` is a CUDA compute capability (a number) or None."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError(f"hardware.compute_capability must be a number or null, got {value!r}")


def model_dtype(model: ModelSpec) -> str:
    """The model's own dtype by its bytes (the presets are BF16; a one-byte model is an FP8
    checkpoint, whose activations and states stay in its BF16 ``torch_dtype``)."""
    return {4: "float32", 2: "bfloat16", 1: "bfloat16"}.get(
        model.dtype_bytes, f"{model.dtype_bytes} bytes"
    )


def check_ssm_dtype(value: str, key: str) -> None:
    if value not in SSM_DTYPES:
        raise ValueError(f"{key} must be one of {SSM_DTYPES}, got {value!r}")


def with_ssm_dtype(model: ModelSpec, dtype: str) -> ModelSpec:
    """``model`` with its recurrent (SSM) state kept in ``dtype``."""
    if not model.is_hybrid:
        return model
    size = DTYPE_BYTES[dtype]
    if model.ssm_state_dtype_bytes == size:
        return model
    return replace(model, ssm_state_dtype_bytes=size)


def mamba_page_bytes(model: ModelSpec, conv_bytes: int | None = None) -> int:
    """One layer's recurrent state as the engines keep it (vLLM's ``MambaSpec.page_size_bytes``,
    SGLang's ``mamba_cache_per_req`` per layer): the conv state over ``kernel - 1`` steps (in
    ``conv_bytes``, default the model's dtype) plus the SSM state."""
    conv = model.dtype_bytes if conv_bytes is None else conv_bytes
    return (
        model.ssm_state_channels * model.ssm_state_dim * model.ssm_state_dtype_bytes
        + model.ssm_conv_channels * (model.ssm_conv_kernel - 1) * conv
    )


def vllm_hybrid_block_size(model: ModelSpec, minimum: int, alignment: int = 1) -> int:
    """Tokens per block of a hybrid under ``align`` (:func:`vllm_block_size`): one layer's KV
    page of a block holds one layer's Mamba state (:func:`mamba_page_bytes`), in multiples of
    the layers' prefill checkpoint ``alignment`` (64 with FlashInfer's GDN prefill).
    Nemotron-H-8B: 528 with a BF16 state, 1,040 with vLLM's FP32 default for it."""
    page, token = mamba_page_bytes(model), model.kv_bytes_per_token_per_layer
    return vllm_block_size(page, token, minimum, alignment, mla=model.attn_kind == "mla")


def states_kept(junction: bool, retention: int | None, block: int, unit: int | None = None) -> str:
    """Where vLLM's ``align`` mode keeps a request's states (``engine_geometry``), with the
    shared-prefix ``junction``, ``--prefix-cache-retention-interval`` ``retention`` (tokens;
    None: dense) and ``--prefix-match-unit`` ``unit`` (None: the block) on blocks of
    ``block`` tokens."""
    if unit is not None and unit < block:
        kept = f"the prompt's last {unit}-token boundary below its end (its partial tail)"
    else:
        kept = "the prompt's last block boundary below its end"
    kept += " and the shared-prefix junction" if junction else ""
    if retention is None or 0 < retention <= block:
        return kept + ", and every block boundary a scheduler step ends on"
    if retention:
        return kept + f", and every multiple of {retention} tokens a scheduler step ends on"
    return kept


def gdn_prefill_items(
    kernel: str | None, capability: float | None, version: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """A GDN hybrid's prefill ``kernel`` on a GPU of compute ``capability``: its
    ``engine_geometry`` items and where it comes from (``engine_defaults``); none for a model
    without GDN layers (``kernel`` None)."""
    if kernel is None:
        return {}, {}
    gpu = f"compute capability {capability} (hardware.compute_capability)"
    blocks = ", blocks in multiples of 64 tokens" if kernel == "flashinfer" else ""
    source = f"{kernel} (vLLM {version}'s auto on {gpu}{blocks})"
    return (
        {"compute_capability": capability, "gdn_prefill_backend": kernel},
        {"gdn_prefill_backend": source},
    )


def check_grid_options(retention: int | None, unit: int | None) -> None:
    """``--prefix-cache-retention-interval`` (0, None or a positive integer) and
    ``--prefix-match-unit`` (None or a positive integer), or a ValueError naming the key."""
    if retention is not None and retention != 0:
        positive_int(retention, "policy.prefix_cache_retention_interval")
    if unit is not None:
        positive_int(unit, "policy.prefix_match_unit")


def check_grid(retention: int | None, unit: int | None, block: int, hybrid: bool = True) -> None:
    """vLLM's checks of ``--prefix-cache-retention-interval`` (``retention``) and
    ``--prefix-match-unit`` (``unit``) on the grid of its ``block`` (tokens; forced for a
    hybrid): a unit that divides a hybrid's block (``resolve_kv_cache_block_sizes``), the
    block itself for a Transformer (one KV-cache group)."""
    if retention and not hybrid:
        raise ValueError(
            "policy.prefix_cache_retention_interval applies to Mamba layers, and this "
            "model has none (vLLM refuses it); leave it 0"
        )
    if retention and retention % block:
        raise ValueError(
            f"policy.prefix_cache_retention_interval ({retention}) must be a multiple of "
            f"vLLM's block for this model ({block} tokens), as vLLM requires"
        )
    if unit is not None and not hybrid and unit != block:
        raise ValueError(
            f"policy.prefix_match_unit ({unit}): with one KV-cache group vLLM's hits land "
            f"on its block ({block} tokens), as vLLM requires; leave it null"
        )
    if unit is not None and block % unit:
        raise ValueError(
            f"policy.prefix_match_unit ({unit}) must divide vLLM's block for this model "
            f"({block} tokens), as vLLM requires"
        )


__all__ = [
    "DTYPE_BYTES",
    "GDN_FLASHINFER_ALIGNMENT",
    "SGLANG_CONV_DTYPE",
    "SGLANG_SSM_DTYPE",
    "SSM_DTYPES",
    "VLLM_SSM_DTYPE",
    "check_bool",
    "check_capability",
    "check_grid",
    "check_grid_options",
    "check_ssm_dtype",
    "gdn_prefill_items",
    "mamba_page_bytes",
    "model_dtype",
    "positive_int",
    "states_kept",
    "vllm_block_size",
    "vllm_gdn_prefill",
    "vllm_hybrid_block_size",
    "with_ssm_dtype",
]
