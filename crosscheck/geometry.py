"""vLLM 0.33.0's hybrid geometry for every hybrid ``config.json`` aiconfigurator-core bundles,
computed by vLLM's own code on the CPU; writes ``tests/fixtures/crosscheck/geometry.json``.

    .venv-crosscheck/bin/python -m crosscheck.geometry --configs DIR [--out FILE]

``DIR`` is ``aiconfigurator_core/model_configs`` (``make crosscheck-geometry`` finds it in the
main venv). For each ``*_config.json`` that names recurrent layers (:data:`RECURRENT`) and whose
model vLLM builds as a hybrid (``ModelConfig.is_hybrid``): a ``VllmConfig`` over the config alone (no weights, no tokenizer; the checkpoint's
``quantization_config`` dropped, since it quantizes weights, not the cache), with prefix caching
on, so the model's own ``verify_and_update_config`` hooks run (``mamba_cache_mode`` ``align``,
the per-model ``mamba_ssm_cache_dtype``); then, with vLLM's functions:

* the recurrent state's shapes and dtypes (``get_mamba_state_shape_from_config``,
  ``get_mamba_state_dtype_from_config``) and its page (``MambaSpec.page_size_bytes``);
* one attention token's page (``FullAttentionSpec`` / ``MLAAttentionSpec`` at ``block_size=1``,
  as the platform computes it);
* ``Platform._align_hybrid_block_size``: the forced attention block, twice: with no prefill
  checkpoint alignment (Ampere, and Mamba2 / KDA layers everywhere) and, for GDN models, with
  the 64-token alignment of FlashInfer's GDN prefill, which vLLM picks on Hopper
  (``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``);
* the layer counts (from the layer types vLLM parsed);
* and SGLang 0.5.23's state per request at its dtypes (``mamba2_cache_params`` of its own config
  class: float32 SSM state unless the config says ``mamba_ssm_dtype``, bfloat16 conv state).

Stand-ins, no GPU: the model class is inspected in this process (vLLM does it in a child, to
keep CUDA out of the parent), where the torchvision stub is installed; the attention backend (FlashAttention, or FlashMLA for an MLA model) and the
checkpoint alignment (the layers are not built, so ``get_mamba_prefill_checkpoint_alignment``
is answered as the GPU would). ``python -m simlab.crosscheck geometry`` compares simlab's
computation with the file.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from crosscheck import stubs

stubs.install()

from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.model_executor.models import registry  # noqa: E402

from crosscheck.common import setup_logging, versions  # noqa: E402
from crosscheck.vllm_hybrid import patch_platform  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/crosscheck/geometry.json"
FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"
FLASH_MLA = "vllm.v1.attention.backends.mla.flashmla.FlashMLABackend"
#: a config that may hold recurrent layers (vLLM then decides: ``ModelConfig.is_hybrid``)
RECURRENT = re.compile(r"mamba|linear_attention|linear_attn_config|hybrid_override_pattern")
#: text models' max_model_len for the config (positions never matter to the cache's geometry)
MAX_LEN = 4096


def load_config(path: Path, model_dir: str) -> VllmConfig:
    """vLLM's config for the model of ``path`` with prefix caching on (its hooks run)."""
    (Path(model_dir) / "config.json").write_text(
        json.dumps(text_only(json.loads(path.read_text())))
    )
    patch_platform()
    registry._run_in_subprocess = lambda fn: fn()  # inspect in this process: it has the stubs
    return VllmConfig(
        model_config=ModelConfig(
            model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=MAX_LEN
        ),
        cache_config=CacheConfig(enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(
            max_model_len=MAX_LEN, is_encoder_decoder=False, async_scheduling=False
        ),
        device_config=DeviceConfig(device="cpu"),
    )


def text_only(raw: dict[str, Any]) -> dict[str, Any]:
    """The config without its checkpoint's ``quantization_config`` (it quantizes weights, not
    the cache) and, for a Qwen3.5 ``ForConditionalGeneration`` config, as its text model
    (``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``: the same language layers and cache,
    without the vision tower, whose image processor needs torchvision)."""
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    arch = raw.get("architectures", [""])[0]
    if arch.startswith("Qwen3_5") and arch.endswith("ForConditionalGeneration"):
        text = dict(raw["text_config"])
        text["architectures"] = [arch.replace("ForConditionalGeneration", "ForCausalLM")]
        text["tie_word_embeddings"] = raw.get("tie_word_embeddings", False)
        return text
    return raw


def layer_counts(config: VllmConfig) -> tuple[int, int]:
    """Attention and recurrent layers, from the config vLLM parsed: its layer types
    (``layers_block_type`` / ``layer_types``) or Kimi's ``linear_attn_config``."""
    text = config.model_config.hf_text_config
    linear = getattr(text, "linear_attn_config", None)
    if linear:
        return len(linear["full_attn_layers"]), len(linear["kda_layers"])
    kinds = getattr(text, "layers_block_type", None) or getattr(text, "layer_types", None)
    attention = sum(k in ("attention", "full_attention") for k in kinds)
    recurrent = sum(k in ("mamba", "linear_attention") for k in kinds)
    return attention, recurrent


def mamba_spec(config: VllmConfig) -> dict[str, Any]:
    """The recurrent layers' state: shapes, dtypes and page, from the model class's hooks."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.kv_cache_interface import MambaSpec

    model_config = config.model_config
    cls, _ = ModelRegistry.resolve_model_cls(model_config.architecture, model_config=model_config)
    with set_current_vllm_config(config):
        shapes = cls.get_mamba_state_shape_from_config(config)
        dtypes = cls.get_mamba_state_dtype_from_config(config)
    page = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
    return {
        "state_shapes": [list(s) for s in shapes],
        "state_dtypes": [str(d).removeprefix("torch.") for d in dtypes],
        "state_page_bytes": int(page),
    }


def attention_token_bytes(config: VllmConfig) -> int:
    """One token's KV page in one attention layer, as ``_align_hybrid_block_size`` sizes it."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    model_config, parallel = config.model_config, config.parallel_config
    spec = MLAAttentionSpec if model_config.use_mla else FullAttentionSpec
    return int(
        spec(
            block_size=1,
            num_kv_heads=model_config.get_num_kv_heads(parallel),
            head_size=model_config.get_head_size(),
            dtype=model_config.dtype,
        ).page_size_bytes
    )


@contextmanager
def checkpoint_alignment(tokens: int | None):
    """The Mamba layers' prefill checkpoint alignment, answered as the GPU would (None: some
    layer exports no checkpoint inside a prefill)."""
    import vllm.model_executor.layers.mamba.abstract as abstract

    real = abstract.get_mamba_prefill_checkpoint_alignment
    abstract.get_mamba_prefill_checkpoint_alignment = lambda _config: tokens
    try:
        yield
    finally:
        abstract.get_mamba_prefill_checkpoint_alignment = real


def forced_block(config: VllmConfig, alignment: int | None) -> int:
    """``_align_hybrid_block_size`` from vLLM's default block: the attention block it forces."""
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import resolve_obj_by_qualname

    cache = config.cache_config
    cache.block_size, cache.mamba_page_size_padded = CacheConfig.DEFAULT_BLOCK_SIZE, None
    backend = resolve_obj_by_qualname(FLASH_MLA if config.model_config.use_mla else FLASH_ATTN)
    with checkpoint_alignment(alignment), set_current_vllm_config(config):
        type(current_platform)._align_hybrid_block_size(config, backend)
    return int(cache.block_size)


def is_gdn(config: VllmConfig) -> bool:
    return getattr(config.model_config.hf_text_config, "linear_key_head_dim", None) is not None


def geometry(path: Path) -> dict[str, Any] | None:
    """The geometry of ``path``'s model (None when vLLM does not build it as a hybrid)."""
    from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT

    with tempfile.TemporaryDirectory() as model_dir:
        config = load_config(path, model_dir)
        model_config, cache = config.model_config, config.cache_config
        if not model_config.is_hybrid:
            return None
        attention, recurrent = layer_counts(config)
        out: dict[str, Any] = {
            "config": path.name,
            "architecture": model_config.architecture,
            "model_type": model_config.hf_text_config.model_type,
            "mamba_cache_mode": cache.mamba_cache_mode,
            "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype,
            "attention_layers": attention,
            "recurrent_layers": recurrent,
            "use_mla": bool(model_config.use_mla),
            "attention_token_bytes": attention_token_bytes(config),
        } | mamba_spec(config)
        out["block_size"] = forced_block(config, None)
        if is_gdn(config):
            out["block_size_hopper"] = forced_block(config, FLASHINFER_GDN_CHECKPOINT_ALIGNMENT)
    out["state_bytes"] = out["state_page_bytes"] * recurrent
    out["kv_bytes_per_token"] = out["attention_token_bytes"] * attention
    return out | sglang_state(path, out["model_type"])


#: SGLang 0.5.23's config class for each text model type of the bundled hybrids
SGLANG_CONFIGS = {
    "nemotron_h": "sglang.srt.configs.nemotron_h.NemotronHConfig",
    "qwen3_5_text": "sglang.srt.configs.qwen3_5.Qwen3_5TextConfig",
    "qwen3_5_moe_text": "sglang.srt.configs.qwen3_5.Qwen3_5MoeTextConfig",
    "kimi_linear": "sglang.srt.configs.kimi_linear.KimiLinearConfig",
}


def sglang_state(path: Path, model_type: str) -> dict[str, Any]:
    """SGLang's state per request (``mamba2_cache_params.mamba_cache_per_req``: every
    recurrent layer's conv and SSM state at SGLang's dtypes), from its own config class over
    the text config, at tensor parallelism 1."""
    from sglang.srt.runtime_context import get_parallel
    from vllm.utils.import_utils import resolve_obj_by_qualname

    raw = json.loads(path.read_text())
    text = {k: v for k, v in raw.get("text_config", raw).items() if k != "quantization_config"}
    cls = resolve_obj_by_qualname(SGLANG_CONFIGS[model_type])
    with get_parallel().override(attn_tp_size=1, tp_size=1, enable_cp_tp_group_sharing=False):
        params = cls(**text).mamba2_cache_params
        return {
            "sglang_state_bytes": int(params.mamba_cache_per_req),
            "sglang_state_dtypes": [
                str(d).removeprefix("torch.") for d in (params.dtype.conv, params.dtype.temporal)
            ],
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crosscheck.geometry", description=__doc__)
    parser.add_argument("--configs", type=Path, required=True, help="model_configs directory")
    parser.add_argument("--out", type=Path, default=FIXTURE)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    models, skipped = [], {}
    for path in sorted(args.configs.glob("*_config.json")):
        if path.name.endswith("_hf_quant_config.json") or not RECURRENT.search(path.read_text()):
            continue
        try:
            found = geometry(path)
        except (ValueError, TypeError, KeyError, AttributeError, ImportError) as err:
            # a config vLLM 0.33.0 cannot build: said in the file
            skipped[path.name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            continue
        if found is not None:
            models.append(found)
            logging.info("%s: block %s", path.name, found["block_size"])
    fixture = {
        "generated": versions(),
        "command": "make crosscheck-geometry",
        "models": models,
        "skipped": skipped,
    }
    args.out.write_text(json.dumps(fixture, indent=1) + "\n")
    logging.warning(
        "%d hybrids, %d configs vLLM did not build: %s", len(models), len(skipped), args.out
    )
    return 0 if models else 1


if __name__ == "__main__":
    sys.exit(main())
