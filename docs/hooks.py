"""mkdocs hooks (``hooks:`` in mkdocs.yml).

``on_pre_build`` regenerates ``docs/reference/configuration.md`` from ``simlab/config.py`` and
``configs/`` (``docs/gen_config_reference.py``) before mkdocs collects the pages, so every build
documents the configuration as it is. The page is rewritten only when its text changes (so
``mkdocs serve`` does not rebuild in a loop); a key with no meaning anywhere is a warning, which
``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.config_reference")
GENERATOR = Path(__file__).resolve().parent / "gen_config_reference.py"


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_config_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_pre_build(config: Any, **kwargs: Any) -> None:
    generator = _generator()
    text, missing = generator.generate()
    for key in missing:
        log.warning("configuration reference: no meaning for %s", key)
    out: Path = generator.OUT
    if not out.exists() or out.read_text() != text:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        log.info("configuration reference regenerated: %s", out)
