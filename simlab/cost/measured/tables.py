"""NVIDIA's measured per-op latency tables in ``aiconfigurator-core`` (Apache-2.0, a pinned
dependency on Linux x86-64; imported lazily, never copied): where they are, which GPUs,
backends and versions they cover, and one table's rows for a dtype.

Layout: ``aiconfigurator_core/systems/data/<gpu>/<op family>/<backend>/<version>/<table>.parquet``
(latency in milliseconds), with ``systems/<gpu>.yaml`` giving the GPU's peaks."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BACKENDS = ("vllm", "sglang", "trtllm")
#: simlab's dtype name -> the tables' spelling, per column family
DTYPES = {
    "bf16": {"gemm": "bfloat16", "moe": "bfloat16", "attn": "bfloat16"},
    "fp8": {"gemm": "fp8", "moe": "fp8", "attn": "bfloat16"},
    "fp4": {"gemm": "nvfp4", "moe": "nvfp4", "attn": "bfloat16"},
}


@functools.lru_cache(maxsize=1)
def systems_dir() -> Path | None:
    """``aiconfigurator_core/systems`` or None (not installed: one log line, once)."""
    try:
        import aiconfigurator_core
    except ImportError:
        log.warning(
            "aiconfigurator-core is not installed (it ships Linux x86-64 wheels only): "
            "every op runs on the calibrated roofline"
        )
        return None
    return Path(aiconfigurator_core.__file__).parent / "systems"


def version_key(version: str) -> tuple[Any, ...]:
    """Sort key of a version string (``0.5.6.post2`` < ``0.5.10``; ``1.3.0rc20`` < ``1.3.0``)."""
    parts: list[Any] = []
    for piece in version.replace("rc", ".-1.").replace("post", "").replace("dev", "-2.").split("."):
        try:
            parts.append(int(piece))
        except ValueError:
            parts.append(-3)
    return tuple(parts)


def data_roots(local: Path | None = None) -> list[Path]:
    """Where tables are looked up, first first: the package's ``systems/data``, then ``local``
    (``engine.kernel_tables``: tables ``gpu_validate tables`` wrote, same layout), which adds
    the tables the package lacks (the Mamba scans) or a GPU it lacks."""
    root = systems_dir()
    return [r for r in (None if root is None else root / "data", local) if r is not None]


@functools.lru_cache(maxsize=64)
def versions(system: str, backend: str, local: Path | None = None) -> tuple[str, ...]:
    """Versions of ``backend`` with any table for ``system``, oldest first."""
    found = set()
    for root in data_roots(local):
        found |= {p.parent.name for p in (root / system).glob(f"*/{backend}/*/*.parquet")}
    return tuple(sorted(found, key=version_key))


def systems() -> tuple[str, ...]:
    """GPUs with measured tables."""
    root = systems_dir()
    if root is None:
        return ()
    return tuple(
        sorted(p.name for p in (root / "data").iterdir() if any(p.glob("*/*/*/*.parquet")))
    )  # a local root adds tables to these GPUs (or to a preset's own ``system`` name)


def table_path(
    system: str, family: str, backend: str, version: str, table: str, local: Path | None = None
) -> Path | None:
    """The parquet file of one table at the newest version <= ``version`` that has it, else
    (every measurement of that table is newer) at the oldest newer one: the same engine's kernel
    measured later is closer to it than the roofline. From the first of :func:`data_roots` with
    one; each table's version is in the run's ``kernels.tables``."""
    key = version_key(version)
    newer: Path | None = None
    for root in data_roots(local):
        base = root / system / family / backend
        have = sorted((p.parent.name for p in base.glob(f"*/{table}.parquet")), key=version_key)
        below = [v for v in have if version_key(v) <= key]
        if below:
            return base / below[-1] / f"{table}.parquet"
        if have and newer is None:
            newer = base / have[0] / f"{table}.parquet"
    return newer


@functools.lru_cache(maxsize=32)
def rows(path: Path, filters: tuple[tuple[str, Any], ...]) -> Any:
    """A table's rows where each ``(column, value)`` of ``filters`` holds (a column the table
    lacks is skipped), as a pandas frame."""
    import pandas as pd

    frame = pd.read_parquet(path)
    for column, value in filters:
        if column in frame.columns:
            frame = frame[frame[column] == value]
    return frame


def kernel_rows(frame: Any, prefer: tuple[str, ...] = ()) -> Any:
    """The rows of one kernel (``kernel_source``): the first of ``prefer`` (substrings) that has
    rows, else the one with most rows (the tables hold several kernels per op)."""
    if "kernel_source" not in frame.columns or frame.empty:
        return frame
    names = frame["kernel_source"].value_counts()
    for want in prefer:
        for name in names.index:
            if want in str(name):
                return frame[frame["kernel_source"] == name]
    return frame[frame["kernel_source"] == names.index[0]]


@functools.lru_cache(maxsize=32)
def system_spec(system: str) -> dict[str, Any] | None:
    """``systems/<system>.yaml`` as read (None: no file)."""
    import yaml

    root = systems_dir()
    path = None if root is None else root / f"{system}.yaml"
    if path is None or not path.exists():
        return None
    spec: dict[str, Any] = yaml.safe_load(path.read_text())
    return spec


@functools.lru_cache(maxsize=32)
def peaks(system: str) -> dict[str, float] | None:
    """``systems/<system>.yaml``'s GPU peaks as a hardware preset's keys (None: no file)."""
    spec = system_spec(system)
    if spec is None:
        return None
    gpu, node = spec["gpu"], spec["node"]
    return {
        "peak_tflops": gpu["bfloat16_tc_flops"] / 1e12,
        "mem_bw_gbps": gpu["mem_bw"] / 1e9,
        "mem_gb": gpu["mem_capacity"] / 2**30,
        "link_bw_gbps": node["intra_node_bw"] / 1e9,
    }
