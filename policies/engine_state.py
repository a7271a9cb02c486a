"""The engines' recurrent state as they size it: its dtype, one layer's page and the block vLLM
forces to hold it (shared by :mod:`policies.production`'s vLLM and SGLang policies)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from simlab.cache.scoring import DTYPE_BYTES, SSM_DTYPES, vllm_block_size

if TYPE_CHECKING:
    from simlab.model.spec import ModelSpec


def positive_int(value: object, key: str) -> int:
    """``value`` if it is an integer >= 1, else a ValueError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def model_dtype(model: ModelSpec) -> str:
    """The model's own dtype by its bytes (the presets are BF16)."""
    return {4: "float32", 2: "bfloat16"}.get(model.dtype_bytes, f"{model.dtype_bytes} bytes")


def check_ssm_dtype(value: str, key: str) -> None:
    if value not in SSM_DTYPES:
        raise ValueError(f"{key} must be one of {SSM_DTYPES}, got {value!r}")


def with_ssm_dtype(model: ModelSpec, dtype: str) -> ModelSpec:
    """``model`` with its recurrent (SSM) state kept in ``dtype``."""
    size = DTYPE_BYTES[dtype]
    if not model.is_hybrid or model.ssm_state_dtype_bytes == size:
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
