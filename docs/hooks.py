"""mkdocs hooks (``hooks:`` in mkdocs.yml).

``on_pre_build`` regenerates ``docs/reference/configuration.md`` from ``simlab/config.py`` and
``configs/`` (``docs/gen_config_reference.py``) before mkdocs collects the pages, so every build
documents the configuration as it is. The page is rewritten only when its text changes (so
``mkdocs serve`` does not rebuild in a loop); a key with no meaning anywhere is a warning, which
``mkdocs build --strict`` turns into a failure. It also renders ``docs/benchmarks/speed.md`` from
``bench/results/speed.json`` where a ``bench.speed`` run left one (``docs/gen_bench_tables.py``).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.config_reference")
GENERATOR = Path(__file__).resolve().parent / "gen_config_reference.py"
BENCH_TABLES = Path(__file__).resolve().parent / "gen_bench_tables.py"


def _generator(path: Path = GENERATOR) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_pre_build(config: Any, **kwargs: Any) -> None:
    generator = _generator()
    text, missing = generator.generate()
    for key in missing:
        log.warning("configuration reference: no meaning for %s", key)
    _write_if_changed(generator.OUT, text)
    tables = _generator(BENCH_TABLES)
    speed = tables.generate()
    if speed is not None:
        _write_if_changed(tables.OUT, speed)


def _write_if_changed(out: Path, text: str) -> None:
    if not out.exists() or out.read_text() != text:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        log.info("regenerated: %s", out)
