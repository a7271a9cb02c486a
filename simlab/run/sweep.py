"""Sweeps: resume of finished points, and the tidy table of a sweep's results.

A sweep is a Hydra multirun (``python -m simlab -m +sweep=NAME`` or ``+experiment=NAME``, see
``configs/sweep/`` and ``configs/experiment/``), run by a Hydra launcher (by default simlab's
joblib launcher, ``hydra_plugins.simlab_launcher.grouped``: the points sharing a trace run in one
worker task and share the loaded trace; Hydra's joblib, Ray or submitit/SLURM). Each point is one Hydra job that writes ``records.parquet``,
``occupancy.parquet`` and ``summary.json`` (last, atomically) into its job directory
``<sweep dir>/<job num>``.

Resume. The sweep configs set a fixed ``hydra.sweep.dir``, so rerunning an interrupted sweep
finds its points again: a point is *finished* when its ``summary.json`` exists and the config and
code version stored in it (``provenance.code_version``: commit plus a digest of uncommitted
changes) equal the point's; :func:`simlab.run.simulate.simulate` then returns the stored summary
without running anything (and logs ``sweep point already finished``). A directory holding results
of another config or code version is never written over silently: the point stops with a
:class:`~simlab.config.ConfigError` naming what differs, unless ``overwrite=true``
(:func:`check_no_overwrite`).

Table. :func:`aggregate` (``python -m simlab.run.sweep aggregate DIR``, and automatically at the end
of a multirun through :class:`AggregatePoints`) writes ``<sweep dir>/points.parquet``, one row
per (point, policy), columns:

* ``point``: the Hydra job number (int); ``run_dir``: the point's directory, relative to the
  sweep directory;
* one column per override key of the point's jobs (``cache.size_gb``, ``policy.alpha``,
  ``arrivals.session_rate``, ``trace``, ...; leading ``+`` dropped), typed (numbers stay
  numbers); the config-selecting keys ``sweep``, ``experiment`` and ``policy`` (the ``policy``
  column already names it) are left out. Parquet schema metadata ``simlab.sweep_keys`` lists
  these columns;
* ``policy`` and every metric of that policy's ``summary.json`` entry (non-scalar values, such
  as ``alpha_history``, as JSON strings).

Only points of the sweep described by ``<sweep dir>/multirun.yaml`` are included (a point left
over from an earlier, different sweep in the same directory is skipped), and a point without
``summary.json`` (unfinished) is reported and left out. The file is replaced atomically.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf

from simlab.config import ConfigError
from simlab.engines.records import strict_json
from traces.arrow_numpy import from_optional
from traces.atomic import atomic_path

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

POINTS = "points.parquet"
#: a capacity-list run's table (:mod:`simlab.run.capacities`) and its size column
CAPACITIES = "capacities.parquet"
SIZE_KEY = "cache.size_gb"
SUMMARY = "summary.json"
RECORDS = "records.parquet"
#: Override keys that select configs rather than set parameters.
SELECTION_KEYS = frozenset({"sweep", "experiment", "policy"})
META_KEY = b"simlab.sweep_keys"


# ---------------------------------------------------------------------------------- resume
def is_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _normalised(value: Any) -> Any:
    """``value`` as ``summary.json`` stores it (strict JSON), so a stored config compares equal
    to the config that wrote it."""
    return json.loads(json.dumps(strict_json(value), sort_keys=True, default=str))


def stored_results(out_dir: Path) -> dict[str, Any] | None:
    """The summary of the results in ``out_dir`` (None when there are none, or unreadable)."""
    path = Path(out_dir) / SUMMARY
    if not (path.is_file() and (Path(out_dir) / RECORDS).is_file()):
        return None
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        log.warning("%s unreadable (%s): running the point again", path, err)
        return None
    return stored if isinstance(stored, dict) and stored.get("policies") else None


def differences(stored: dict[str, Any], config: dict[str, Any], code: str) -> list[str]:
    """How stored results differ from a run of ``config`` on code ``code`` (empty: the same).
    ``overwrite`` is a permission, not a parameter: it is not compared."""
    old, new = _flat(_normalised(stored.get("config"))), _flat(_normalised(config))
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    keys = [k for k in keys if k != "overwrite"]
    out = [f"config ({', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''})"] if keys else []
    stored_code = (stored.get("provenance") or {}).get("code_version", "unrecorded")
    if stored_code != code:
        out.append(f"code version ({stored_code} -> {code})")
    return out


def finished_summary(out_dir: Path, config: dict[str, Any], code: str) -> dict[str, Any] | None:
    """The stored summary of a finished point of ``config`` run by code ``code``, else None."""
    stored = stored_results(out_dir)
    return stored if stored is not None and not differences(stored, config, code) else None


def check_no_overwrite(out_dir: Path, config: dict[str, Any], code: str, overwrite: bool) -> None:
    """Refuse (:class:`ConfigError`) to write over results of another config or code version
    in ``out_dir`` unless ``overwrite``; they are replaced only when asked."""
    stored = stored_results(out_dir)
    changed = [] if stored is None else differences(stored, config, code)
    if not changed:
        return
    if overwrite:
        log.warning("replacing the results in %s (other %s)", out_dir, " and ".join(changed))
        return
    raise ConfigError(
        f"output_dir: {out_dir} holds results of another {' and '.join(changed)}; "
        "pass overwrite=true to replace them, or another output_dir / hydra.sweep.dir"
    )


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out |= _flat(item, f"{prefix}.{key}" if prefix else str(key))
    return out


# ---------------------------------------------------------------------------------- points
def expected_jobs(sweep_dir: Path) -> list[list[str]] | None:
    """Each job's overrides, in job-number order, as Hydra's basic sweeper generates them from
    ``multirun.yaml`` (None when that file is missing or the sweeper is another one)."""
    path = Path(sweep_dir) / "multirun.yaml"
    if not path.is_file():
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = OmegaConf.load(path)
    sweeper = OmegaConf.select(cfg, "hydra.sweeper._target_", default="")
    if not str(sweeper).endswith("BasicSweeper"):
        return None
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None) or {}
    args = [f"{k}={v}" for k, v in params.items()]
    args += list(OmegaConf.select(cfg, "hydra.overrides.task", default=None) or [])
    try:
        overrides = OverridesParser.create().parse_overrides(args)
        batches = BasicSweeper.split_arguments(overrides, None)
    except Exception as err:  # noqa: BLE001 - e.g. a sweep syntax only another sweeper knows
        log.warning("%s: cannot list the sweep's jobs (%s); taking every point", path, err)
        return None
    return [job for batch in batches for job in batch]


def point_dirs(sweep_dir: Path) -> dict[int, Path]:
    """Job number -> job directory, for every job directory under ``sweep_dir``."""
    found: dict[int, Path] = {}
    for marker in sorted(Path(sweep_dir).glob("**/.hydra/overrides.yaml")):
        job_dir = marker.parent.parent
        num = _job_num(job_dir)
        if num is not None:
            found.setdefault(num, job_dir)
    return found


def _job_num(job_dir: Path) -> int | None:
    if job_dir.name.isdigit():
        return int(job_dir.name)
    hydra_yaml = job_dir / ".hydra" / "hydra.yaml"
    if not hydra_yaml.is_file():
        return None
    num = (yaml.safe_load(hydra_yaml.read_text()) or {}).get("hydra", {}).get("job", {}).get("num")
    return int(num) if num is not None else None


def override_values(overrides: Iterable[str]) -> dict[str, Any]:
    """``key -> typed value`` of a job's overrides (selection keys and deletions left out)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    values: dict[str, Any] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group + (f"@{override.package}" if override.package else "")
        if override.is_delete() or key in SELECTION_KEYS:
            continue
        values[key] = override.value()
    return values


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def column_kind(values: Sequence[Any]) -> str:
    """What one column of a tidy table holds: ``number``, ``bool`` or ``str``, or ``empty``
    (every value missing); a mixed column is strings."""
    present = [v for v in values if not _missing(v)]
    if not present:
        return "empty"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return "number"
    return "bool" if all(isinstance(v, bool) for v in present) else "str"


def _tidy(column: pd.Series) -> pd.Series:
    """One type per column (:func:`column_kind`: pyarrow needs it); gaps are null."""
    import pandas as pd

    kind = column_kind(list(column))
    if kind == "empty":
        return column
    if kind == "number":
        return pd.to_numeric(column)
    convert = (lambda v: v) if kind == "bool" else str
    return pd.Series(
        [None if _missing(v) else convert(v) for v in column], index=column.index, dtype=object
    )


def tidy_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """``rows`` as the table :func:`write_points` writes of ``pandas.DataFrame(rows)`` with
    :func:`_tidy` columns, without pandas: one column per key (in order of first appearance),
    typed by :func:`column_kind`; whole numbers stay integers unless a value is missing."""
    names = dict.fromkeys(key for row in rows for key in row)
    # a key a row lacks is NaN there, as in pandas.DataFrame(rows)
    columns = {name: [row.get(name, math.nan) for row in rows] for name in names}
    return pa.table({name: _tidy_array(values) for name, values in columns.items()})


def _tidy_array(values: list[Any]) -> pa.Array:
    kind = column_kind(values)
    missing = [_missing(v) for v in values]
    if kind == "empty":
        if any(isinstance(v, float) for v in values):
            return from_optional([None] * len(values), pa.float64())
        return pa.nulls(len(values))
    if kind == "number":
        if not any(missing) and all(isinstance(v, int) for v in values):
            return from_optional(values, pa.int64())
        floats = [None if m else float(v) for v, m in zip(values, missing, strict=True)]
        return from_optional(floats, pa.float64())
    convert, arrow = (bool, pa.bool_()) if kind == "bool" else (str, pa.string())
    return from_optional(
        [None if m else convert(v) for v, m in zip(values, missing, strict=True)], arrow
    )


def capacity_rows(point: int, run_dir: str, params: dict[str, Any], table: Path):
    """The rows of a job that ran a capacity list (its ``capacities.parquet``): each size's
    rows, with that size as ``cache.size_gb`` and its own directory as ``run_dir``."""
    for row in pq.read_table(table).to_pylist():
        size = {SIZE_KEY: row.pop(SIZE_KEY)}
        row["run_dir"] = f"{run_dir}/{row['run_dir']}" if row.get("run_dir") else run_dir
        yield {"point": point, "run_dir": row.pop("run_dir")} | params | size | row


def point_rows(point: int, run_dir: str, params: dict[str, Any], summary: dict[str, Any]):
    for policy, metrics in summary["policies"].items():
        row: dict[str, Any] = {"point": point, "run_dir": run_dir}
        row.update({k: _scalar(v) for k, v in params.items()})
        row["policy"] = policy
        row.update({k: _scalar(v) for k, v in metrics.items() if k not in row})
        yield row


def collect(sweep_dir: Path) -> tuple[pd.DataFrame, list[str], list[int]]:
    """(rows, override-key columns, unfinished points) of a sweep directory."""
    import pandas as pd

    sweep_dir = Path(sweep_dir)
    expected = expected_jobs(sweep_dir)
    dirs = point_dirs(sweep_dir)
    rows: list[dict[str, Any]] = []
    keys: dict[str, None] = {}
    unfinished: list[int] = []
    for num, job_dir in sorted(dirs.items()):
        overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or []
        if expected is not None and (num >= len(expected) or overrides != expected[num]):
            log.info("%s: left over from another sweep, skipped", job_dir)
            continue
        params = override_values(overrides)
        run_dir = job_dir.relative_to(sweep_dir).as_posix()
        if (job_dir / SUMMARY).is_file():
            summary = json.loads((job_dir / SUMMARY).read_text())
            rows.extend(point_rows(num, run_dir, params, summary))
        elif (job_dir / CAPACITIES).is_file():  # a capacity list: one row per size and policy
            rows.extend(capacity_rows(num, run_dir, params, job_dir / CAPACITIES))
        else:
            unfinished.append(num)
            continue
        keys.update(dict.fromkeys(params))
    if expected is not None:
        unfinished = sorted(set(unfinished) | (set(range(len(expected))) - set(dirs)))
    frame = pd.DataFrame(rows)
    for column in frame.columns:
        frame[column] = _tidy(frame[column])
    return frame, list(keys), unfinished


def write_points(frame: pd.DataFrame | pa.Table, keys: Sequence[str], path: Path) -> None:
    """Write the table through a temp file and a rename (readers never see a partial file)."""
    table = (
        frame if isinstance(frame, pa.Table) else pa.Table.from_pandas(frame, preserve_index=False)
    )
    meta = dict(table.schema.metadata or {}) | {META_KEY: json.dumps(list(keys)).encode()}
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def aggregate(sweep_dir: Path) -> pd.DataFrame:
    """Collect a sweep directory into ``points.parquet`` (see the module docstring)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir}: no such sweep directory")
    frame, keys, unfinished = collect(sweep_dir)
    if unfinished:
        log.warning(
            "%s: %d point(s) unfinished, left out: %s", sweep_dir, len(unfinished), unfinished
        )
    if frame.empty:
        log.warning("%s: no finished point; %s not written", sweep_dir, POINTS)
        return frame
    write_points(frame, keys, sweep_dir / POINTS)
    log.info(
        "%s: %d rows (%d points) -> %s",
        sweep_dir,
        len(frame),
        frame["point"].nunique(),
        sweep_dir / POINTS,
    )
    return frame


def _task_overrides(cfg: DictConfig | ListConfig) -> dict[str, Any]:
    """A multirun's parameters: its sweeper's parameters and its command-line overrides, less
    ``overwrite`` (a permission, not a parameter)."""
    task = OmegaConf.select(cfg, "hydra.overrides.task", default=None) or []
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None) or {}
    return {
        "params": {str(k): str(v) for k, v in dict(params).items()},
        "overrides": sorted(str(o) for o in task if not str(o).startswith("overwrite=")),
    }


def sweep_dir_conflict(sweep_dir: Path, cfg: DictConfig, code: str) -> str | None:
    """Why a multirun of ``cfg`` must not write into ``sweep_dir`` (None: it may, fresh or a
    resume): the directory holds another sweep (other parameters or overrides), or points run
    by another code version."""
    previous = Path(sweep_dir) / "multirun.yaml"
    if not previous.is_file():
        return None
    old, new = _task_overrides(OmegaConf.load(previous)), _task_overrides(cfg)
    if old != new:
        return f"{sweep_dir} holds another sweep ({old} -> {new})"
    for point in sorted(point_dirs(sweep_dir).values()):
        stored = stored_results(point)
        stored_code = ((stored or {}).get("provenance") or {}).get("code_version")
        if stored_code is not None and stored_code != code:
            return f"{point} holds results of code version {stored_code} (now {code})"
    return None


class ProtectSweepDir(Callback):
    """Hydra callback: before a multirun writes anything (its ``multirun.yaml`` included),
    refuse a sweep directory that holds another sweep or another code version's points, with
    one line and exit status 2, unless ``overwrite=true``."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from simlab.util.provenance import code_version

        sweep_dir = Path(str(config.hydra.sweep.dir))
        problem = sweep_dir_conflict(sweep_dir, config, code_version())
        if problem is None:
            return
        if config.get("overwrite"):
            log.warning("overwrite=true: replacing results: %s", problem)
            return
        sys.stderr.write(  # the command line's one-line error (Hydra would add a traceback)
            f"simlab: error: hydra.sweep.dir: {problem}; pass overwrite=true to replace them, "
            "or choose another hydra.sweep.dir\n"
        )
        raise SystemExit(2)


class AggregatePoints(Callback):
    """Hydra callback: aggregate the sweep directory when a multirun ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            aggregate(Path(str(config.hydra.sweep.dir)))
        except (
            Exception
        ):  # the points are on disk; `python -m simlab.run.sweep aggregate` redoes it
            log.exception("aggregating %s failed", config.hydra.sweep.dir)


# ---------------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simlab.run.sweep", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    agg = sub.add_parser("aggregate", help=f"write DIR/{POINTS} from a (finished or not) sweep")
    agg.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    status = 0
    for sweep_dir in args.dirs:
        try:
            frame = aggregate(sweep_dir)
        except FileNotFoundError as err:
            log.error("%s", err)
            status = 1
            continue
        if frame.empty:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
