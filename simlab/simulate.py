"""``simulate(cfg) -> Summary``: the pure core behind ``python -m simlab``.

A run is fully determined by ``(config, seed)``: the trace, its arrival times, every policy's
replay. Each selected policy replays the same request sequence on a fresh cache; the records of
all policies go to one ``records.parquet`` (column ``policy``) and their summaries to
``summary.json`` in the output directory.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from policies.base import AdmissionPolicy, EvictionPolicy, in_units
from policies.clairvoyant import infinite_cache_hits
from simlab.batchllm import saving_ratio as plan_saving_ratio
from simlab.cache import PrefixCache
from simlab.config import ConfigError, RunSettings, run_settings
from simlab.costmodel import Calibration, CostModel, Hardware
from simlab.model import ModelSpec
from simlab.offline import BatchFeeder
from simlab.offline import saving_ratio as batch_saving_ratio
from simlab.provenance import provenance
from simlab.records import (
    RequestRecord,
    latency_summary,
    records_frame,
    summarize,
    write_json_atomic,
    write_records,
)
from simlab.replay import replay
from simlab.sweep import finished_summary, is_multirun
from simlab.timed import EngineStats, TimedEngine, TimedSettings
from traces.arrival_modes import assign as assign_arrival_times
from traces.describe import input_tokens as trace_input_tokens
from traces.format import Request, Trace

log = logging.getLogger(__name__)

SUMMARY_COLUMNS = {
    "token_hit_rate": "token hit",
    "request_hit_rate": "req hit",
    "flops_saved_ratio": "FLOPs saved",
    "peak_kv_gb": "peak KV GB",
    "peak_ssm_gb": "peak SSM GB",
    "requests_per_s": "sim req/s",
}
TIMED_COLUMNS = {
    "ttft_p5": "TTFT p5 s",
    "ttft_p50": "TTFT p50 s",
    "ttft_p95": "TTFT p95 s",
    "throughput_rps": "served req/s",
    "gpu_busy_frac": "GPU busy",
}


@dataclass
class PolicyRun:
    """One policy's records, summary and cache occupancy over time."""

    frame: pd.DataFrame
    summary: dict[str, Any]
    occupancy: pd.DataFrame


@dataclass
class Summary:
    """Per-policy results of one run plus what was run."""

    policies: dict[str, dict[str, Any]]
    trace: dict[str, Any]
    config: dict[str, Any]
    bounds: dict[str, float] = field(default_factory=dict)
    out_dir: Path | None = None
    records: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)

    def table(self) -> str:
        columns = dict(SUMMARY_COLUMNS)
        if "clairvoyant" in self.bounds:
            columns["hit_vs_clairvoyant"] = "of clairvoyant"
        if any("ttft_p50" in p for p in self.policies.values()):
            columns |= TIMED_COLUMNS
        frame = pd.DataFrame(self.policies).T[list(columns)].rename(columns=columns)
        text = frame.to_string(float_format=lambda v: f"{v:.4f}")
        if self.bounds:
            text += "\nbounds (token hit rate): " + ", ".join(
                f"{name} {rate:.4f}" for name, rate in self.bounds.items()
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "policies": self.policies,
            "bounds": self.bounds,
            "trace": self.trace,
            "config": self.config,
            "provenance": provenance(),
        }


def load_trace(cfg: DictConfig, settings: RunSettings) -> Trace:
    """Instantiate the configured loader and assign arrival times (seeded)."""
    trace: Trace = instantiate(cfg.trace, _convert_="all")
    arrivals = settings.arrivals
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
    )


def trace_stats(trace: Trace) -> dict[str, Any]:
    frame = trace.frame
    input_lens = pd.Series(trace_input_tokens(trace))
    stats: dict[str, Any] = {
        "name": trace.name,
        "block_size": trace.block_size,
        "requests": len(frame),
        "sessions": trace.n_sessions,
        "input_tokens": int(input_lens.sum()),
        "output_tokens": int(frame["output_len"].sum()),
        "input_len_p50": float(input_lens.median()),
        "input_len_p95": float(input_lens.quantile(0.95)),
    }
    if {"ref_prompt_tokens", "ref_cached_tokens"} <= set(frame.columns):
        prompt = float(frame["ref_prompt_tokens"].sum())
        stats["ref_prompt_tokens"] = prompt
        stats["ref_cached_tokens"] = float(frame["ref_cached_tokens"].sum())
        stats["ref_cached_share"] = stats["ref_cached_tokens"] / prompt if prompt else 0.0
    return stats


def build_policy(name: str, pcfg: DictConfig) -> tuple[AdmissionPolicy, EvictionPolicy]:
    """Instantiate a policy's admission and eviction plug-ins (:class:`ConfigError` if invalid)."""
    try:
        return instantiate(pcfg.admission), instantiate(pcfg.eviction)
    except InstantiationException as err:
        raise ConfigError(f"policy {name!r}: {err.__cause__ or err}") from err


def build_engine_world(
    settings: RunSettings, model: ModelSpec, hardware_cfg: Any
) -> tuple[CostModel, TimedSettings] | None:
    """Cost model and timed settings for the timed and offline engines (None for replay)."""
    if settings.engine == "replay":
        return None
    options = dict(settings.engine_options)
    calibration, tp = options.pop("calibration", None), options.pop("tp", 1)
    options.pop("scheduler", None)
    try:
        hardware = Hardware.from_config(hardware_cfg)
        cost = CostModel(
            model, hardware, Calibration.load(calibration) if calibration else None, tp
        )
        return cost, TimedSettings(**options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"engine/hardware: {err}") from err


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Keep the objects alive on entry (modules, configs, the trace) out of the cyclic garbage
    collector's passes until exit (``gc.freeze``). A simulation allocates and drops millions of
    tree nodes, and each collection would otherwise walk that whole long-lived heap again."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_policy(
    name: str,
    pcfg: DictConfig,
    requests: list[Request],
    model: ModelSpec,
    settings: RunSettings,
    world: tuple[CostModel, TimedSettings] | None = None,
    unit_tokens: int = 1,
) -> PolicyRun:
    """Run the trace under one policy on a fresh cache, with the replay, timed or offline engine."""
    admission, eviction = build_policy(name, pcfg)
    admission = in_units(admission, unit_tokens)
    page = max(1, round(settings.cache.page_size / unit_tokens))
    cache = PrefixCache(model, settings.cache.capacity_bytes, page, unit_tokens)
    start = time.perf_counter()
    stats: EngineStats | None = None
    extra: dict[str, Any] = {}
    with heap_frozen():
        if world is None:
            records = replay(requests, cache, admission, eviction, name)
        else:
            engine = TimedEngine(requests, cache, admission, eviction, world[0], world[1], name)
            records, extra = run_timed(engine, requests, settings)
            stats = engine.stats
    wall = time.perf_counter() - start
    frame = records_frame(records)
    summary = (
        summarize(frame)
        | latency_summary(frame)
        | extra
        | {
            "peak_kv_gb": cache.peak_kv_bytes / 1e9,
            "peak_ssm_gb": cache.peak_ssm_bytes / 1e9,
            "peak_gb": cache.peak_bytes / 1e9,
            "wall_s": wall,
            "requests_per_s": len(requests) / wall if wall > 0 else float("inf"),
        }
        | plugin_summary(eviction)
    )
    log.info(
        "%s: token hit rate %.4f, %.0f req/s",
        name,
        summary["token_hit_rate"],
        summary["requests_per_s"],
    )
    return PolicyRun(frame, summary, occupancy_frame(name, stats, frame))


def run_timed(
    engine: TimedEngine, requests: list[Request], settings: RunSettings
) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Run the timed world: sessions (``engine=timed``) or a planned batch (``engine=offline``,
    which adds the scheduler's saving ratios)."""
    if settings.engine != "offline":
        records = engine.run()
        return records, engine_summary(engine.stats, len(records))
    scheduler = instantiate(settings.engine_options["scheduler"])
    groups = scheduler.plan(requests)
    records = engine.run(BatchFeeder(requests, groups))
    return records, engine_summary(engine.stats, len(records)) | {
        "scheduler": scheduler.name,
        "saving_ratio": batch_saving_ratio(engine, requests),
        "plan_saving_ratio": plan_saving_ratio(groups),
    }


def engine_summary(stats: EngineStats, n_requests: int) -> dict[str, Any]:
    """GPU busy fraction and the queue's time-average length (Little's law: = rate x delay)."""
    span = stats.last_departure - stats.first_arrival
    return {
        "gpu_busy_frac": stats.busy / span if span > 0 else 0.0,
        "mean_queue_len": stats.queue_area / span if span > 0 else 0.0,
        "arrival_rate": n_requests / span if span > 0 else 0.0,
        "iterations": stats.iterations,
    }


def occupancy_frame(policy: str, stats: EngineStats | None, frame: pd.DataFrame) -> pd.DataFrame:
    """Cache bytes over time: the timed engine's samples, or per request for replay."""
    if stats is not None and stats.occupancy:
        times, kv, ssm = zip(*stats.occupancy, strict=True)
    else:
        times, kv, ssm = frame["arrival"], frame["cache_kv_bytes"], frame["cache_ssm_bytes"]
    return pd.DataFrame(
        {"policy": policy, "time": list(times), "kv_bytes": list(kv), "ssm_bytes": list(ssm)}
    )


def hit_rate_bounds(
    cfg: DictConfig, requests: list[Request], model: ModelSpec, settings: RunSettings, unit: int
) -> dict[str, float]:
    """Token hit rates no policy can beat: the infinite cache (ideal reuse at token
    granularity, as if every position were checkpointed) and the clairvoyant policy (Belady on
    the prefix tree at this capacity, replayed in arrival order)."""
    total = sum(req.input_tokens for req in requests)
    ideal = infinite_cache_hits(requests)
    bounds = {
        "infinite": sum(req.hit_tokens(h) for req, h in zip(requests, ideal, strict=True)) / total
    }
    pcfg = cfg.bounds.get("clairvoyant")
    if pcfg is not None:
        replayed = settings if settings.engine == "replay" else replace(settings, engine="replay")
        run = run_policy("clairvoyant", pcfg, requests, model, replayed, None, unit)
        bounds["clairvoyant"] = run.summary["token_hit_rate"]
    return bounds


def add_bound_ratios(policies: dict[str, dict[str, Any]], bounds: dict[str, float]) -> None:
    """Each policy's token hit rate as a fraction of each bound."""
    for summary in policies.values():
        for name, rate in bounds.items():
            summary[f"hit_vs_{name}"] = summary["token_hit_rate"] / rate if rate else math.nan


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


def plugin_summary(plugin: Any) -> dict[str, Any]:
    """Items a plug-in adds to its policy's summary (``run_summary()``, e.g. the alpha history)."""
    extra = getattr(plugin, "run_summary", None)
    return dict(extra()) if extra is not None else {}


def finished_point(cfg: DictConfig) -> Summary | None:
    """In a multirun, the stored summary of this point if it already finished with the same
    config (``simlab.sweep``: rerunning an interrupted sweep skips its finished points)."""
    out_dir = output_dir(cfg)
    if out_dir is None or not is_multirun():
        return None
    done = finished_summary(out_dir, saved_config(cfg))
    if done is None:
        return None
    log.info("sweep point already finished, skipped: %s", out_dir)
    return Summary(
        policies=done["policies"], trace=done["trace"], config=done["config"], out_dir=out_dir
    )


def simulate(cfg: DictConfig) -> Summary:
    """Validate, load, replay every selected policy, write results; see the module docstring."""
    settings = run_settings(cfg)
    model = ModelSpec.from_config(cfg.model)
    for name, pcfg in settings.policies.items():  # bad policy parameters fail before any work
        build_policy(name, pcfg)
    world = build_engine_world(settings, model, cfg.get("hardware"))
    done = finished_point(cfg)
    if done is not None:
        return done
    trace = load_trace(cfg, settings)
    requests = list(trace.requests())
    runs = {
        name: run_policy(name, pcfg, requests, model, settings, world, trace.block_size)
        for name, pcfg in settings.policies.items()
    }
    policies = {name: run.summary for name, run in runs.items()}
    bounds: dict[str, float] = {}
    if cfg.get("bounds") and cfg.bounds.get("enabled"):
        bounds = hit_rate_bounds(cfg, requests, model, settings, trace.block_size)
        add_bound_ratios(policies, bounds)
    summary = Summary(
        policies=policies,
        bounds=bounds,
        trace=trace_stats(trace),
        config=saved_config(cfg),
        out_dir=output_dir(cfg),
        records=pd.concat([run.frame for run in runs.values()], ignore_index=True),
    )
    if summary.out_dir is not None:
        write_records(summary.records, summary.out_dir / "records.parquet")
        occupancy = pd.concat([run.occupancy for run in runs.values()], ignore_index=True)
        write_records(occupancy, summary.out_dir / "occupancy.parquet")
        write_json_atomic(summary.to_dict(), summary.out_dir / "summary.json")
        log.info("results written to %s", summary.out_dir)
    return summary
