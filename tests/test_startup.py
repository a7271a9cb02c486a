"""Start-up: a replay of a cached trace never imports pandas (``python -m simlab``'s quarter of a
second) nor the timed engine and SimPy (0.02 s), and its results are those of the run that built
the cache, DataFrame for DataFrame."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from traces.paths import resolve_data_dir

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = resolve_data_dir() / "mooncake" / "synthetic_trace.jsonl"

pytestmark = pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"{MOONCAKE} missing")


def simlab(
    out: Path, cache: Path, *flags: str, size: str = "20"
) -> subprocess.CompletedProcess[str]:
    """``python [flags] -m simlab`` on the Mooncake trace, an LRU block pool, replay engine."""
    overrides = [
        "trace=mooncake",
        "model=llama3_8b",
        "engine=replay",
        "+policy=vllm",
        "policy.block_size=512",
        f"cache.size_gb={size}",
        "arrivals.mode=timestamps",
        "report=false",
        f"hydra.run.dir={out}",
        f"output_dir={out}",
    ]
    env = os.environ | {"SIMLAB_CACHE_DIR": str(cache)}
    cmd = [sys.executable, *flags, "-m", "simlab", *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)


def test_a_replay_of_a_cached_trace_imports_neither_pandas_nor_the_timed_engine(tmp_path):
    cache = tmp_path / "cache"
    simlab(tmp_path / "built", cache)  # a cache miss builds the trace (with pandas)
    again = simlab(tmp_path / "cached", cache, "-X", "importtime")
    assert "trace cache hit" in again.stdout + again.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines()}
    assert "pyarrow.parquet" in imported  # the check sees what is imported
    assert not {m for m in imported if m.split(".")[0] == "pandas"}
    assert not imported & {
        "simpy",
        "simlab.engines.timed.world",
        "simlab.engines.cluster",
        "simlab.cost.model",
    }
    for name in ("records.parquet", "occupancy.parquet"):
        built = pd.read_parquet(tmp_path / "built" / name)
        assert_frame_equal(pd.read_parquet(tmp_path / "cached" / name), built)
    summaries = [
        json.loads((tmp_path / run / "summary.json").read_text())["policies"]["vllm"]
        for run in ("built", "cached")
    ]
    for summary in summaries:
        summary.pop("wall_s")
        summary.pop("requests_per_s")
    assert summaries[0] == summaries[1]


def test_a_capacity_list_of_a_cached_trace_imports_neither_pandas_nor_tqdm(tmp_path):
    """Its table is built and written with pyarrow alone (``simlab.run.sweep.tidy_table``), and off
    a terminal no progress bar is drawn."""
    cache = tmp_path / "cache"
    simlab(tmp_path / "built", cache)
    again = simlab(tmp_path / "list", cache, "-X", "importtime", size="[5,20]")
    imported = {line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines()}
    assert "pyarrow.parquet" in imported and "simlab.run.capacities" in imported
    assert not {m for m in imported if m.split(".")[0] in ("pandas", "tqdm")}
    table = pd.read_parquet(tmp_path / "list" / "capacities.parquet")
    assert table["cache.size_gb"].tolist() == [5.0, 20.0]
