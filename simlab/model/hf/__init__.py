"""Models from their Hugging Face ``config.json``: ``model=hf model.id=<org>/<name>``.

:func:`model_spec` builds the :class:`~simlab.model.spec.ModelSpec` of any supported config by
id (or from ``config=PATH``); :func:`spec_fields` gives its fields; :data:`ARCHITECTURES` maps
each supported ``architectures[0]`` to its parser. Configs are found by
:func:`~simlab.model.hf.resolve.find_config` and never downloaded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from simlab.model.hf import hybrids, transformers
from simlab.model.hf.common import Spec
from simlab.model.hf.fields import Fields
from simlab.model.hf.resolve import bundled_ids, find_config, read_config
from simlab.model.spec import ModelSpec

__all__ = ["ARCHITECTURES", "bundled_ids", "model_spec", "spec_fields", "spec_from_config"]

log = logging.getLogger(__name__)

#: ``architectures[0]`` -> its parser (a config's fields -> ModelSpec fields)
ARCHITECTURES: dict[str, Callable[[Fields], Spec]] = {
    "LlamaForCausalLM": transformers.dense,
    "MistralForCausalLM": transformers.dense,
    "Qwen2ForCausalLM": transformers.dense,
    "Qwen3ForCausalLM": transformers.dense,
    "Qwen3MoeForCausalLM": transformers.qwen3_moe,
    "MixtralForCausalLM": transformers.mixtral,
    "MiniMaxM2ForCausalLM": transformers.mixtral,
    "DeepseekV3ForCausalLM": transformers.deepseek_v3,
    "KimiK25ForConditionalGeneration": transformers.deepseek_v3,
    "GptOssForCausalLM": transformers.gpt_oss,
    "JambaForCausalLM": hybrids.jamba,
    "NemotronHForCausalLM": hybrids.nemotron_h,
    "Qwen3NextForCausalLM": hybrids.qwen3_next,
    "Qwen3_5ForCausalLM": hybrids.qwen3_next,
    "Qwen3_5MoeForCausalLM": hybrids.qwen3_next,
    "Qwen3_5ForConditionalGeneration": hybrids.qwen3_next,
    "Qwen3_5MoeForConditionalGeneration": hybrids.qwen3_next,
    "GraniteMoeHybridForCausalLM": hybrids.granite_moe_hybrid,
    "FalconH1ForCausalLM": hybrids.falcon_h1,
    "KimiLinearForCausalLM": hybrids.kimi_linear,
    "KimiK3ForConditionalGeneration": hybrids.kimi_linear,
    "Lfm2ForCausalLM": hybrids.lfm2,
}


def spec_fields(model_id: str, config: str | os.PathLike[str] | None = None) -> Spec:
    """The :class:`ModelSpec` fields of ``model_id``'s config (found as
    :func:`~simlab.model.hf.resolve.find_config` says); ``name`` is the id."""
    path = find_config(model_id, config)
    f = Fields(read_config(path), path)
    archs = f.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise f.error("architectures", f"must be a non-empty list of names, got {archs!r}")
    parser = ARCHITECTURES.get(archs[0])
    if parser is None:
        raise ValueError(
            f"{path}: architecture {archs[0]!r} is not supported; supported: "
            f"{', '.join(sorted(ARCHITECTURES))}"
        )
    log.info("model %s: %s from %s", model_id, archs[0], path)
    spec = {"name": model_id, "architecture": archs[0], **parser(f), "source": str(path)}
    if spec.get("n_swa_layers"):
        log.warning(
            "model %s: its %d sliding-window layers (window %d) are charged KV for every cached "
            "token, as a prefix cache keeps their blocks; a running request needs only its window",
            model_id,
            spec["n_swa_layers"],
            spec["swa_window"],
        )
    return spec


def model_spec(
    model_id: str, config: str | os.PathLike[str] | None = None, **overrides: Any
) -> ModelSpec:
    """The :class:`ModelSpec` of ``model_id`` with ``overrides`` (ModelSpec fields) on top."""
    fields = spec_fields(model_id, config)
    try:
        return ModelSpec.from_config({**fields, **overrides})
    except ValueError as err:
        raise ValueError(f"{fields['source']}: {err}") from err


def spec_from_config(cfg: Mapping[str, Any]) -> ModelSpec:
    """The ``model`` config group's ``hf`` option: ``id``, optional ``config`` (a path) and any
    ModelSpec field as an override (``+model.ssm_state_dtype_bytes=2``)."""
    # ``defaults`` is Hydra's: a preset file loaded without composing still has it
    values = {str(k): v for k, v in cfg.items() if not str(k).startswith("_") and k != "defaults"}
    model_id = values.pop("id")
    config = values.pop("config", None)
    if not isinstance(model_id, str) or "/" not in model_id:
        raise ValueError(f"model.id must be '<org>/<name>', got {model_id!r}")
    overrides = {k: v for k, v in values.items() if v is not None}
    return model_spec(model_id, config, **overrides)
