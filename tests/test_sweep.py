"""Sweeps: config files, launchers (joblib, Ray), resume of finished points, points.parquet."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from simlab.config import run_settings, selected_policies
from simlab.engines.replay import ReplayEngine
from simlab.model.spec import ModelSpec
from simlab.run.simulate import build_engine, policy_spec, policy_step
from simlab.run.sweep import (
    META_KEY,
    _tidy,
    aggregate,
    main,
    sweep_dir_conflict,
    tidy_table,
    write_points,
)
from simlab.util.provenance import code_version
from tests.fixtures import CONFIGS, ROOT

SMALL = ("engine=replay", "trace=chat", "trace.n_sessions=6")
SWEEP_FILES = sorted(
    (group, p.stem) for group in ("sweep", "experiment") for p in (CONFIGS / group).glob("*.yaml")
)


def multirun(sweep_dir: Path, *args: str, status: int = 0) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "simlab", "-m", *args, f"hydra.sweep.dir={sweep_dir}"]
    env = os.environ | {"HYDRA_FULL_ERROR": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == status, proc.stderr[-3000:]
    return proc


def check_points(sweep_dir: Path, points: int, policies: int) -> pd.DataFrame:
    frame = pd.read_parquet(sweep_dir / "points.parquet")
    assert len(frame) == points * policies
    assert not frame.duplicated(["point", "policy"]).any()
    assert frame["point"].dtype == "int64" and sorted(frame["point"].unique()) == list(
        range(points)
    )
    for _, row in frame.iterrows():
        summary = json.loads((sweep_dir / row["run_dir"] / "summary.json").read_text())
        assert summary["policies"][row["policy"]]["token_hit_rate"] == row["token_hit_rate"]
    return frame


# ---------------------------------------------------------------------------------- joblib
def test_joblib_sweep_aggregates_and_resumes_without_redoing_points(tmp_path):
    sweep = tmp_path / "sweep"
    multirun(sweep, "+sweep=cache_size", *SMALL, "cache.size_gb=0.5,1")
    frame = check_points(sweep, points=2, policies=3)
    assert {"cache.size_gb", "engine", "trace", "trace.n_sessions"} <= set(frame.columns)
    assert frame["cache.size_gb"].dtype == "float64"
    assert set(frame["policy"]) == {"vllm_plus", "sglang_plus", "marconi"}
    keys = json.loads(pq.read_schema(sweep / "points.parquet").metadata[META_KEY])
    assert keys == ["cache.size_gb", "engine", "trace", "trace.n_sessions"]

    # interruption: point 1 never finished
    (sweep / "1" / "summary.json").unlink()
    (sweep / "points.parquet").unlink()
    assert main(["aggregate", str(sweep)]) == 0
    assert set(pd.read_parquet(sweep / "points.parquet")["point"]) == {0}
    kept = (sweep / "0" / "summary.json").stat().st_mtime_ns

    multirun(sweep, "+sweep=cache_size", *SMALL, "cache.size_gb=0.5,1")
    assert (sweep / "0" / "summary.json").stat().st_mtime_ns == kept  # not redone
    assert "sweep point already finished" in (sweep / "0" / "__main__.log").read_text()
    assert "sweep point already finished" not in (sweep / "1" / "__main__.log").read_text()
    assert (sweep / "1" / "summary.json").exists()
    check_points(sweep, points=2, policies=3)


def test_results_of_another_config_are_replaced_only_when_asked(tmp_path):
    """Issue 18: a second sweep into the same directory used to rerun and overwrite the first
    one's points silently; now it refuses, naming the key, until overwrite=true."""
    sweep = tmp_path / "sweep"
    multirun(sweep, "+policy=sglang_plus", *SMALL, "cache.size_gb=0.5,1")
    before = (sweep / "1" / "summary.json").stat().st_mtime_ns
    refused = multirun(sweep, "+policy=sglang_plus", *SMALL, "cache.size_gb=0.5,2", status=2)
    assert "holds results of another config (cache.size_gb)" in refused.stderr
    assert "overwrite=true" in refused.stderr
    assert (sweep / "1" / "summary.json").stat().st_mtime_ns == before
    multirun(sweep, "+policy=sglang_plus", *SMALL, "cache.size_gb=0.5,2", "overwrite=true")
    assert (sweep / "1" / "summary.json").stat().st_mtime_ns != before
    assert main(["aggregate", str(sweep)]) == 0
    frame = check_points(sweep, points=2, policies=1)
    assert frame["cache.size_gb"].tolist() == [0.5, 2.0]


def test_jobs_that_run_a_capacity_list_give_one_row_per_size(tmp_path, caplog):
    """A job whose cache.size_gb is a list writes capacities.parquet and one directory per
    size, no summary.json of its own: it is finished, not "unfinished"."""
    sweep = tmp_path / "sweep"
    multirun(sweep, "+policy=fifo", *SMALL, "cache.size_gb=[0.5,1]", "seed=0,1")
    assert main(["aggregate", str(sweep)]) == 0
    assert "unfinished" not in caplog.text and "not written" not in caplog.text
    frame = pd.read_parquet(sweep / "points.parquet")
    for _, row in frame.iterrows():  # each size's row is its own directory's summary
        summary = json.loads((sweep / row["run_dir"] / "summary.json").read_text())
        assert summary["policies"]["fifo"]["token_hit_rate"] == row["token_hit_rate"]
    assert sorted(zip(frame["point"], frame["cache.size_gb"], strict=True)) == [
        (0, 0.5), (0, 1.0), (1, 0.5), (1, 1.0)
    ]  # fmt: skip
    assert set(frame["seed"]) == {0, 1} and set(frame["policy"]) == {"fifo"}


# ------------------------------------------------------------------------- grouped launcher
def test_points_are_grouped_by_their_trace_overrides_in_sweep_order():
    from hydra_plugins.simlab_launcher.grouped import group_points, split_for_workers

    jobs = [
        ["trace=chat", "cache.size_gb=1", "+policy=lru"],
        ["trace=chat", "cache.size_gb=2", "+policy=lru"],
        ["trace=swebench", "cache.size_gb=1", "+policy=lru"],
        ["trace=chat", "+trace.limit=5", "cache.size_gb=1", "+policy=lru"],
        ["trace=chat", "cache.size_gb=3", "arrivals.session_rate=2", "+policy=lru"],
        ["cache.size_gb=4", "trace=chat", "+policy=lru"],
        ["trace=chat", "cache.size_gb=5", "seed=1", "data_dir=/d", "+policy=lru"],
    ]
    assert group_points(jobs) == [[0, 1, 5], [2], [3], [4], [6]]
    assert split_for_workers([[0, 1, 5], [2]], workers=2) == [[0, 1, 5], [2]]
    assert split_for_workers([[0, 1, 2, 3, 4, 5]], workers=2) == [[0, 1, 2], [3, 4, 5]]
    assert split_for_workers([[0, 1, 2, 3, 4], [5]], workers=4) == [[0, 1], [2, 3], [4], [5]]
    assert split_for_workers([[0]], workers=8) == [[0]]


def test_grouped_launcher_shares_the_trace_and_writes_what_joblib_writes(tmp_path):
    """Two traces x two capacities on two workers: one task per trace, the second point of each
    reuses the loaded trace, and every point's records are byte for byte the joblib
    launcher's (one task per point)."""
    args = ("+sweep=cache_size", "+policy=sglang_plus", *SMALL[:2], "trace.n_sessions=6,8")
    grid = (*args, "cache.size_gb=0.5,1", "hydra.launcher.n_jobs=2")
    grouped, plain = tmp_path / "grouped", tmp_path / "joblib"
    proc = multirun(grouped, *grid, "hydra/launcher=simlab_joblib")
    assert "4 points in 2 tasks" in proc.stderr + proc.stdout
    multirun(plain, *grid, "hydra/launcher=joblib")
    jobs = {p.name: p for p in grouped.iterdir() if p.is_dir()}
    assert sorted(jobs) == ["0", "1", "2", "3"]
    shared = {n for n, p in jobs.items() if "trace shared" in (p / "__main__.log").read_text()}
    first_of_trace: dict[str, str] = {}
    for name in sorted(jobs):
        overrides = yaml.safe_load((jobs[name] / ".hydra" / "overrides.yaml").read_text())
        first_of_trace.setdefault(next(o for o in overrides if "n_sessions" in o), name)
    assert shared == set(jobs) - set(first_of_trace.values()) and len(shared) == 2
    for name in jobs:
        for part in ("records.parquet", "occupancy.parquet"):
            assert (grouped / name / part).read_bytes() == (plain / name / part).read_bytes()
    a, b = (pd.read_parquet(d / "points.parquet") for d in (grouped, plain))
    clock = [c for c in a.columns if "wall" in c or c.endswith("per_s")]
    assert clock and a.drop(columns=clock).equals(b.drop(columns=clock))


# ---------------------------------------------------------------------------------- Ray
@pytest.mark.skipif(
    importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None
    or importlib.util.find_spec("ray") is None,
    reason="Ray launcher not installed (pip install -e '.[ray]')",
)
def test_ray_sweep_on_a_local_ray_instance(tmp_path):
    sweep = tmp_path / "sweep"
    multirun(sweep, "+sweep=alpha", "hydra/launcher=ray_local", *SMALL, "policy.alpha=0,8")
    frame = check_points(sweep, points=2, policies=1)
    assert frame["policy.alpha"].tolist() == [0, 8] and set(frame["policy"]) == {"marconi"}


# ---------------------------------------------------------------------------------- table
def _fake_sweep(root: Path, params: dict[str, str], task: list[str], jobs: list[list[str]]):
    root.mkdir(parents=True)
    hydra = {
        "hydra": {
            "sweeper": {
                "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                "params": params,
            },
            "overrides": {"task": task},
        }
    }
    (root / "multirun.yaml").write_text(yaml.safe_dump(hydra, sort_keys=False))
    for num, overrides in enumerate(jobs):
        job = root / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        summary = {
            "policies": {
                "a": {"token_hit_rate": num / 10, "alpha_history": [1, 2]},
                "b": {"token_hit_rate": 0.5},
            }
        }
        (job / "summary.json").write_text(json.dumps(summary))


def test_table_has_one_row_per_point_and_policy_and_leaves_out_stale_points(tmp_path):
    sweep = tmp_path / "s"
    task = ["+sweep=x", "trace=sharegpt"]
    jobs = [[f"policy.alpha={a}", f"cache.size_gb={c}", *task] for a in (0, 2) for c in (1, 0.5)]
    _fake_sweep(sweep, {"policy.alpha": "0,2", "cache.size_gb": "1,0.5"}, task, jobs)
    stale = sweep / "7"  # left over from an earlier, bigger sweep in the same directory
    (stale / ".hydra").mkdir(parents=True)
    (stale / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["policy.alpha=9", *task]))
    (stale / "summary.json").write_text(json.dumps({"policies": {"a": {"token_hit_rate": 1}}}))
    frame = aggregate(sweep)
    assert len(frame) == 8 and sorted(frame["point"].unique()) == [0, 1, 2, 3]
    assert list(frame.columns[:6]) == [
        "point",
        "run_dir",
        "policy.alpha",
        "cache.size_gb",
        "trace",
        "policy",
    ]
    assert frame["policy.alpha"].dtype == "int64" and frame["cache.size_gb"].dtype == "float64"
    assert frame.loc[frame["policy"] == "a", "alpha_history"].tolist() == ["[1, 2]"] * 4
    assert frame.loc[frame["policy"] == "b", "alpha_history"].isna().all()
    stored = pd.read_parquet(sweep / "points.parquet")
    assert stored.columns.tolist() == frame.columns.tolist()
    assert stored["alpha_history"].isna().sum() == 4


def test_aggregate_cli_fails_on_a_missing_directory(tmp_path):
    assert main(["aggregate", str(tmp_path / "nope")]) == 1


# ---------------------------------------------------------------------------------- configs
def _compose(overrides: list[str], hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return hydra_compose("config", overrides=overrides, return_hydra_config=hydra)


@pytest.mark.parametrize(("group", "name"), SWEEP_FILES)
def test_sweep_and_experiment_files_give_valid_points(group, name):
    """Every value of every swept key composes into a valid run config (nothing is run)."""
    select = f"+{group}={name}"
    cfg = _compose([select], hydra=True)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert cfg.hydra.callbacks.aggregate_points._target_ == "simlab.run.sweep.AggregatePoints"
    assert str(cfg.hydra.sweep.dir).startswith("multirun/")
    params = [f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()]
    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)[0]
    values = {o for job in jobs for o in job}  # each key=value once
    first = jobs[0]
    for value in sorted(values):
        key = value.split("=")[0]
        job = [value if o.split("=")[0] == key else o for o in first]
        point = _compose([select, *job])
        settings = run_settings(point)
        model = ModelSpec.from_config(point.model)
        for policy, pcfg in selected_policies(point).items():
            policy_step(policy_spec(policy, pcfg), model, settings)
        engine = build_engine(point)
        if group == "experiment":
            assert isinstance(engine, ReplayEngine)


@pytest.mark.parametrize(
    ("launcher", "plugin", "target"),
    [
        ("ray_local", "hydra_plugins.hydra_ray_launcher", "RayLauncher"),
        ("slurm", "hydra_plugins.hydra_submitit_launcher", "SlurmLauncher"),
    ],
)
def test_cluster_launcher_configs_compose(launcher, plugin, target):
    if importlib.util.find_spec(plugin) is None:
        pytest.skip(f"{plugin} not installed")
    cfg = _compose(["+sweep=cache_size", f"hydra/launcher={launcher}"], hydra=True)
    assert cfg.hydra.launcher._target_.endswith(target)


def test_another_sweep_is_refused_before_anything_is_written(tmp_path):
    """Issue 18: the refusal used to come point by point, after Hydra had already replaced the
    first sweep's multirun.yaml; the sweep directory is now checked before the multirun starts."""
    sweep = tmp_path / "sweep"
    multirun(sweep, "+sweep=cache_size", *SMALL, "cache.size_gb=0.5,1")
    before = {p: p.read_bytes() for p in [sweep / "multirun.yaml", sweep / "points.parquet"]}
    refused = multirun(sweep, "+sweep=cache_size", *SMALL, "cache.size_gb=0.5,2", status=2)
    assert refused.stderr.strip().count("\n") == 0
    assert refused.stderr.startswith("simlab: error: hydra.sweep.dir: ")
    assert "holds another sweep" in refused.stderr and "overwrite=true" in refused.stderr
    assert {p: p.read_bytes() for p in before} == before
    same = OmegaConf.load(sweep / "multirun.yaml")
    assert sweep_dir_conflict(sweep, same, code_version()) is None  # a resume
    assert "holds results of code version" in sweep_dir_conflict(sweep, same, "other")


def test_a_tidy_table_without_pandas_reads_back_as_the_tidied_frame(tmp_path):
    """``tidy_table`` (capacity lists: no pandas) writes what ``write_points`` writes of the
    DataFrame of the same rows with ``_tidy`` columns (sweeps), column types included: whole
    numbers, numbers with gaps, booleans with gaps, strings, mixed values (strings), and columns
    with nothing in them."""
    nan = float("nan")
    rows = [
        {"point": 0, "size": 1.5, "hit": 0.25, "ok": True, "name": "a", "mixed": 1, "gone": None},
        {
            "point": 1,
            "size": 2.0,
            "hit": None,
            "ok": None,
            "name": None,
            "mixed": "x",
            "gone": None,
        },
        {"point": 2, "size": nan, "hit": 3, "ok": False, "name": "c", "mixed": 2.5, "nan": nan},
    ]
    frame = pd.DataFrame(rows)
    for column in frame.columns:
        frame[column] = _tidy(frame[column])
    write_points(frame, ["size"], tmp_path / "pandas.parquet")
    write_points(tidy_table(rows), ["size"], tmp_path / "arrow.parquet")
    want, got = (pq.read_table(tmp_path / f"{n}.parquet") for n in ("pandas", "arrow"))
    assert got.schema.remove_metadata() == want.schema.remove_metadata()
    assert got.schema.metadata[META_KEY] == want.schema.metadata[META_KEY]
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "arrow.parquet"), pd.read_parquet(tmp_path / "pandas.parquet")
    )
