"""Read a results directory (a run or a sweep) from its saved files, and nothing else.

A *run* directory holds ``summary.json`` and ``records.parquet`` (optionally ``occupancy.parquet``,
written by the timed engine). A *sweep* directory holds ``points.parquet`` (one row per sweep
point and policy) and one run directory per point. Every file is checked on load: a missing,
unreadable or incomplete file raises :class:`ReportInputError` naming it.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simlab.report.style import order_policies

log = logging.getLogger(__name__)

SUMMARY = "summary.json"
RECORDS = "records.parquet"
OCCUPANCY = "occupancy.parquet"
POINTS = "points.parquet"
#: the table of a capacity list (``cache.size_gb=[...]``, :mod:`simlab.run.capacities`): a sweep over
#: ``cache.size_gb`` without the ``point`` column (numbered here in row order of first appearance)
CAPACITIES = "capacities.parquet"

SUMMARY_KEYS = ("policies", "trace", "config")
RECORD_COLUMNS = ("policy", "request_id", "arrival", "input_tokens", "hit_tokens")
OCCUPANCY_COLUMNS = ("policy", "time", "kv_bytes", "ssm_bytes")
#: Timed-engine record columns (NaN when the replay engine ran).
TIMING_COLUMNS = ("ttft", "queue_delay", "tpot", "e2e", "prefill_time")
#: Columns of points.parquet that are neither swept keys nor metrics.
POINT_META = ("point", "policy", "run_dir", "replay")


class ReportInputError(ValueError):
    """A results file is missing, unreadable or incomplete; the message names the file."""


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ReportInputError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportInputError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise ReportInputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_parquet(path: Path, required: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        raise ReportInputError(f"{path}: file not found")
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several types for truncated/corrupt files
        raise ReportInputError(f"{path}: unreadable parquet ({type(err).__name__}: {err})") from err
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ReportInputError(f"{path}: missing column(s) {', '.join(missing)}")
    return frame


def check_summary(path: Path, data: dict[str, Any]) -> None:
    missing = [k for k in SUMMARY_KEYS if k not in data]
    if missing:
        raise ReportInputError(f"{path}: missing key(s) {', '.join(missing)}")
    for key in SUMMARY_KEYS:
        if not isinstance(data[key], dict):
            raise ReportInputError(f"{path}: {key!r} must be an object")
    if not data["policies"]:
        raise ReportInputError(f"{path}: 'policies' is empty")
    for name, metrics in data["policies"].items():
        if not isinstance(metrics, dict):
            raise ReportInputError(f"{path}: policies[{name!r}] must be an object of metrics")


@dataclass
class RunResults:
    """One run directory: its summary, its per-request records and its cache occupancy."""

    path: Path
    summary: dict[str, Any]
    records: pd.DataFrame
    occupancy: pd.DataFrame  # columns policy, time, kv_bytes, ssm_bytes
    occupancy_source: str

    @property
    def kind(self) -> str:
        return "run"

    @property
    def policies(self) -> list[str]:
        return order_policies(self.summary["policies"])

    @property
    def config(self) -> dict[str, Any]:
        return self.summary["config"]

    @property
    def trace(self) -> dict[str, Any]:
        return self.summary["trace"]

    @property
    def has_ttft(self) -> bool:
        return "ttft" in self.records.columns and bool(self.records["ttft"].notna().any())

    def policy_records(self, policy: str) -> pd.DataFrame:
        return self.records[self.records["policy"] == policy]

    def files(self) -> list[Path]:
        names = [SUMMARY, RECORDS] + ([OCCUPANCY] if self.occupancy_source == OCCUPANCY else [])
        return [self.path / n for n in names]


def load_run(path: Path) -> RunResults:
    """Load and check a run directory (:class:`ReportInputError` naming the bad file)."""
    path = Path(path)
    summary = read_json(path / SUMMARY)
    check_summary(path / SUMMARY, summary)
    records = read_parquet(path / RECORDS, RECORD_COLUMNS)
    in_records, in_summary = set(records["policy"].astype(str)), set(summary["policies"])
    if in_records != in_summary:
        raise ReportInputError(
            f"{path / RECORDS}: policies {sorted(in_records)} do not match "
            f"{path / SUMMARY} policies {sorted(in_summary)}"
        )
    if (path / OCCUPANCY).exists():
        occupancy = read_parquet(path / OCCUPANCY, OCCUPANCY_COLUMNS)
        source = OCCUPANCY
    else:
        occupancy, source = occupancy_from_records(records), RECORDS
    return RunResults(path, summary, records, occupancy, source)


def occupancy_from_records(records: pd.DataFrame) -> pd.DataFrame:
    """Cache contents after each request's admission, against its arrival time (s).

    Records are in processing order; without arrival times the time axis is that order.
    """
    if not {"cache_kv_bytes", "cache_ssm_bytes"} <= set(records.columns):
        return pd.DataFrame(columns=list(OCCUPANCY_COLUMNS))
    time = records["arrival"].astype(float)
    if not np.isfinite(time).all():
        time = records.groupby("policy").cumcount().astype(float)
    return pd.DataFrame(
        {
            "policy": records["policy"].to_numpy(),
            "time": time.to_numpy(),
            "kv_bytes": records["cache_kv_bytes"].to_numpy(),
            "ssm_bytes": records["cache_ssm_bytes"].to_numpy(),
        }
    )


@dataclass
class SweepResults:
    """A sweep directory: ``points.parquet`` plus one run directory per point (loaded lazily)."""

    path: Path
    points: pd.DataFrame
    keys: list[str]  # swept override keys, in column order
    point_dirs: dict[int, Path]
    table: str = POINTS  # the file the points came from (CAPACITIES for a capacity list)
    _runs: dict[int, RunResults] = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        return "sweep"

    @property
    def policies(self) -> list[str]:
        return order_policies(self.points["policy"].astype(str).unique())

    @property
    def point_ids(self) -> list[int]:
        return sorted(self.point_dirs)

    @property
    def swept_keys(self) -> list[str]:
        """Override keys that take more than one value across the points (the others are
        fixed overrides of every point, e.g. ``engine=replay``)."""
        return [k for k in self.keys if self.points[k].nunique(dropna=False) > 1]

    @property
    def fixed(self) -> dict[str, Any]:
        """Override keys with one value for every point, and that value."""
        return {k: self.points[k].iloc[0] for k in self.keys if k not in self.swept_keys}

    def keep(self, point: int, run: RunResults) -> None:
        """Hold ``run``, loaded already, as ``point``'s."""
        self._runs[point] = run

    def run(self, point: int) -> RunResults:
        if point not in self._runs:
            self._runs[point] = load_run(self.point_dirs[point])
        return self._runs[point]

    @cached_property
    def base(self) -> RunResults:
        """The first point's run: its config (minus the swept keys) is the sweep's base config."""
        return self.run(self.point_ids[0])

    def values(self, point: int) -> dict[str, Any]:
        """The swept keys' values at ``point`` (fixed overrides are the same everywhere)."""
        row = self.points[self.points["point"] == point].iloc[0]
        return {k: row[k] for k in self.swept_keys}

    def files(self) -> list[Path]:
        return [self.path / self.table] + [f for p in self.point_ids for f in self.run(p).files()]


def load_sweep(path: Path) -> SweepResults:
    """Load ``points.parquet`` (or a capacity list's ``capacities.parquet``) and check that every
    point has its run directory."""
    path = Path(path)
    table = CAPACITIES if not (path / POINTS).exists() and (path / CAPACITIES).exists() else POINTS
    if table == CAPACITIES:
        points = read_parquet(path / table, ("run_dir", "policy"))
        numbers = {d: i for i, d in enumerate(dict.fromkeys(points["run_dir"]))}
        points.insert(0, "point", points["run_dir"].map(numbers))
    else:
        points = read_parquet(path / table, ("point", "policy"))
    if points.empty:
        raise ReportInputError(f"{path / table}: no rows")
    try:
        points["point"] = points["point"].astype(int)
    except (TypeError, ValueError) as err:
        raise ReportInputError(f"{path / table}: column 'point' is not integer ({err})") from err
    point_dirs = find_point_dirs(path, points, table)
    first = load_run(point_dirs[min(point_dirs)])
    metrics = {m for d in point_dirs.values() for m in point_metrics(d / SUMMARY)}
    keys = [c for c in points.columns if c not in POINT_META and c not in metrics]
    for key in keys:  # a swept ``null`` (policy.prefix_match_unit=null,16) is a value, not NaN
        column = points[key]
        if column.isna().any() and column.notna().any():
            points[key] = column.astype(object).where(column.notna(), "null")
    sweep = SweepResults(path, points, keys, point_dirs, table)
    sweep.keep(min(point_dirs), first)
    return sweep


def point_metrics(path: Path) -> set[str]:
    """The metric names of a point's ``summary.json`` (every policy's; points may differ, e.g.
    a single replica has no routing metrics): the other columns of points.parquet are keys."""
    policies = read_json(path).get("policies")
    if not isinstance(policies, dict):
        raise ReportInputError(f"{path}: no 'policies' object")
    return {m for policy in policies.values() for m in policy}


def find_point_dirs(path: Path, points: pd.DataFrame, table: str = POINTS) -> dict[int, Path]:
    """Map each point to its run directory: column ``run_dir`` if present (relative to the sweep
    directory), else the subdirectory named by the point number (``3``, ``point_3``, ``003``)."""
    if "run_dir" in points.columns:
        pairs = points.drop_duplicates("point")[["point", "run_dir"]].itertuples(index=False)
        found = {int(p): path / str(d) for p, d in pairs}
    else:
        found = {}
        for sub in sorted(p for p in path.iterdir() if p.is_dir()):
            match = re.fullmatch(r"(?:point[_-]?)?0*(\d+)", sub.name)
            if match:
                found.setdefault(int(match.group(1)), sub)
    wanted = sorted(points["point"].unique())
    missing = [p for p in wanted if p not in found or not (found[p] / SUMMARY).exists()]
    if missing:
        where = found.get(missing[0], path / str(missing[0]))
        raise ReportInputError(
            f"{path / table}: point {missing[0]} has no run directory ({where / SUMMARY} not found)"
        )
    return {int(p): found[p] for p in wanted}


def load_results(path: Path) -> RunResults | SweepResults:
    """A sweep if ``points.parquet`` (or ``capacities.parquet``) is there, else a run."""
    path = Path(path)
    if not path.is_dir():
        raise ReportInputError(f"{path}: not a directory")
    if (path / POINTS).exists() or (path / CAPACITIES).exists():
        return load_sweep(path)
    if (path / SUMMARY).exists() or (path / RECORDS).exists():
        return load_run(path)
    raise ReportInputError(
        f"{path}: neither a run directory ({SUMMARY}, {RECORDS}) nor a sweep directory ({POINTS})"
    )


def metric(metrics: dict[str, Any], key: str) -> float:
    """A summary metric as a float; NaN when absent or not a number (e.g. replay TTFT)."""
    value = metrics.get(key)
    if isinstance(value, str):  # summary.json may carry non-finite numbers as strings
        try:
            return float(value)
        except ValueError:
            return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)
