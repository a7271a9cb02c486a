"""``simulate(cfg) -> Summary``: the pure core behind ``python -m simlab``.

A run is fully determined by ``(config, seed)``: the trace, its arrival times, every policy's
run. Each selected policy runs the same request sequence on a fresh cache, driven by the
configured engine (``configs/engine``: an object with ``run(requests, step)``) through one
request step (:class:`simlab.engines.step.RequestStep`); the records of all policies go to one
``records.parquet`` (column ``policy``) and their summaries to ``summary.json`` in the output
directory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from simlab.config import CacheSettings, ClusterSettings, ConfigError, RunSettings, run_settings
from simlab.engines.base import Engine, MemoryChecked
from simlab.engines.records import concat_columns, write_json_atomic, write_records
from simlab.engines.replay import ReplayEngine
from simlab.fastpaths.blocks.replay import Walks
from simlab.model.spec import ModelSpec
from simlab.run.bounds import infinite_cache_hits
from simlab.run.checks import (
    check_capacity,
    check_loader_options,
    check_request_fits,
    check_writable,
)
from simlab.run.policy import (
    PolicyRun,
    build_policy,
    policy_step,
    run_policy,
    stacked_runs,
)
from simlab.run.summary import Summary, add_bound_ratios, trace_stats
from simlab.run.sweep import check_no_overwrite, finished_summary, is_multirun
from simlab.run.trace import load_trace, shared_traces, trace_key, trace_requests
from simlab.util.provenance import code_version
from traces.format import Request, Trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunPlan:
    """A composed config, validated: what a run needs before it loads anything."""

    settings: RunSettings
    model: ModelSpec
    engine: Engine


def plan_run(cfg: DictConfig) -> RunPlan:
    """Every check of the composed config, in one place and before any work (the YAML only
    picks): the typed run settings (:mod:`simlab.config`), the model, each selected policy's
    plug-ins and controllers, and the engine. Raises :class:`ConfigError` naming the key."""
    settings = run_settings(cfg)
    try:
        model = ModelSpec.from_config(cfg.model)
    except ValueError as err:
        raise ConfigError(f"model: {err}") from err
    check_capacity(settings, model, int(cfg.trace.get("block_size") or 1))
    check_loader_options(cfg.trace)
    for name, pcfg in settings.policies.items():
        policy_step(name, pcfg, model, settings)
    check_bound_policy(cfg, model, settings)
    engine = build_engine(cfg)
    if isinstance(engine, MemoryChecked):
        engine.check_memory(model, settings.cache.size_gb)
    check_writable(output_dir(cfg))
    return RunPlan(settings, model, engine)


def check_bound_policy(cfg: DictConfig, model: ModelSpec, settings: RunSettings) -> None:
    """The clairvoyant bound's policy builds like any policy, and is a bound for the model: a
    block-keyed bound (``clairvoyant_blocks``, the block-trie Belady) keeps an SSM state after
    every block of a hybrid, so it fills the cache with states and reports far below what real
    policies reach (0.069 against marconi's 0.379 on the default run)."""
    if not (cfg.get("bounds") and cfg.bounds.get("enabled")):
        return
    pcfg = cfg.bounds.get("clairvoyant")
    if pcfg is None:
        return
    step = policy_step("clairvoyant", pcfg, model, settings)
    if model.is_hybrid and step.admission.keys.block_size is not None:
        raise ConfigError(
            f"bounds.clairvoyant: {pcfg.get('name')!r} is a bound for Transformers only "
            f"({model.name} is a hybrid); use policy@bounds.clairvoyant=clairvoyant"
        )


def build_engine(cfg: DictConfig) -> Engine:
    """Instantiate the configured engine (``engine._target_``; :class:`ConfigError` if invalid),
    behind ``cluster.replicas`` replicas when there are several (:mod:`simlab.engines.cluster`)."""
    if cfg.get("engine") is None or "_target_" not in cfg.engine:
        raise ConfigError("engine must name an engine class (_target_), e.g. engine=timed")
    cluster = ClusterSettings.from_config(cfg.get("cluster"))
    try:
        engine: Engine = instantiate(cfg.engine, _convert_="all")
    except InstantiationException as err:
        if isinstance(err.__cause__, ConfigError):  # the engine named the key itself
            raise err.__cause__ from err
        raise ConfigError(f"engine: {err.__cause__ or err}") from err
    if cluster.replicas == 1:
        return engine
    # SimPy and the timed engine: replicas only
    from simlab.engines.cluster.engine import with_cluster

    return with_cluster(engine, cluster, cfg.get("seed", 0))


def hit_rate_bounds(
    cfg: DictConfig, requests: list[Request], model: ModelSpec, settings: RunSettings, unit: int
) -> dict[str, float]:
    """Token hit rates no policy can beat: the infinite cache (ideal reuse at token
    granularity, as if every position were checkpointed) and the clairvoyant policy (Belady on
    the prefix tree at this capacity, replayed in arrival order; for a cluster, one cache of
    all its replicas' capacity, which their caches together never exceed: at one replica's, 4
    replicas read 4.0x the bound); none with ``bounds.enabled`` false."""
    if not (cfg.get("bounds") and cfg.bounds.get("enabled")):
        return {}
    replicas = ClusterSettings.from_config(cfg.get("cluster")).replicas
    if replicas > 1:
        settings = replace(settings, cache=pooled(settings.cache, replicas))
    total = sum(req.input_tokens for req in requests)
    bounds = {"infinite": sum(infinite_cache_hits(requests)) / total}
    pcfg = cfg.bounds.get("clairvoyant")
    if pcfg is not None:
        run = run_policy("clairvoyant", pcfg, requests, model, settings, ReplayEngine(), unit)
        bounds["clairvoyant"] = run.summary["token_hit_rate"]
    return bounds


def pooled(cache: CacheSettings, replicas: int) -> CacheSettings:
    """One cache holding ``replicas`` caches' bytes (GPU, SSM pool and host tier)."""
    scale = {k: getattr(cache, k) for k in ("size_gb", "ssm_gb", "host_gb")}
    return replace(cache, **{k: v * replicas for k, v in scale.items() if v is not None})


def saved_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as run: with ``+policy=NAME`` the unused ``compare`` set is dropped."""
    config: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    if config.get("policy") is not None:
        config.pop("compare", None)
    return config


def output_dir(cfg: DictConfig) -> Path | None:
    if cfg.get("output_dir"):
        return Path(cfg.output_dir)
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return None


def finished_point(cfg: DictConfig) -> Summary | None:
    """In a multirun, the stored summary of this point if it already finished with the same
    config and code (``simlab.run.sweep``: rerunning an interrupted sweep skips its finished
    points). Results of another config or code in the output directory are never replaced
    silently (:func:`simlab.run.sweep.check_no_overwrite`)."""
    out_dir = output_dir(cfg)
    if out_dir is None:
        return None
    config = saved_config(cfg)
    done = finished_summary(out_dir, config, code_version()) if is_multirun() else None
    if done is None:
        check_no_overwrite(out_dir, config, code_version(), bool(cfg.get("overwrite", False)))
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
    """Validate, load, run every selected policy, write results; see the module docstring."""
    plan = plan_run(cfg)
    settings, model, engine = plan.settings, plan.model, plan.engine
    done = finished_point(cfg)
    if done is not None:
        return done
    trace, requests = trace_requests(cfg, settings)
    check_request_fits(settings, model, requests)
    walks: Walks = {}  # block walks of the requests, shared by the policies
    runs = {
        name: run_policy(name, pcfg, requests, model, settings, engine, trace.block_size, walks)
        for name, pcfg in settings.policies.items()
    }
    return finish_run(cfg, plan, trace, requests, runs)


def finish_run(
    cfg: DictConfig,
    plan: RunPlan,
    trace: Trace,
    requests: list[Request],
    runs: dict[str, PolicyRun],
) -> Summary:
    """A run's policy runs with its bounds, as a :class:`Summary`, written to its output
    directory (one scalar capacity's; :mod:`simlab.run.capacities` calls it once per capacity)."""
    settings, model = plan.settings, plan.model
    policies = {name: run.summary for name, run in runs.items()}
    bounds = hit_rate_bounds(cfg, requests, model, settings, trace.block_size)
    add_bound_ratios(policies, bounds)
    summary = Summary(
        policies=policies,
        bounds=bounds,
        trace=trace_stats(trace),
        config=saved_config(cfg),
        out_dir=output_dir(cfg),
        record_columns=concat_columns([run.records for run in runs.values()]),
        routes={name: run.route.to_dict() for name, run in runs.items() if run.route},
    )
    if summary.out_dir is not None:
        write_results(summary, summary.out_dir, runs)
    return summary


def write_results(summary: Summary, out_dir: Path, runs: dict[str, PolicyRun]) -> None:
    """``records.parquet``, ``occupancy.parquet`` and ``summary.json``, each written atomically."""
    write_records(summary.record_columns, out_dir / "records.parquet")
    occupancy = concat_columns([run.occupancy for run in runs.values()])
    write_records(occupancy, out_dir / "occupancy.parquet")
    write_json_atomic(summary.to_dict(), out_dir / "summary.json")
    log.info("results written to %s", out_dir)


__all__ = [
    "PolicyRun",
    "RunPlan",
    "build_engine",
    "build_policy",
    "check_request_fits",
    "check_writable",
    "finish_run",
    "load_trace",
    "output_dir",
    "plan_run",
    "policy_step",
    "run_policy",
    "saved_config",
    "shared_traces",
    "simulate",
    "stacked_runs",
    "trace_key",
    "trace_requests",
]
