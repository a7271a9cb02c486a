"""Where a model's Hugging Face ``config.json`` comes from, without any download.

``model.config`` (a file, or a directory holding ``config.json``) first; else the local Hugging
Face cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``,
``models--<org>--<name>/snapshots/*/config.json``); else the configs bundled with
aiconfigurator-core (``model_configs/<org>--<name>_config.json``), a pinned dependency that
installs on Linux x86-64 only.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def hf_cache_dir() -> Path:
    """The local Hugging Face hub cache, as ``huggingface_hub`` finds it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def bundled_dir() -> Path | None:
    """aiconfigurator-core's ``model_configs`` folder, or None (one log line) when it is not
    installed. Found without importing the package."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        log.info("aiconfigurator-core is not installed: no bundled Hugging Face configs")
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "model_configs"


def bundled_ids() -> list[str]:
    """The ``org/name`` of every config aiconfigurator-core bundles (none without it)."""
    folder = bundled_dir()
    if folder is None or not folder.is_dir():
        return []
    suffix = "_config.json"
    names = (p.name[: -len(suffix)] for p in folder.glob(f"*{suffix}"))
    return sorted(n.replace("--", "/", 1) for n in names if not n.endswith("_hf_quant"))


def _cached(model_id: str) -> Path | None:
    snapshots = hf_cache_dir() / f"models--{model_id.replace('/', '--')}" / "snapshots"
    ref = snapshots.parent / "refs" / "main"
    if ref.is_file():
        named = snapshots / ref.read_text().strip() / "config.json"
        if named.is_file():
            return named
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def find_config(model_id: str, config: str | os.PathLike[str] | None = None) -> Path:
    """The ``config.json`` of ``model_id`` (see the module docstring); ``ValueError``
    naming the three places looked at when there is none."""
    if config:
        path = Path(config).expanduser()
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise ValueError(f"model.config: no such file {path}")
        return path
    cached = _cached(model_id)
    if cached is not None:
        return cached
    folder = bundled_dir()
    if folder is not None:
        bundled = folder / f"{model_id.replace('/', '--')}_config.json"
        if bundled.is_file():
            return bundled
    where = str(folder) if folder is not None else "aiconfigurator-core not installed"
    raise ValueError(
        f"model.id {model_id!r}: no config.json found in model.config (not set), the Hugging "
        f"Face cache ({hf_cache_dir()}) or aiconfigurator-core's bundled configs ({where}); "
        "set model.config=PATH (nothing is downloaded)"
    )


def read_config(path: Path) -> dict[str, Any]:
    """The config at ``path`` as one flat mapping: a ``ForConditionalGeneration`` config's
    nested ``text_config`` over its top level (whose ``architectures`` it keeps unless the
    text config names its own)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable JSON config ({err})") from err
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a config.json must be a JSON object")
    text = raw.get("text_config")
    if not isinstance(text, dict):
        return raw
    top = {k: v for k, v in raw.items() if k not in ("text_config", "vision_config")}
    merged = {**top, **text}
    if "architectures" in text:  # the top level's wrapper stays the name users see
        merged["architectures"] = raw.get("architectures") or text["architectures"]
        merged["text_architectures"] = text["architectures"]
    return merged
