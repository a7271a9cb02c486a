"""``cache.size_gb=[...]``: many capacities in one process (simlab/run/capacities.py, simlab/fastpaths/stack.py).

The one-pass stack-distance replay is checked frame for frame against separate scalar runs of
the normal replay, on real trace slices, at capacities small enough to evict and truncate and at
an infinite one; the back-to-back path against scalar runs too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from simlab.config import ConfigError
from simlab.engines.records import strict_json
from simlab.fastpaths.stack import Fenwick, matched_blocks
from simlab.model.spec import ModelSpec
from simlab.run import routes
from simlab.run.capacities import TABLE, point_dir_name, run_capacities
from simlab.run.simulate import plan_run, policy_step, saved_config, simulate
from tests.fixtures import ROOT, compose
from traces.paths import resolve_data_dir

MOONCAKE = resolve_data_dir(None) / "mooncake" / "synthetic_trace.jsonl"
needs_mooncake = pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"no trace at {MOONCAKE}")

QUIET = ["bounds.enabled=false", "report=false", "engine=replay"]
#: bench/peers.py's LRU case (kvcache-simulator's ``lru``), on a slice of the Mooncake trace
MOONCAKE_LRU = [
    "+policy=vllm",
    "trace=mooncake",
    "model=llama3_8b",
    "policy.block_size=512",
    "arrivals.mode=timestamps",
    *QUIET,
]
SHAREGPT_VLLM = [
    "+policy=vllm",
    "trace=sharegpt",
    "trace.limit=12",
    "model=llama3_8b",
    "policy.block_size=16",
    *QUIET,
]
#: per-run items that measure the simulator, not the simulation (and ``*wall_s``)
TIMING = {"requests_per_s"}


def sizes_arg(sizes: list[str]) -> str:
    return f"cache.size_gb=[{','.join(sizes)}]"


def quoted_dir(path: Path) -> str:
    return f"output_dir='{path}'"  # a point directory's name holds '=': quoted for Hydra


def run_list(base: list[str], sizes: list[str], out: Path, *extra: str):
    return run_capacities(compose([*base, sizes_arg(sizes), quoted_dir(out), *extra]))


def run_scalar(base: list[str], size: str, out: Path, *extra: str):
    return simulate(compose([*base, f"cache.size_gb={size}", quoted_dir(out), *extra]))


def results(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return (
        pd.read_parquet(run_dir / "records.parquet"),
        pd.read_parquet(run_dir / "occupancy.parquet"),
        summary,
    )


def route_of(run_dir: Path, policy: str) -> dict[str, Any]:
    """The route ``summary.json`` keeps for ``policy``."""
    return json.loads((run_dir / "summary.json").read_text())["routes"][policy]


def without_timing(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        name: {k: v for k, v in metrics.items() if k not in TIMING and not k.endswith("wall_s")}
        for name, metrics in summary["policies"].items()
    }


def assert_point_equals_scalar(base: list[str], size: str, point_dir: Path, scalar_dir: Path):
    """A list run's point directory holds what a scalar run of that capacity writes, replayed
    request by request (``cache.one_pass=false``: no stack distances)."""
    run_scalar(base, size, scalar_dir, "cache.one_pass=false")
    records, occupancy, summary = results(point_dir)
    want_records, want_occupancy, want_summary = results(scalar_dir)
    assert_frame_equal(records, want_records, check_exact=True)
    assert_frame_equal(occupancy, want_occupancy, check_exact=True)
    assert without_timing(summary) == without_timing(want_summary)
    assert summary["bounds"] == want_summary["bounds"]
    point_cfg = compose([*base, f"cache.size_gb={size}", quoted_dir(point_dir)])
    assert summary["config"] == strict_json(saved_config(point_cfg))
    return records


# ------------------------------------------------------------------------ one pass == replay
ONE_PASS_CASES = {
    "mooncake, kvcache-simulator's LRU": (
        [*MOONCAKE_LRU, "trace.limit=300", "+policy.semantics.whole_input_hit=true"],
        ["0.3", "2", "20", "inf"],
    ),
    "mooncake, vLLM's hit rule": ([*MOONCAKE_LRU, "trace.limit=300"], ["0.3", "5", "inf"]),
    "sharegpt, 16-token blocks": (SHAREGPT_VLLM, ["0.01", "0.05", "inf"]),
    "sharegpt, plain LRU refreshing the insert path": (
        [
            *SHAREGPT_VLLM,
            "eviction@policy.eviction=lru",
            "policy.eviction.refreshes_insert_path=true",
        ],
        ["0.01", "inf"],
    ),
}


@pytest.mark.parametrize("case", list(ONE_PASS_CASES))
def test_one_pass_records_equal_separate_scalar_runs(case, tmp_path):
    base, sizes = ONE_PASS_CASES[case]
    if "trace=mooncake" in base and not MOONCAKE.is_file():
        pytest.skip(f"no trace at {MOONCAKE}")
    run = run_list(base, sizes, tmp_path / "list")
    assert all(set(p.replay.values()) == {"one_pass"} for p in run.points)  # not a fallback
    smallest = None
    for size in sizes:
        point = tmp_path / "list" / point_dir_name(float(size))
        records = assert_point_equals_scalar(base, size, point, tmp_path / f"scalar_{size}")
        smallest = records if smallest is None else smallest
    assert smallest is not None  # the smallest capacity exercises eviction and truncation
    assert smallest["nodes_evicted"].sum() > 0 and smallest["admission_truncated"].any()
    infinite = results(tmp_path / "list" / "size_gb=inf")[0]
    assert infinite["nodes_evicted"].sum() == 0 and infinite["hit_tokens"].sum() > 0


@needs_mooncake
@pytest.mark.parametrize("size", ["0.3", "3"])
def test_one_capacity_from_stack_distances_equals_the_replay(size, tmp_path, caplog):
    """A scalar run of an LRU over whole blocks is computed from stack distances (logged and
    kept in ``summary.json``), and writes what the request-by-request replay writes."""
    base = [*MOONCAKE_LRU, "trace.limit=300"]
    caplog.set_level("INFO", logger="simlab.run.policy")
    run_scalar(base, size, tmp_path / "stack")
    assert "route stack_distances" in caplog.text
    caplog.clear()
    run_scalar(base, size, tmp_path / "replay", "cache.one_pass=false")
    assert "route request_step" in caplog.text
    assert route_of(tmp_path / "stack", "vllm")["taken"] == "stack_distances"
    refused = route_of(tmp_path / "replay", "vllm")["refused"]
    assert refused["stack_distances"] == "cache.one_pass=false"
    records, occupancy, summary = results(tmp_path / "stack")
    want_records, want_occupancy, want_summary = results(tmp_path / "replay")
    assert_frame_equal(records, want_records, check_exact=True)
    assert_frame_equal(occupancy, want_occupancy, check_exact=True)
    assert without_timing(summary) == without_timing(want_summary)
    assert records["nodes_evicted"].sum() > 0  # the capacity is small enough to evict


@needs_mooncake
def test_one_pass_switch_off_runs_back_to_back_with_the_same_records(tmp_path, caplog):
    base = [*MOONCAKE_LRU, "trace.limit=150"]
    caplog.set_level("INFO", logger="simlab.run.capacities")
    one = run_list(base, ["0.5", "3"], tmp_path / "one")
    assert "one-pass stack-distance replay for 2 capacities" in caplog.text
    caplog.clear()
    back = run_list(base, ["0.5", "3"], tmp_path / "back", "cache.one_pass=false")
    assert "back to back for 2 capacities (route request_step" in caplog.text
    assert "not stack_distances: cache.one_pass=false" in caplog.text
    assert [p.replay["vllm"] for p in back.points] == ["back_to_back"] * 2
    assert [p.replay["vllm"] for p in one.points] == ["one_pass"] * 2
    for name in ("size_gb=0.5", "size_gb=3"):
        assert_frame_equal(
            results(tmp_path / "one" / name)[0], results(tmp_path / "back" / name)[0]
        )


# ------------------------------------------------------------------------ back to back
def test_back_to_back_points_equal_scalar_runs_for_a_hybrid(tmp_path):
    base = ["+policy=marconi", "trace=chat", "trace.n_sessions=5", *QUIET]
    run = run_list(base, ["0.3", "1"], tmp_path / "list")
    assert [p.replay for p in run.points] == [{"marconi": "back_to_back"}] * 2
    for size in ("0.3", "1"):
        point = tmp_path / "list" / point_dir_name(float(size))
        assert_point_equals_scalar(base, size, point, tmp_path / f"scalar_{size}")
    table = pd.read_parquet(tmp_path / "list" / TABLE)
    assert table["cache.size_gb"].tolist() == [0.3, 1.0]
    assert table["run_dir"].tolist() == ["size_gb=0.3", "size_gb=1"]
    summary = json.loads((tmp_path / "list" / "size_gb=1" / "summary.json").read_text())
    assert table["token_hit_rate"].iloc[1] == summary["policies"]["marconi"]["token_hit_rate"]
    assert not (tmp_path / "list" / "summary.json").exists()


# ------------------------------------------------------------------------ which policies
def _obstacle(overrides: list[str]) -> str | None:
    cfg = compose([*overrides, "cache.size_gb=2"])
    plan = plan_run(cfg)
    settings, (spec,) = plan.settings, plan.policies.values()
    model = ModelSpec.from_config(cfg.model)
    step, engine = policy_step(spec, model, settings), plan.engine
    if routes.engine_routes(engine) != routes.REPLAY_ROUTES:
        return f"engine {engine.name}"
    route = routes.choose(routes.Case(step, engine, []))
    if route.taken in routes.BLOCK_ROUTES:
        return None
    return "; ".join(route.refused[name] for name in routes.BLOCK_ROUTES)


VLLM_LLAMA = ["+policy=vllm", "model=llama3_8b", "engine=replay"]


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (VLLM_LLAMA, None),
        ([*VLLM_LLAMA, "+policy.semantics.whole_input_hit=true"], None),
        (["+policy=vllm", "model=marconi_7b", "engine=replay"], "hybrid"),
        (["+policy=vllm", "model=llama3_8b", "engine=timed"], "engine timed"),
        ([*VLLM_LLAMA, "eviction@policy.eviction=fifo"], None),
        (["+policy=clairvoyant_blocks", "model=llama3_8b", "engine=replay"], None),
        (
            [
                *VLLM_LLAMA,
                "eviction@policy.eviction=fifo",
                "+policy.eviction.evicts_inner_nodes=true",
            ],
            "inner nodes",
        ),
        (
            [
                "+policy=clairvoyant_blocks",
                "model=llama3_8b",
                "engine=replay",
                "policy.eviction.page_size=4",
            ],
            "eviction is custom",
        ),
        ([*VLLM_LLAMA, "eviction@policy.eviction=lfu"], "eviction is custom"),
        ([*VLLM_LLAMA, "eviction@policy.eviction=lru"], "refreshes nothing"),
        ([*VLLM_LLAMA, "+policy.semantics.clock=operation"], "semantics"),
        (["+policy=sglang_plus", "model=llama3_8b", "engine=replay"], "admission"),
        ([*VLLM_LLAMA, "cache.host_gb=10", "cache.host_bw_gbps=inf"], "host tier"),
    ],
)
def test_fast_path_only_for_an_lru_fifo_or_belady_over_whole_blocks(overrides, why):
    found = _obstacle(overrides)
    assert found is None if why is None else why in str(found), found


def test_fenwick_and_matched_blocks():
    tree = Fenwick(8)
    for stamp, count in [(1, 3), (4, 2), (8, 5), (4, -1)]:
        tree.add(stamp, count)
    assert [tree.prefix(i) for i in (0, 1, 3, 4, 7, 8)] == [0, 3, 3, 4, 4, 9]
    groups = [(0, 2, 0), (2, 3, 4)]  # ranks 0, 1 then 4, 5, 6
    assert [matched_blocks(groups, k) for k in (0, 1, 2, 4, 5, 6, 7, 100)] == [
        0,
        1,
        2,
        2,
        3,
        4,
        5,
        5,
    ]


# ------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ([], "cache.size_gb: an empty list"),
        (["1", "-2"], "cache.size_gb must be a positive number"),
        (["1", "0"], "cache.size_gb must be a positive number"),
        (["1", "1e-9"], "cache.size_gb: smaller than one KV page"),
        (["2", "2.0"], "cache.size_gb: capacity given twice"),
    ],
)
def test_bad_capacities_fail_before_any_work(sizes, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        run_list(["+policy=sglang_plus", "trace=chat", *QUIET], sizes, tmp_path)
    assert not list(tmp_path.glob("**/summary.json")) and not (tmp_path / TABLE).exists()


def test_one_pass_switch_must_be_a_boolean(tmp_path):
    with pytest.raises(ConfigError, match=r"cache\.one_pass: must be true or false"):
        run_list(["+policy=sglang_plus", *QUIET], ["1", "2"], tmp_path, "cache.one_pass=maybe")


def test_command_line_prints_the_table_and_reports_errors_in_one_line(tmp_path):
    def simlab(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "simlab", "+policy=sglang_plus", "trace=chat"]
        cmd += ["trace.n_sessions=3", *QUIET, *args, f"hydra.run.dir={tmp_path / 'run'}"]
        env = os.environ | {"HYDRA_FULL_ERROR": "0"}
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)

    ok = simlab("cache.size_gb=[0.5,inf]")
    assert ok.returncode == 0, ok.stderr
    assert "sglang_plus" in ok.stdout and "back_to_back" in ok.stdout and "inf" in ok.stdout
    assert (tmp_path / "run" / TABLE).is_file()
    assert (tmp_path / "run" / "size_gb=inf" / "records.parquet").is_file()
    bad = simlab("cache.size_gb=[1,-1]")
    assert bad.returncode == 2 and bad.stderr.startswith("simlab: error: cache.size_gb")
    assert "Traceback" not in bad.stderr


def test_report_of_a_capacity_list_is_a_sweep_report_over_the_capacities(tmp_path):
    """``report=true`` with a list draws ``<out>/report.pdf``: a sweep report whose points are the
    capacities (read from ``capacities.parquet``), the contention curve among its pages."""
    from simlab.report.build import CONTENTION, PROVENANCE, SUMMARY, render_report
    from simlab.report.load import SweepResults, load_results

    cmd = [sys.executable, "-m", "simlab", "+policy=sglang_plus", "trace=chat"]
    cmd += ["trace.n_sessions=4", "engine=replay", "bounds.enabled=false", "report=true"]
    cmd += ["cache.size_gb=[0.25,0.5,2]", f"hydra.run.dir={tmp_path / 'run'}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "run"
    assert f"report: {out / 'report.pdf'}" in done.stdout
    assert (out / "report.pdf").read_bytes().startswith(b"%PDF")
    results = load_results(out)
    assert isinstance(results, SweepResults) and results.swept_keys == ["cache.size_gb"]
    assert [results.values(p)["cache.size_gb"] for p in results.point_ids] == [0.25, 0.5, 2.0]
    assert results.point_dirs[2] == out / "size_gb=2"
    report = render_report(out, tmp_path / "again.pdf")
    assert report.kind == "sweep" and CONTENTION in report.pages
    assert report.pages[0] == SUMMARY and report.pages[-1] == PROVENANCE
    table = pd.read_parquet(out / TABLE)
    assert report.table["token_hit_rate"].tolist() == table["token_hit_rate"].tolist()


# ------------------------------------------------------------------------ resume
def test_finished_capacities_are_skipped_and_other_results_kept(tmp_path):
    base = ["+policy=sglang_plus", "trace=chat", "trace.n_sessions=4", *QUIET]
    out = tmp_path / "list"
    run_list(base, ["0.5", "1"], out)
    stamps = {
        n: (out / n / "summary.json").stat().st_mtime_ns for n in ("size_gb=0.5", "size_gb=1")
    }
    again = run_list(base, ["0.5", "1", "2"], out)
    assert [p.replay.get("sglang_plus", "resumed") for p in again.points] == [
        "resumed",
        "resumed",
        "back_to_back",
    ]
    assert {n: (out / n / "summary.json").stat().st_mtime_ns for n in stamps} == stamps
    table = pd.read_parquet(out / TABLE)
    assert table["replay"].tolist() == ["resumed", "resumed", "back_to_back"]
    assert table["token_hit_rate"].notna().all()
    other = [*base, "metrics.request_hit_min_tokens=8"]  # another config, same directories
    with pytest.raises(ConfigError, match="holds results of another config"):
        run_list(other, ["0.5", "2"], out)
    assert {n: (out / n / "summary.json").stat().st_mtime_ns for n in stamps} == stamps
    replaced = run_list(other, ["0.5"], out, "overwrite=true")
    assert replaced.points[0].replay == {"sglang_plus": "back_to_back"}


def test_a_timed_capacity_list_table_shows_ttft_and_the_load_verdict(tmp_path):
    """Case 8 of issue 78: the capacity-list table of a timed run printed hit rates only."""
    overrides = ["+policy=sglang_plus", "trace=chat", "trace.n_sessions=3", "bounds.enabled=false"]
    overrides += ["report=false", "engine=timed", "reuse_breakdown=false"]
    run = run_capacities(compose([*overrides, "cache.size_gb=[0.5,2]", f"output_dir={tmp_path}"]))
    header, *rows = run.table_text().splitlines()
    assert "TTFT p50 s" in header and "TTFT p95 s" in header and "load" in header
    verdicts = run.table.column("load").to_pylist()
    assert len(rows) == 2 and all(v in ("ok", "queueing", "saturated") for v in verdicts)
    assert all(row.split()[-2] in ("ok", "queueing", "saturated") for row in rows)
