"""Tokenized traces cached as parquet, keyed by everything that determines their content.

A cache entry is ``<cache_dir>/<name>-<sha256(key)[:20]>.parquet`` plus a ``.key.json`` sidecar
holding the key for humans. The key must name the source file (path, size, mtime), every selection
setting, the tokenizer and template version; :data:`FORMAT_VERSION` is added here. Any change to
one of them therefore misses and rebuilds; entries are written atomically, so a reader never sees
a partial file. An unreadable entry is logged and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traces.format import Trace
from traces.paths import cache_dir as default_cache_dir

log = logging.getLogger(__name__)

#: Bump when the layout of cached frames changes (columns, dtypes, request semantics).
FORMAT_VERSION = 2  # 2: inputs stored as prefix chains (traces.columnar)


def source_fingerprint(path: Path) -> dict[str, Any]:
    """Identity of a source file for cache keys: absolute path, size and mtime (ns)."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def cache_key_digest(name: str, key: dict[str, Any]) -> str:
    """sha256 hex digest of the canonical JSON of ``key`` plus the trace name and format version."""
    full = {"name": name, "format_version": FORMAT_VERSION, **key}
    canonical = json.dumps(full, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def cache_path(name: str, key: dict[str, Any], directory: Path) -> Path:
    """Where the entry for ``(name, key)`` lives in ``directory``."""
    return directory / f"{name}-{cache_key_digest(name, key)[:20]}.parquet"


def cached_trace(
    name: str,
    key: dict[str, Any],
    build: Callable[[], Trace],
    cache_dir: str | os.PathLike[str] | None = None,
) -> Trace:
    """Return the cached trace for ``(name, key)``, building and storing it on a miss.

    ``build`` must return a trace named ``name``, so hits and misses return the same trace.
    """
    path = cache_path(name, key, default_cache_dir(cache_dir))
    if path.is_file():
        trace = _read_entry(path, name)
        if trace is not None:
            return trace
    log.info("trace cache miss for %s: building %s", name, path)
    started = time.perf_counter()
    trace = build()
    if trace.name != name:
        raise ValueError(f"cache entry {name!r} was built as a trace named {trace.name!r}")
    log.info(
        "built trace %s (%d requests) in %.1f s", name, len(trace), time.perf_counter() - started
    )
    trace.to_parquet(path)
    _write_sidecar(path, name, key)
    return trace


def _read_entry(path: Path, name: str) -> Trace | None:
    """Read a cache entry; None (logged) when it is unreadable, so the caller rebuilds it."""
    started = time.perf_counter()
    try:
        trace = Trace.read_parquet(path, name)
    except Exception as exc:  # noqa: BLE001 - a corrupt entry must never be fatal: it is rebuilt
        log.warning("trace cache entry %s is unreadable (%s): rebuilding", path, exc)
        return None
    log.info("trace cache hit for %s: %s (%.2f s)", name, path, time.perf_counter() - started)
    return trace


def _write_sidecar(path: Path, name: str, key: dict[str, Any]) -> None:
    """Best-effort human-readable copy of the key next to the entry."""
    full = {"name": name, "format_version": FORMAT_VERSION, **key}
    sidecar = path.with_suffix(".key.json")
    try:
        sidecar.write_text(json.dumps(full, sort_keys=True, indent=2, default=str))
    except OSError as exc:
        log.warning("could not write cache key sidecar %s: %s", sidecar, exc)
