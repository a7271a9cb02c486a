"""``simulate(cfg) -> Summary``: the pure core behind ``python -m simlab``.

A run is fully determined by ``(config, seed)``: the trace, its arrival times, every policy's
run. Each selected policy runs the same request sequence on a fresh cache, driven by the
configured engine (``configs/engine``: an object with ``run(requests, step)``) through one
request step (:class:`simlab.engines.step.RequestStep`); the records of all policies go to one
``records.parquet`` (column ``policy``) and their summaries to ``summary.json`` in the output
directory.
"""

from __future__ import annotations

import inspect
import logging
import tempfile
import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf

from simlab.cache.contract import AdmissionPolicy, EvictionPolicy, Semantics, in_units
from simlab.config import (
    CacheSettings,
    ClusterSettings,
    ConfigError,
    MetricSettings,
    RunSettings,
    run_settings,
)
from simlab.engines.base import Engine, EngineRun, MemoryChecked, Replicated
from simlab.engines.records import (
    Columns,
    concat_columns,
    latency_summary,
    record_columns,
    summarize,
    write_json_atomic,
    write_records,
)
from simlab.engines.replay import ReplayEngine
from simlab.engines.step import Controller, RequestStep
from simlab.engines.tuning.tuner import AlphaTuner
from simlab.fastpaths.blocks.replay import Walks, block_replay, fast_path, one_pass_obstacle
from simlab.fastpaths.radix import kernel as radix_kernel
from simlab.fastpaths.radix import replay as radix_replay
from simlab.fastpaths.radix import tuning as radix_tuning
from simlab.model.spec import ModelSpec
from simlab.run.bounds import infinite_cache_hits
from simlab.run.compat import semantics_for, with_compat
from simlab.run.summary import Summary, add_bound_ratios, trace_stats
from simlab.run.sweep import check_no_overwrite, finished_summary, is_multirun
from simlab.util.collector import collector_paused
from simlab.util.provenance import code_version
from traces.arrival_modes import assign as assign_arrival_times
from traces.arrivals import GapsError
from traces.format import Request, Trace

log = logging.getLogger(__name__)


@dataclass
class PolicyRun:
    """One policy's records, summary and cache occupancy over time (numpy columns)."""

    records: Columns
    summary: dict[str, Any]
    occupancy: Columns


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


def page_tokens(settings: RunSettings, unit_tokens: int) -> int:
    """Tokens of the smallest KV page the cache can hold: ``cache.page_size`` in whole ids of
    ``unit_tokens`` tokens (a hash-id trace's id is a block: 512 tokens for Mooncake)."""
    return max(1, round(settings.cache.page_size / unit_tokens)) * unit_tokens


def check_capacity(settings: RunSettings, model: ModelSpec, unit_tokens: int = 1) -> None:
    """The cache must hold one KV page, plus one SSM checkpoint for a hybrid: a smaller one
    can never admit anything, and every hit rate would be a silent 0."""
    cache = settings.cache
    if cache.ssm_gb is not None:
        check_separate_pools(settings, model, unit_tokens)
        return
    need = page_tokens(settings, unit_tokens) * model.kv_bytes_per_token
    need += model.ssm_state_bytes if model.is_hybrid else 0
    if settings.cache.capacity_bytes < need:
        what = "one KV page plus one SSM checkpoint" if model.is_hybrid else "one KV page"
        raise ConfigError(
            f"cache.size_gb: smaller than {what} of {model.name} ({need / 1e9:.4g} GB), "
            f"so nothing could ever be cached (got {settings.cache.size_gb})"
        )


def check_separate_pools(settings: RunSettings, model: ModelSpec, unit_tokens: int = 1) -> None:
    """With ``cache.ssm_gb`` the model must have SSM states, the SSM pool must hold one and
    the KV pool one page."""
    cache = settings.cache
    if not model.is_hybrid:
        raise ConfigError(f"cache.ssm_gb: {model.name} has no SSM states; leave it null")
    if cache.ssm_bytes is not None and cache.ssm_bytes < model.ssm_state_bytes:
        raise ConfigError(
            f"cache.ssm_gb: smaller than one SSM state of {model.name} "
            f"({model.ssm_state_bytes / 1e9:.4g} GB), got {cache.ssm_gb}"
        )
    if cache.kv_bytes < page_tokens(settings, unit_tokens) * model.kv_bytes_per_token:
        raise ConfigError(
            f"cache.size_gb - cache.ssm_gb: the KV pool ({cache.kv_bytes / 1e9:.4g} GB) is "
            f"smaller than one KV page of {model.name}"
        )


def check_request_fits(settings: RunSettings, model: ModelSpec, requests: list[Request]) -> None:
    """With separate pools, the KV pool must hold the longest request: the engine could never
    run it (a shared budget only truncates what it caches)."""
    if settings.cache.ssm_gb is None or not requests:
        return
    longest = max(req.input_tokens + req.output_len for req in requests)
    if longest * model.kv_bytes_per_token > settings.cache.kv_bytes:
        raise ConfigError(
            f"cache.size_gb - cache.ssm_gb: the KV pool ({settings.cache.kv_bytes / 1e9:.4g} GB) "
            f"cannot hold the longest request ({longest} tokens, "
            f"{longest * model.kv_bytes_per_token / 1e9:.4g} GB)"
        )


def check_writable(out_dir: Path | None) -> None:
    """Fail before any work when results could not be written to ``out_dir``."""
    if out_dir is None:
        return
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as err:
        raise ConfigError(f"output_dir: cannot write to {out_dir} ({err.strerror or err})") from err


#: ``trace.*`` keys every loader takes that are not its parameters: ``name`` labels the results
TRACE_LABELS = frozenset({"_target_", "name"})


def check_loader_options(trace_cfg: DictConfig) -> None:
    """Each ``trace.*`` key must be a parameter of the loader (a misspelt ``+trace.limt=5``
    would be swallowed by its ``**_`` and the whole trace replayed), and each option typed
    ``int``, ``float`` or ``bool`` in its signature must be one (or null where the loader
    allows None): a loader's own ``int("abc")`` would name neither the key nor the value."""
    target = get_method(str(trace_cfg._target_))
    params = inspect.signature(target).parameters
    named = {p for p, spec in params.items() if spec.kind is not inspect.Parameter.VAR_KEYWORD}
    for key in trace_cfg:
        if str(key) not in named | TRACE_LABELS:
            raise ConfigError(
                f"trace.{key!s}: unknown key for {trace_cfg._target_} "
                f"(known: {', '.join(sorted(named))})"
            )
    hints = typing.get_type_hints(target)
    for key, value in trace_cfg.items():
        hint = hints.get(str(key))
        if hint is None or (value is None and type(None) in typing.get_args(hint)):
            continue
        kinds = {t for t in (*typing.get_args(hint), hint) if t in (int, float, bool)}
        if not kinds:
            continue
        numbers = tuple(kinds - {bool}) + ((int,) if float in kinds else ())
        ok = (
            isinstance(value, bool)
            if kinds == {bool}
            else (not isinstance(value, bool) and isinstance(value, numbers))
        )
        if not ok:
            wanted = " or ".join(sorted(k.__name__ for k in kinds))
            raise ConfigError(f"trace.{key!s}: must be {wanted} (got {value!r})")


#: ``(key, trace, requests)`` of the last trace loaded while :func:`shared_traces` is on
_shared: list[tuple[str, Trace, list[Request]]] | None = None


@contextmanager
def shared_traces() -> Iterator[None]:
    """Within this block, runs of the same trace (same ``trace`` config, data directory, arrival
    settings and seed) share one loaded trace and its requests instead of loading it again:
    the sweep launcher (``hydra_plugins.simlab_launcher``) runs a group of points in it. One
    trace is kept (the last), and none after the block. Runs never mutate a trace or its
    requests (the capacities of a list already share them)."""
    global _shared
    outer, _shared = _shared, []
    try:
        yield
    finally:
        _shared = outer


def trace_key(cfg: DictConfig, settings: RunSettings) -> str:
    """What the loaded trace and its arrival times depend on."""
    trace = OmegaConf.to_container(cfg.trace, resolve=True)
    return repr((trace, cfg.get("data_dir"), settings.arrivals, settings.seed))


def trace_requests(cfg: DictConfig, settings: RunSettings) -> tuple[Trace, list[Request]]:
    """The configured trace (:func:`load_trace`) and its requests in processing order; the
    shared ones inside :func:`shared_traces` when the last run loaded the same."""
    if _shared is None:
        trace = load_trace(cfg, settings)
        return trace, list(trace.requests())
    key = trace_key(cfg, settings)
    if _shared and _shared[0][0] == key:
        log.info("trace shared with the previous point: %s", cfg.trace.get("name"))
        return _shared[0][1], _shared[0][2]
    _shared.clear()
    trace = load_trace(cfg, settings)
    requests = list(trace.requests())
    _shared.append((key, trace, requests))
    return trace, requests


def load_trace(cfg: DictConfig, settings: RunSettings) -> Trace:
    """Instantiate the configured loader and assign arrival times (seeded)."""
    try:
        trace: Trace = instantiate(cfg.trace, _convert_="all")
    except InstantiationException as err:  # a missing or malformed file: the loader's message
        if isinstance(err.__cause__, FileNotFoundError | ValueError):
            raise ConfigError(f"trace: {err.__cause__}") from err
        raise
    trace.name = str(cfg.trace.get("name") or trace.name)  # the config's name labels results
    arrivals = settings.arrivals
    try:
        return assign_arrival_times(
            trace,
            mode=arrivals.mode,
            session_rate=arrivals.session_rate,
            think_time_mean=arrivals.think_time_mean,
            seed=settings.seed,
            azure=arrivals.azure,
            azure_path=arrivals.azure_path,
            data_dir=cfg.get("data_dir"),
            time_scale=arrivals.time_scale,
            gaps=arrivals.gaps,
            typing_wpm=arrivals.typing_wpm,
            response_time=arrivals.response_time,
        )
    except GapsError as err:  # e.g. typing gaps on a trace without word counts
        raise ConfigError(f"arrivals.gaps={arrivals.gaps}: {err}") from err
    except ValueError as err:  # e.g. timestamps on a trace without them
        raise ConfigError(f"arrivals.mode={arrivals.mode}: {err}") from err


def build_policy(name: str, pcfg: DictConfig) -> tuple[AdmissionPolicy, EvictionPolicy]:
    """Instantiate a policy's admission and eviction plug-ins, with its ``compat`` preset's
    switches (:mod:`simlab.run.compat`; :class:`ConfigError` if invalid)."""
    try:
        pcfg = with_compat(pcfg)
        return instantiate(pcfg.admission), instantiate(pcfg.eviction)
    except ValueError as err:
        raise ConfigError(f"policy {name!r}: {err}") from err
    except InstantiationException as err:
        raise ConfigError(f"policy {name!r}: {err.__cause__ or err}") from err


def policy_semantics(name: str, pcfg: DictConfig) -> Semantics:
    """The cache semantics of a policy (``policy.compat`` / ``policy.semantics``)."""
    try:
        return semantics_for(pcfg)
    except ValueError as err:
        raise ConfigError(f"policy {name!r}: {err}") from err


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


def policy_step(
    name: str, pcfg: DictConfig, model: ModelSpec, settings: RunSettings, unit_tokens: int = 1
) -> RequestStep:
    """A fresh cache with the policy's plug-ins (admission in the trace's units) and its
    controllers (``policy.tuning``: the alpha tuner)."""
    admission, eviction = build_policy(name, pcfg)
    ckpt_states = admission.states_per_checkpoint(unit_tokens)
    admission, eviction = in_units(admission, unit_tokens), in_units(eviction, unit_tokens)
    page = max(1, round(settings.cache.page_size / unit_tokens))
    block = admission.keys.block_size
    if block is not None and settings.cache.page_size not in (1, pcfg.get("block_size")):
        raise ConfigError(
            f"cache.page_size: policy {name!r} pages by its own block_size "
            f"({pcfg.get('block_size')}); leave cache.page_size at 1 (got {settings.cache.page_size})"
        )
    if block is None:
        admission = admission.paged(page, model)
        if admission.keys.block_size is not None:  # its keys are the pages now
            page = 1
    controllers: list[Controller] = []
    tuner = AlphaTuner.for_policy(pcfg.get("tuning"), eviction, name)
    if tuner is not None:
        controllers.append(tuner)
    return RequestStep.build(
        model,
        settings.cache.kv_bytes,
        admission,
        eviction,
        name,
        page_size=page,
        unit_tokens=unit_tokens,
        controllers=controllers,
        ssm_capacity_bytes=settings.cache.ssm_bytes,
        semantics=in_units_semantics(policy_semantics(name, pcfg), unit_tokens),
        host_capacity_bytes=settings.cache.host_bytes,
        host_bw_bytes=settings.cache.host_bw_bytes,
        ckpt_states=ckpt_states,
    )


def in_units_semantics(semantics: Semantics, unit_tokens: int) -> Semantics:
    """``semantics`` with vLLM+'s insertion estimate (``block_estimate``, tokens; 0: off) in
    ids of ``unit_tokens`` tokens, as :func:`simlab.cache.contract.in_units` converts its admission's
    block (on a Mooncake trace, in tokens against ids, it went negative and a 20 GB cache
    held 33.7 GB)."""
    if unit_tokens == 1 or not semantics.block_estimate:
        return semantics
    return replace(semantics, block_estimate=max(1, round(semantics.block_estimate / unit_tokens)))


def run_policy(
    name: str,
    pcfg: DictConfig,
    requests: list[Request],
    model: ModelSpec,
    settings: RunSettings,
    engine: Engine,
    unit_tokens: int = 1,
    walks: Walks | None = None,
) -> PolicyRun:
    """Run the trace under one policy on a fresh cache with ``engine``. An LRU, FIFO or Belady
    over whole blocks on the replay engine (:func:`simlab.fastpaths.blocks.replay.one_pass_obstacle`) is
    computed on block ids unless ``cache.one_pass`` is false: the same records, occupancy and
    summary as the request-by-request replay (``tests/test_capacities.py``,
    ``tests/test_block_heap.py``), several times faster; judicious or fine-grained admission
    with Marconi's or LRU eviction on the token tree runs compiled per ``cache.compiled``
    (:mod:`simlab.fastpaths.radix.kernel`, the same records; a tuned run on another engine, its grid
    search: :mod:`simlab.fastpaths.radix.tuning`). ``walks`` shares the walk of the trace (and
    the compiled replay's token pool) with the run's other policies."""
    step = policy_step(name, pcfg, model, settings, unit_tokens)
    if settings.cache.one_pass and one_pass_obstacle(step, engine) is None:
        log.info("%s: %s (cache.one_pass)", name, fast_path(step.eviction))
        (stacked,) = stacked_runs(
            name, requests, [step], [settings.metrics], walks, settings.cache.compiled
        )
        return stacked
    compiled = settings.cache.compiled
    if radix_kernel.use_compiled(compiled, requests, step):
        why = radix_kernel.obstacle(step, engine, requests)
        if why is None:
            log.info("%s: the radix replay compiled (cache.compiled=%s)", name, compiled)
            return compiled_run(name, requests, step, settings.metrics, walks)
        log.debug("%s: request by request (%s)", name, why)

    def searching(step: RequestStep) -> RequestStep:  # a tuner's window replays compiled
        return radix_tuning.with_compiled_search(step, requests, compiled)

    start = time.perf_counter()
    with collector_paused():
        if isinstance(engine, Replicated):  # one fresh step per replica
            run = engine.run(
                requests,
                searching(step),
                lambda: searching(policy_step(name, pcfg, model, settings, unit_tokens)),
            )
        else:
            run = engine.run(requests, searching(step))
    wall = time.perf_counter() - start
    records = record_columns(run.records, run.columns)
    summary = policy_summary(records, run, step, wall, settings.metrics)
    rate, speed = summary["token_hit_rate"], summary["requests_per_s"]
    log.info("%s: token hit rate %.4f, %.0f req/s", name, rate, speed)
    return PolicyRun(records, summary, occupancy_columns(name, run, records))


def compiled_run(
    name: str,
    requests: list[Request],
    step: RequestStep,
    metrics: MetricSettings,
    walks: Walks | None = None,
) -> PolicyRun:
    """The replay of ``requests`` through ``step`` compiled (:func:`simlab.fastpaths.radix.kernel.
    compiled_replay`; ``step`` passes its ``obstacle``): the request step's records, occupancy
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
    log.info(
        "%s: token hit rate %.4f, %.0f req/s",
        name,
        summary["token_hit_rate"],
        summary["requests_per_s"],
    )
    return PolicyRun(records, summary, occupancy_columns(name, run, records))


def stacked_runs(
    name: str,
    requests: list[Request],
    steps: list[RequestStep],
    metrics: list[MetricSettings],
    walks: Walks | None = None,
    compiled: bool | str = "auto",
    heap_runs: int = 1,
) -> list[PolicyRun]:
    """The policy's run at each step's capacity from one walk of the trace
    (:func:`simlab.fastpaths.blocks.replay.block_replay`; every step passes
    :func:`simlab.fastpaths.blocks.replay.one_pass_obstacle`): the replay engine's records, occupancy and
    summary, the whole computation's wall time shared equally. ``walks``: the block walks of
    ``requests`` other policies took (shared); ``compiled``: ``cache.compiled``;
    ``heap_runs``: the run's policies on a heap (FIFO, Belady), which share one numba load."""
    start = time.perf_counter()
    with collector_paused():
        stacked = block_replay(requests, steps, walks, compiled, heap_runs)
    wall = (time.perf_counter() - start) / len(steps)
    runs = []
    for step, run, point_metrics in zip(steps, stacked, metrics, strict=True):
        peak = run.peak_kv_bytes / 1e9
        engine_run = EngineRun(
            records=[], extras={"peak_kv_gb": peak, "peak_ssm_gb": 0.0, "peak_gb": peak}
        )
        summary = policy_summary(run.records, engine_run, step, wall, point_metrics)
        occupancy = occupancy_columns(name, engine_run, run.records)
        runs.append(PolicyRun(run.records, summary, occupancy))
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
        | step.summary()
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
        policies=done["policies"], trace=done["trace"], config=done["config"], out_dir=out_dir
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
