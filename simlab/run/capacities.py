"""``cache.size_gb=[1,2,5,10]``: every capacity (and every selected policy) in one process.

The trace is loaded and its requests prepared once. Each capacity is a *point*: the run config
with that one scalar ``cache.size_gb`` and ``output_dir=<out>/size_gb=<value>``, checked by
:func:`simlab.run.simulate.plan_run` before any work (a bad capacity is a :class:`ConfigError`
naming ``cache.size_gb``), and written there exactly as a single run of that config writes it
(``records.parquet``, ``occupancy.parquet``, ``summary.json``, whose stored config is the
point's): a point is indistinguishable from, and resumes like, a single run. A point whose
directory already holds finished results of the same config and code is skipped; results of
another config or code are never replaced silently (``overwrite=true`` replaces them;
:func:`simlab.run.sweep.check_no_overwrite`).

Per policy, the capacities run in one replay when the policy has the inclusion property
(:mod:`simlab.fastpaths.stack`: an LRU over whole blocks on the replay engine) and ``cache.one_pass`` is
true; FIFO and Belady on the same block pools replay each capacity on the block ids of one walk
of the trace (:mod:`simlab.fastpaths.blocks.heap`); everything else runs back to back on the shared
requests. The choice is logged. ``wall_s`` of a one-pass or block-heap point is the whole
computation's time shared equally by its capacities.

Top level: ``<out>/capacities.parquet``, one row per (capacity, policy): ``cache.size_gb``,
``run_dir`` (the point's directory, relative), ``policy``, ``replay`` (``one_pass``,
``block_heap``, ``back_to_back`` or ``resumed``) and every metric of that policy's summary entry; written
atomically. ``report=true`` draws ``<out>/report.pdf``, the sweep report of the list (its points
are the capacities: :func:`simlab.report.load.load_sweep` reads this table); ``python -m
simlab.report <point dir>`` draws one capacity's run report.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, ListConfig, open_dict

from simlab.config import ConfigError
from simlab.fastpaths.blocks.replay import Walks
from simlab.run import routes
from simlab.run.breakdown import Counterfactuals
from simlab.run.checks import check_request_fits, check_writable
from simlab.run.plan import ENGINE_POOL, RunPlan, output_dir, plan_run
from simlab.run.policy import PolicyRun, policy_step, run_policy, stacked_runs
from simlab.run.routes import Route
from simlab.run.simulate import finish_run
from simlab.run.summary import Summary, alpha_label
from simlab.run.sweep import (
    CAPACITIES,
    SIZE_KEY,
    _scalar,
    check_no_overwrite,
    finished_summary,
    tidy_table,
    write_points,
)
from simlab.run.trace import trace_requests
from simlab.util.provenance import code_version
from traces.format import Request

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

TABLE = CAPACITIES
#: columns of the printed table (summary key -> header)
TABLE_COLUMNS = {
    "token_hit_rate": "token hit",
    "request_hit_rate": "req hit",
    "flops_saved_ratio": "FLOPs saved",
    "peak_gb": "peak GB",
    "wall_s": "wall s",
}
#: a timed run's columns: TTFT and the load verdict beside the hit rate
TIMED_TABLE_COLUMNS = {"ttft_p50": "TTFT p50 s", "ttft_p95": "TTFT p95 s", "load": "load"}


def capacity_list(cfg: DictConfig) -> list[Any] | None:
    """The capacities of a ``cache.size_gb`` list (None: a scalar, today's single run)."""
    cache = cfg.get("cache")
    value = cache.get("size_gb") if cache is not None else None
    if not isinstance(value, ListConfig | list):
        return None
    if ENGINE_POOL in list(value):
        raise ConfigError(
            f"cache.size_gb: {ENGINE_POOL!r} is the engine's one pool; a list takes numbers of GB"
        )
    return list(value)


def point_dir_name(size: Any) -> str:
    """``size_gb=<value>``: the shortest spelling that reads back as the same number."""
    if isinstance(size, bool) or not isinstance(size, int | float):
        return f"size_gb={size}"
    return f"size_gb={shortest(float(size))}"


def shortest(value: float) -> str:
    """``value`` in ``g`` format when that reads back as the same number, else in full."""
    short = format(value, "g")
    return short if float(short) == value else repr(value)


@dataclass
class Point:
    """One capacity of the list: the plan of its scalar config (its directory among it) and,
    if resumed, its stored summary."""

    size: Any
    plan: RunPlan
    done: Summary | None = None
    replay: dict[str, str] = field(default_factory=dict)  # policy -> how it ran (table)

    @property
    def out_dir(self) -> Path | None:
        """The point's results directory (None: none)."""
        return self.plan.out_dir


@dataclass
class CapacityRun:
    """The points of a capacity list, their summaries and the tidy table."""

    points: list[Point]
    summaries: list[Summary]
    table: pa.Table
    out_dir: Path | None

    def table_text(self) -> str:
        """One line per (capacity, policy): hit rates, peak bytes and how it was replayed."""
        if not self.table.num_rows:
            return "(no capacity)"
        names = self.table.column_names
        extra = [key for key in (*TIMED_TABLE_COLUMNS, "alpha") if key in names]
        keys = [SIZE_KEY, "policy", *TABLE_COLUMNS, *extra, "replay"]
        header = [SIZE_KEY, "policy", *TABLE_COLUMNS.values()]
        header += [TIMED_TABLE_COLUMNS.get(key, key) for key in extra] + ["replay"]
        columns = [self.table.column(key).to_pylist() for key in keys]
        rows = range(len(columns[0]))
        cells = [header] + [[_cell(col[i], j == 0) for j, col in enumerate(columns)] for i in rows]
        widths = [max(len(row[j]) for row in cells) for j in range(len(header))]
        return "\n".join(
            "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
            for row in cells
        )


def _cell(value: Any, size: bool) -> str:
    """A capacity as short as it reads back (GB); a metric to 4 decimals."""
    if isinstance(value, float):
        return shortest(value) if size or value.is_integer() else f"{value:.4f}"
    return "" if value is None else str(value)


def point_config(cfg: DictConfig, size: Any, out_dir: Path | None) -> DictConfig:
    """``cfg`` with the scalar capacity ``size`` and, under a results directory, the point's
    own directory as ``output_dir``."""
    point = copy.deepcopy(cfg)
    with open_dict(point):
        point.cache.size_gb = size
        if out_dir is not None:
            point.output_dir = str(out_dir / point_dir_name(size))
    return point


def plan_points(cfg: DictConfig, sizes: list[Any]) -> list[Point]:
    """Every capacity checked (:func:`simlab.run.simulate.plan_run`) and its results directory
    looked at (resumed or free to write), before any work."""
    if not sizes:
        raise ConfigError("cache.size_gb: an empty list; give at least one capacity")
    names = [point_dir_name(size) for size in sizes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"cache.size_gb: capacity given twice ({', '.join(twice)})")
    top = output_dir(cfg)
    check_writable(top)
    points = []
    for size in sizes:
        point = Point(size, plan_run(point_config(cfg, size, top)))
        point.done = finished(point)
        points.append(point)
    return points


def finished(point: Point) -> Summary | None:
    """The stored summary of a point that already finished with the same config and code (it
    is skipped); :class:`ConfigError` when its directory holds another config's or code's
    results (unless ``overwrite=true``)."""
    plan = point.plan
    if plan.out_dir is None:
        return None
    done = finished_summary(plan.out_dir, plan.config, code_version())
    if done is None:
        check_no_overwrite(plan.out_dir, plan.config, code_version(), plan.overwrite)
        return None
    log.info("capacity %s already finished, skipped: %s", point.size, plan.out_dir)
    return Summary(
        policies=done["policies"],
        trace=done["trace"],
        config=done["config"],
        bounds=done.get("bounds") or {},
        out_dir=plan.out_dir,
    )


def run_capacities(cfg: DictConfig) -> CapacityRun:
    """Run every capacity of ``cache.size_gb`` (a list) and every selected policy; see the
    module docstring."""
    sizes = capacity_list(cfg)
    if sizes is None:
        raise ConfigError("cache.size_gb: not a list; a scalar capacity is a single run")
    points = plan_points(cfg, sizes)
    pending = [p for p in points if p.done is None]
    summaries: dict[int, Summary] = {id(p): p.done for p in points if p.done is not None}
    if pending:
        first = pending[0].plan
        trace, requests = trace_requests(first.trace, first.settings)
        for point in pending:
            check_request_fits(point.plan.settings, point.plan.model, requests)
        runs = run_policies(pending, requests, trace.block_size)
        shared = Counterfactuals()  # the infinite cache's hits, the same at every capacity
        for point in pending:
            point_runs = runs[id(point)]
            summaries[id(point)] = finish_run(point.plan, trace, requests, point_runs, shared)
    ordered = [summaries[id(p)] for p in points]
    top = output_dir(cfg)
    table = capacity_table(points, ordered, top)
    if top is not None:
        write_points(table, [SIZE_KEY], top / TABLE)
        log.info("capacity table written to %s", top / TABLE)
    return CapacityRun(points, ordered, table, top)


def run_policies(
    points: list[Point], requests: list[Request], unit: int
) -> dict[int, dict[str, PolicyRun]]:
    """Each selected policy at every point's capacity: in one pass where the policy allows it
    and ``cache.one_pass`` is on, else back to back. Returns point -> policy -> run."""
    runs: dict[int, dict[str, PolicyRun]] = {id(p): {} for p in points}
    first = points[0].plan.settings
    walks: Walks = {}  # block walks of the requests, shared by the policies
    plans = []
    for name in points[0].plan.policies:
        steps = [
            policy_step(p.plan.policies[name], p.plan.model, p.plan.settings, unit) for p in points
        ]
        case = routes.Case(
            steps[0], points[0].plan.engine, requests, first.cache.one_pass, first.cache.compiled
        )
        plans.append((name, steps, routes.choose(case)))
    heap_runs = sum(route.taken == "block_heap" for _, _, route in plans)
    for name, steps, route in plans:
        if route.taken in routes.BLOCK_ROUTES:
            replay = fast_replay(name, route, len(points))
            stacked = one_pass(name, points, steps, requests, walks, heap_runs, route)
            for point, run in zip(points, stacked, strict=True):
                runs[id(point)][name] = run
                point.replay[name] = replay
            continue
        why = routes.describe(route)
        log.info("%s: back to back for %d capacities (%s)", name, len(points), why)
        for point in points:
            plan = point.plan
            runs[id(point)][name] = run_policy(
                plan.policies[name], requests, plan.model, plan.settings, plan.engine, unit, walks
            )
            point.replay[name] = "back_to_back"
    return runs


def fast_replay(name: str, route: Route, n_points: int) -> str:
    """Log and name how a policy on a block pool's fast path runs its capacities: ``one_pass``
    (an LRU: stack distances) or ``block_heap`` (FIFO, Belady: a heap over block ids each)."""
    if route.taken == "stack_distances":
        log.info("%s: one-pass stack-distance replay for %d capacities", name, n_points)
        return "one_pass"
    log.info("%s: a heap over block ids for %d capacities (one walk)", name, n_points)
    return "block_heap"


def one_pass(
    name: str,
    points: list[Point],
    steps: list[Any],
    requests: list[Request],
    walks: Walks,
    heap_runs: int = 1,
    route: Route | None = None,
) -> list[PolicyRun]:
    """The policy's runs at every point from one walk of the trace (shared in ``walks`` with
    the other policies: :func:`simlab.fastpaths.blocks.replay.block_replay`; ``heap_runs``: the run's
    policies on a heap, which share one numba load)."""
    metrics = [point.plan.settings.metrics for point in points]
    compiled = points[0].plan.settings.cache.compiled
    runs = stacked_runs(name, requests, steps, metrics, walks, compiled, heap_runs, route)
    for point, run in zip(points, runs, strict=True):
        rate = run.summary["token_hit_rate"]
        log.info("%s at %s GB: token hit rate %.4f", name, point.size, rate)
    return runs


def capacity_table(points: list[Point], summaries: list[Summary], top: Path | None) -> pa.Table:
    """One row per (capacity, policy): the capacity, the point's directory, the policy, how
    it was replayed and every metric of its summary entry (sweep tables' types,
    :func:`simlab.run.sweep.tidy_table`; no pandas)."""
    rows: list[dict[str, Any]] = []
    for point, summary in zip(points, summaries, strict=True):
        run_dir = point.out_dir
        if run_dir is not None and top is not None:
            run_dir = run_dir.relative_to(top)
        for policy, metrics in summary.policies.items():
            row: dict[str, Any] = {
                SIZE_KEY: float(point.size),
                "run_dir": None if run_dir is None else run_dir.as_posix(),
                "policy": policy,
                "replay": point.replay.get(policy, "resumed"),
            }
            if isinstance(metrics.get("alpha"), dict):  # tuned: the alpha in a few words
                row["alpha"] = alpha_label(metrics["alpha"])
            row.update({k: _scalar(v) for k, v in metrics.items() if k not in row})
            rows.append(row)
    return tidy_table(rows)


__all__ = ["CapacityRun", "Point", "capacity_list", "point_dir_name", "run_capacities"]
