"""``simulate(cfg) -> Summary``: the pure core behind ``python -m simlab``.

A run is fully determined by ``(config, seed)``: the trace, its arrival times, every policy's
run. Each selected policy runs the same request sequence on a fresh cache, driven by the
configured engine (``configs/engine``: an object with ``run(requests, step)``) through one
request step (:class:`simlab.engines.step.RequestStep`); the records of all policies go to one
``records.parquet`` (column ``policy``) and their summaries to ``summary.json`` in the output
directory. ``simulate`` checks the config and plans the run first
(:func:`simlab.run.plan.plan_run`), then runs the typed plan (:func:`run_plan`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simlab.engines.records import Columns, concat_columns, write_json_atomic, write_records
from simlab.engines.replay import ReplayEngine
from simlab.fastpaths.blocks.replay import Walks
from simlab.run.bounds import infinite_cache_hits
from simlab.run.breakdown import Counterfactuals, Setting, add_breakdowns, pooled
from simlab.run.checks import check_request_fits, check_writable
from simlab.run.plan import (
    RunPlan,
    build_engine,
    output_dir,
    plan_run,
    policy_spec,
    saved_config,
)
from simlab.run.policy import (
    PolicyRun,
    PolicySpec,
    build_policy,
    policy_step,
    run_policy,
    stacked_runs,
)
from simlab.run.summary import Summary, add_bound_ratios, trace_stats
from simlab.run.sweep import check_no_overwrite, finished_summary, is_multirun
from simlab.run.trace import TraceSpec, load_trace, shared_traces, trace_key, trace_requests
from simlab.util.provenance import code_version
from traces.agents import is_agentic
from traces.format import Request, Trace

if TYPE_CHECKING:
    from omegaconf import DictConfig

log = logging.getLogger(__name__)


def hit_rate_bounds(
    plan: RunPlan, requests: list[Request], unit: int, ideal: dict[int, int] | None = None
) -> dict[str, float]:
    """Token hit rates no policy can beat: the infinite cache (ideal reuse at token
    granularity, as if every position were checkpointed) and the clairvoyant policy (Belady on
    the prefix tree at this capacity, replayed in arrival order; for a cluster, one cache of
    all its replicas' capacity, which their caches together never exceed: at one replica's, 4
    replicas read 4.0x the bound); none with ``bounds.enabled`` false. ``ideal``: the
    infinite cache's hits per request id, if the reuse breakdown computed them already."""
    if not plan.bounds:
        return {}
    settings = plan.settings
    replicas = settings.cluster.replicas
    if replicas > 1:
        settings = replace(settings, cache=pooled(settings.cache, replicas))
    total = sum(req.input_tokens for req in requests)
    hits = ideal.values() if ideal is not None else infinite_cache_hits(requests)
    bounds = {"infinite": sum(hits) / total}
    if plan.clairvoyant is not None:
        run = run_policy(plan.clairvoyant, requests, plan.model, settings, ReplayEngine(), unit)
        bounds["clairvoyant"] = run.summary["token_hit_rate"]
    return bounds


def finished_point(plan: RunPlan) -> Summary | None:
    """In a multirun, the stored summary of this point if it already finished with the same
    config and code (``simlab.run.sweep``: rerunning an interrupted sweep skips its finished
    points). Results of another config or code in the output directory are never replaced
    silently (:func:`simlab.run.sweep.check_no_overwrite`)."""
    out_dir, config = plan.out_dir, plan.config
    if out_dir is None:
        return None
    done = finished_summary(out_dir, config, code_version()) if is_multirun() else None
    if done is None:
        check_no_overwrite(out_dir, config, code_version(), plan.overwrite)
        return None
    log.info("sweep point already finished, skipped: %s", out_dir)
    return Summary(
        policies=done["policies"],
        trace=done["trace"],
        config=done["config"],
        out_dir=out_dir,
        routes=done.get("routes", {}),
    )


def simulate(cfg: DictConfig) -> Summary:
    """Validate (:func:`simlab.run.plan.plan_run`), then :func:`run_plan`."""
    return run_plan(plan_run(cfg))


def run_plan(plan: RunPlan) -> Summary:
    """Load the trace, run every selected policy, write results; see the module docstring."""
    settings, model, engine = plan.settings, plan.model, plan.engine
    done = finished_point(plan)
    if done is not None:
        return done
    trace, requests = trace_requests(plan.trace, settings)
    check_request_fits(settings, model, requests)
    walks: Walks = {}  # block walks of the requests, shared by the policies
    runs = {
        name: run_policy(spec, requests, model, settings, engine, trace.block_size, walks)
        for name, spec in plan.policies.items()
    }
    return finish_run(plan, trace, requests, runs)


def finish_run(
    plan: RunPlan,
    trace: Trace,
    requests: list[Request],
    runs: dict[str, PolicyRun],
    shared: Counterfactuals | None = None,
) -> Summary:
    """A run's policy runs with their reuse breakdowns (:mod:`simlab.run.breakdown`; ``shared``:
    the counterfactuals of other capacities of the same trace) and its bounds, as a
    :class:`Summary`, written to its output directory (one scalar capacity's;
    :mod:`simlab.run.capacities` calls it once per capacity)."""
    shared = shared if shared is not None else Counterfactuals()
    if plan.breakdown:
        setting = Setting(plan.model, plan.settings, plan.engine, trace.block_size)
        add_breakdowns(runs, plan.policies, requests, setting, shared)
    policies = {name: run.summary for name, run in runs.items()}
    bounds = hit_rate_bounds(plan, requests, trace.block_size, shared.ideal.get(False))
    add_bound_ratios(policies, bounds)
    summary = Summary(
        policies=policies,
        bounds=bounds,
        trace=trace_stats(trace),
        config=plan.config,
        out_dir=plan.out_dir,
        record_columns=agent_columns(concat_columns([r.records for r in runs.values()]), trace),
        routes={name: run.route.to_dict() for name, run in runs.items() if run.route},
    )
    if summary.out_dir is not None:
        write_results(summary, summary.out_dir, runs)
    return summary


def agent_columns(columns: Columns, trace: Trace) -> Columns:
    """An agentic trace's records gain ``parent_session`` (-1 for a root) and ``agent_depth``
    of their session (:mod:`traces.agents`); other traces' records are unchanged."""
    if not is_agentic(trace) or not columns:
        return columns
    sessions = np.asarray(trace.column("session_id"))
    for name, source in (
        ("parent_session", "ref_parent_session"),
        ("agent_depth", "ref_agent_depth"),
    ):
        of_session = np.zeros(int(sessions.max()) + 1, dtype=np.int64)
        of_session[sessions] = trace.column(source)
        columns[name] = of_session[np.asarray(columns["session_id"], dtype=np.int64)]
    return columns


def write_results(summary: Summary, out_dir: Path, runs: dict[str, PolicyRun]) -> None:
    """``records.parquet``, ``occupancy.parquet`` and ``summary.json``, each written atomically."""
    write_records(summary.record_columns, out_dir / "records.parquet")
    occupancy = concat_columns([run.occupancy for run in runs.values()])
    write_records(occupancy, out_dir / "occupancy.parquet")
    write_json_atomic(summary.to_dict(), out_dir / "summary.json")
    log.info("results written to %s", out_dir)


__all__ = [
    "PolicyRun",
    "PolicySpec",
    "RunPlan",
    "TraceSpec",
    "build_engine",
    "build_policy",
    "check_request_fits",
    "check_writable",
    "finish_run",
    "load_trace",
    "output_dir",
    "plan_run",
    "policy_spec",
    "policy_step",
    "run_plan",
    "run_policy",
    "saved_config",
    "shared_traces",
    "simulate",
    "stacked_runs",
    "trace_key",
    "trace_requests",
]
