"""One policy's run: its plug-ins and request step built from its checked spec
(:class:`PolicySpec`, made by :func:`simlab.run.plan.plan_run`), and its records, summary and
occupancy computed on the route the route table picks (:mod:`simlab.run.routes`)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from simlab.cache.contract import AdmissionPolicy, EvictionPolicy, Semantics, in_units
from simlab.cache.state_pool import StatePool
from simlab.config import CacheSettings, ConfigError, MetricSettings, RunSettings
from simlab.engines.base import Engine, EngineRun, Replicated
from simlab.engines.records import Columns, latency_summary, record_columns, summarize
from simlab.engines.step import Controller, RequestStep
from simlab.engines.tuning.settings import TuningSettings
from simlab.engines.tuning.tuner import AlphaTuner
from simlab.fastpaths.blocks.replay import Walks, block_replay
from simlab.fastpaths.radix import replay as radix_replay
from simlab.model.spec import ModelSpec
from simlab.run import routes
from simlab.run.routes import Route
from simlab.util.collector import collector_paused
from traces.format import Request

log = logging.getLogger(__name__)


@dataclass
class PolicyRun:
    """One policy's records, summary and cache occupancy over time (numpy columns)."""

    records: Columns
    summary: dict[str, Any]
    occupancy: Columns
    route: Route | None = None  # the code that computed it (:mod:`simlab.run.routes`)


@dataclass(frozen=True)
class PolicySpec:
    """A selected policy, checked (:func:`simlab.run.plan.policy_spec`): its plug-ins' configs
    as plain dicts (its ``compat`` preset's switches set: :mod:`simlab.run.compat`), its cache
    semantics, its tuning (None: off) and its own ``block_size`` (None: none)."""

    name: str
    admission: dict[str, Any]
    eviction: dict[str, Any]
    semantics: Semantics = field(default_factory=Semantics)
    tuning: TuningSettings | None = None
    block_size: int | None = None


def build_policy(spec: PolicySpec) -> tuple[AdmissionPolicy, EvictionPolicy]:
    """Instantiate a policy's admission and eviction plug-ins (:class:`ConfigError` if invalid)."""
    try:
        return instantiate(spec.admission), instantiate(spec.eviction)
    except ValueError as err:
        raise ConfigError(f"policy {spec.name!r}: {err}") from err
    except InstantiationException as err:
        raise ConfigError(f"policy {spec.name!r}: {err.__cause__ or err}") from err


def policy_step(
    spec: PolicySpec, model: ModelSpec, settings: RunSettings, unit_tokens: int = 1
) -> RequestStep:
    """A fresh cache with the policy's plug-ins (admission in the trace's units) and its
    controllers (``policy.tuning``: the alpha tuner)."""
    name = spec.name
    admission, eviction = build_policy(spec)
    model = admission.engine_model(model)  # the engine's state dtypes (``engine_geometry``)
    ckpt_states = admission.states_per_checkpoint(unit_tokens)
    admission, eviction = in_units(admission, unit_tokens), in_units(eviction, unit_tokens)
    page = max(1, round(settings.cache.page_size / unit_tokens))
    block = admission.keys.block_size
    if block is not None and settings.cache.page_size not in (1, spec.block_size):
        raise ConfigError(
            f"cache.page_size: policy {name!r} pages by its own block_size "
            f"({spec.block_size}); leave cache.page_size at 1 (got {settings.cache.page_size})"
        )
    if block is None:
        admission = admission.paged(page, model)
        if admission.keys.block_size is not None:  # its keys are the pages now
            page = 1
    controllers: list[Controller] = []
    tuner = AlphaTuner.for_policy(spec.tuning, eviction, name)
    if tuner is not None:
        controllers.append(tuner)
    try:
        pool = state_pool(admission, model, settings.cache)
        step = RequestStep.build(
            model,
            settings.cache.kv_bytes if pool is None else pool.kv_bytes,
            admission,
            eviction,
            name,
            page_size=page,
            unit_tokens=unit_tokens,
            controllers=controllers,
            state_pool=pool,
            semantics=in_units_semantics(spec.semantics, unit_tokens),
            host_capacity_bytes=settings.cache.host_bytes,
            host_bw_bytes=settings.cache.host_bw_bytes,
            ckpt_states=ckpt_states,
        )
    except ConfigError:
        raise
    except ValueError as err:  # the admission's checks on the model (for_model, state_pool)
        raise ConfigError(f"policy {name!r}: {err}") from err
    if pool is None and cache_split_skipped(admission, model, settings.cache):
        step.notes.append(
            "cache.host_gb: the SSM states share the GPU budget with the KV; the engine's own "
            "split of its memory into a state pool and a KV pool is not modelled with a host tier"
        )
    return step


def state_pool(
    admission: AdmissionPolicy, model: ModelSpec, cache: CacheSettings
) -> StatePool | None:
    """A hybrid's separate state pool: ``cache.ssm_gb``'s, else the engine's own split of a
    finite cache without a host tier (SGLang's), else None (the states share the KV's budget)."""
    if cache.ssm_bytes is not None:
        return StatePool.given(cache.kv_bytes, cache.ssm_bytes, model.ssm_state_bytes)
    if not model.is_hybrid or math.isinf(cache.capacity_bytes) or cache.host_gb is not None:
        return None  # a host tier needs one shared GPU budget (simlab.cache.host_tier)
    return admission.state_pool(model, cache.capacity_bytes)


def cache_split_skipped(admission: AdmissionPolicy, model: ModelSpec, cache: CacheSettings) -> bool:
    """Whether a host tier kept the engine from splitting a hybrid's finite cache."""
    if cache.host_gb is None or not model.is_hybrid or math.isinf(cache.capacity_bytes):
        return False
    try:
        return admission.state_pool(model, cache.capacity_bytes) is not None
    except ValueError:  # too small to split: the host tier's shared budget still runs
        return True


def in_units_semantics(semantics: Semantics, unit_tokens: int) -> Semantics:
    """``semantics`` with vLLM+'s insertion estimate (``block_estimate``, tokens; 0: off) in
    ids of ``unit_tokens`` tokens, as :func:`simlab.cache.contract.in_units` converts its admission's
    block (on a Mooncake trace, in tokens against ids, it went negative and a 20 GB cache
    held 33.7 GB)."""
    if unit_tokens == 1 or not semantics.block_estimate:
        return semantics
    return replace(semantics, block_estimate=max(1, round(semantics.block_estimate / unit_tokens)))


def run_policy(
    spec: PolicySpec,
    requests: list[Request],
    model: ModelSpec,
    settings: RunSettings,
    engine: Engine,
    unit_tokens: int = 1,
    walks: Walks | None = None,
) -> PolicyRun:
    """Run the trace under one policy on a fresh cache with ``engine``, on the route the route
    table picks (:func:`simlab.run.routes.choose`, logged and kept in the run): the block
    paths (an LRU, FIFO or Belady over whole blocks: :func:`stacked_runs`), the compiled radix
    replay (:func:`compiled_run`) or the engine itself, whose records the fast routes give
    exactly. ``walks`` shares the walk of the trace (and the compiled replay's token pool) with
    the run's other policies."""
    name = spec.name
    step = policy_step(spec, model, settings, unit_tokens)
    cache = settings.cache
    case = routes.Case(step, engine, requests, cache.one_pass, cache.compiled)
    route = routes.choose(case)
    log.info("%s: %s", name, routes.describe(route))
    if route.taken in routes.BLOCK_ROUTES:
        metrics = [settings.metrics]
        (stacked,) = stacked_runs(name, requests, [step], metrics, walks, cache.compiled, 1, route)
        return stacked
    if route.taken == "compiled_radix":
        return compiled_run(name, requests, step, settings.metrics, walks, route)

    def replica() -> RequestStep:  # a cluster's fresh step per replica, on the same route
        fresh = routes.routed(policy_step(spec, model, settings, unit_tokens), route)
        return routes.with_compiled_search(fresh, case)

    start = time.perf_counter()
    with collector_paused():
        searching = routes.with_compiled_search(step, case)
        if isinstance(engine, Replicated):
            run = engine.run(requests, searching, replica)
        else:
            run = engine.run(requests, searching)
    wall = time.perf_counter() - start
    records = record_columns(run.records, run.columns)
    summary = policy_summary(records, run, step, wall, settings.metrics)
    rate, speed = summary["token_hit_rate"], summary["requests_per_s"]
    log.info("%s: token hit rate %.4f, %.0f req/s", name, rate, speed)
    return PolicyRun(records, summary, occupancy_columns(name, run, records), route)


def compiled_run(
    name: str,
    requests: list[Request],
    step: RequestStep,
    metrics: MetricSettings,
    walks: Walks | None = None,
    route: Route | None = None,
) -> PolicyRun:
    """The replay of ``requests`` through ``step`` compiled (:func:`simlab.fastpaths.radix.
    replay.compiled_replay`; ``step`` is routed there): the request step's records, occupancy
    and summary; ``walks``: the token pool shared with the run's other policies."""
    start = time.perf_counter()
    with collector_paused():
        records, peaks = radix_replay.compiled_replay(requests, step, walks)
    wall = time.perf_counter() - start
    extras = {
        "peak_kv_gb": peaks.kv / 1e9,
        "peak_ssm_gb": peaks.ssm / 1e9,
        "peak_gb": peaks.total / 1e9,
    }
    run = EngineRun(records=[], extras=extras)
    summary = policy_summary(records, run, step, wall, metrics)
    rate, speed = summary["token_hit_rate"], summary["requests_per_s"]
    log.info("%s: token hit rate %.4f, %.0f req/s", name, rate, speed)
    return PolicyRun(records, summary, occupancy_columns(name, run, records), route)


def stacked_runs(
    name: str,
    requests: list[Request],
    steps: list[RequestStep],
    metrics: list[MetricSettings],
    walks: Walks | None = None,
    compiled: bool | str = "auto",
    heap_runs: int = 1,
    route: Route | None = None,
) -> list[PolicyRun]:
    """The policy's run at each step's capacity from one walk of the trace
    (:func:`simlab.fastpaths.blocks.replay.block_replay`; every step routed to the block
    paths): the replay engine's records, occupancy and summary, the whole computation's wall
    time shared equally. ``walks``: the block walks of ``requests`` other policies took
    (shared); ``compiled``: ``cache.compiled``; ``heap_runs``: the run's policies on a heap
    (FIFO, Belady), which share one numba load; ``route``: the route taken (its heap's, when
    compiled, ``compiled_block_heap``)."""
    start = time.perf_counter()
    with collector_paused():
        stacked = block_replay(requests, steps, walks, compiled, heap_runs)
    wall = (time.perf_counter() - start) / len(steps)
    if route is not None and stacked[0].compiled:
        route = replace(route, taken="compiled_block_heap")
    runs = []
    for step, run, point_metrics in zip(steps, stacked, metrics, strict=True):
        peak = run.peak_kv_bytes / 1e9
        engine_run = EngineRun(
            records=[], extras={"peak_kv_gb": peak, "peak_ssm_gb": 0.0, "peak_gb": peak}
        )
        summary = policy_summary(run.records, engine_run, step, wall, point_metrics)
        occupancy = occupancy_columns(name, engine_run, run.records)
        runs.append(PolicyRun(run.records, summary, occupancy, route))
    return runs


def policy_summary(
    records: Columns,
    run: EngineRun,
    step: RequestStep,
    wall: float,
    metrics: MetricSettings | None = None,
) -> dict[str, Any]:
    """A policy's entry in ``summary.json``: hit and latency metrics, the engine's and the
    plug-ins' items, peak cache bytes and simulation speed."""
    cache = step.cache
    metrics = metrics or MetricSettings()
    speed = len(records["request_id"]) / wall if wall > 0 else float("inf")
    items = step.summary()
    caveats = [*run.extras.get("caveats", []), *items.get("caveats", [])]
    return (
        summarize(records, metrics.request_hit_min_tokens, metrics.request_hit_min_share)
        | {"request_hit_rule": metrics.rule}
        | latency_summary(records)
        | {
            "peak_kv_gb": cache.peak_kv_bytes / 1e9,
            "peak_ssm_gb": cache.peak_ssm_bytes / 1e9,
            "peak_gb": cache.peak_bytes / 1e9,
        }
        | run.extras  # an engine's own peaks (a cluster's, summed) replace the step's
        | {"wall_s": wall, "requests_per_s": speed}
        | items
        | ({"caveats": caveats} if caveats else {})  # the engine's and the plug-ins'
    )


def occupancy_columns(policy: str, run: EngineRun, records: Columns) -> Columns:
    """Cache bytes over time: the engine's samples, or per request (replay)."""
    if run.occupancy:
        times, kv, ssm = (np.asarray(c) for c in zip(*run.occupancy, strict=True))
    else:
        times, kv, ssm = records["arrival"], records["cache_kv_bytes"], records["cache_ssm_bytes"]
    return {
        "policy": np.full(len(times), policy, dtype=object),
        "time": times,
        "kv_bytes": kv,
        "ssm_bytes": ssm,
    }
