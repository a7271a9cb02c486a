"""A cluster run's summary items: routing, per-replica and cluster-wide engine stats, peaks and the
shared pool's counts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simlab.engines.records import RequestRecord
from simlab.engines.timed.agents import closed_loop
from simlab.engines.timed.engine import TimedEngine, verdict_of
from simlab.engines.timed.load import LOAD_ORDER
from simlab.engines.timed.world import TimedWorld

if TYPE_CHECKING:
    from simlab.engines.cluster.world import Cluster, Route


def cluster_extras(
    cluster: Cluster, per_replica: list[list[RequestRecord]], routes: list[Route]
) -> dict[str, Any]:
    """The policy's summary items of a cluster run (see the module docstring)."""
    settings, worlds = cluster.engine.settings, cluster.worlds
    counts = [len(records) for records in per_replica]
    input_tokens = sum(r.input_tokens for records in per_replica for r in records)
    regret = sum(rt.best_overlap - rt.routed_overlap for rt in routes)
    return (
        cluster_stats(worlds, sum(counts))
        | cluster_saturation(worlds, per_replica, closed_loop(cluster.requests))
        | {
            "replicas": settings.replicas,
            "router": settings.router,
            "load_weight": settings.load_weight,
            "router_lag_s": settings.router_lag_s,
            "replica_requests": counts,
            "replica_token_hit_rate": [_hit_rate(records) for records in per_replica],
            "load_imbalance": max(counts) / (sum(counts) / len(counts)) if sum(counts) else 1.0,
            "routing_regret_tokens": regret,
            "routing_regret_rate": regret / input_tokens if input_tokens else 0.0,
            "best_overlap_rate": sum(rt.best_overlap for rt in routes) / input_tokens
            if input_tokens
            else 0.0,
        }
        | {key: sum(peaks[key] for peaks in map(replica_peaks, worlds)) for key in PEAKS}
    )


PEAKS = ("peak_kv_gb", "peak_ssm_gb", "peak_gb")


def replica_peaks(world: TimedWorld) -> dict[str, float]:
    """One replica's peak cached GB: its engine's (vLLM's hybrid pool) or its cache's."""
    cache = world.cache
    return world.cache_peaks() or {
        "peak_kv_gb": cache.peak_kv_bytes / 1e9,
        "peak_ssm_gb": cache.peak_ssm_bytes / 1e9,
        "peak_gb": cache.peak_bytes / 1e9,
    }


def pool_extras(worlds: list[TimedWorld], settings: TimedEngine) -> dict[str, Any]:
    """The shared KV pool's summary items over the replicas: counts and bytes summed, the
    pool (and SSM pool, with its cap) per replica, and per-replica preemptions."""
    pools = [w.pool.summary(settings) for w in worlds]
    out = dict(pools[0])
    for key in ("preemptions", "preempted_requests", "recomputed_tokens", "pool_evicted_gb"):
        out[key] = sum(p[key] for p in pools)
    out["peak_running_gb"] = sum(p["peak_running_gb"] for p in pools)
    if "peak_running_states" in out:  # a separate SSM pool per replica
        out["peak_running_states"] = sum(p["peak_running_states"] for p in pools)
    out["replica_preemptions"] = [p["preemptions"] for p in pools]
    return out


def _hit_rate(records: list[RequestRecord]) -> float:
    total = sum(r.input_tokens for r in records)
    return sum(r.hit_tokens for r in records) / total if total else 0.0


def cluster_stats(worlds: list[TimedWorld], n_requests: int) -> dict[str, Any]:
    """The timed engine's stats over the cluster: busy = mean GPU busy fraction over the
    cluster's span, the queue = all replicas' queues (Little's law holds for their sum)."""
    first = min(w.stats.first_arrival for w in worlds)
    last = max(w.stats.last_departure for w in worlds)
    span = last - first if last > first else 0.0
    busy = [w.stats.busy / span if span > 0 else 0.0 for w in worlds]
    return {
        "gpu_busy_frac": sum(busy) / len(busy),
        "replica_gpu_busy_frac": busy,
        "mean_queue_len": sum(w.stats.queue_area for w in worlds) / span if span > 0 else 0.0,
        "arrival_rate": n_requests / span if span > 0 else 0.0,
        "iterations": sum(w.stats.iterations for w in worlds),
    }


def cluster_saturation(
    worlds: list[TimedWorld], per_replica: list[list[RequestRecord]], closed: bool = False
) -> dict[str, Any]:
    """Saturated when any replica is (:func:`simlab.engines.timed.load.load_verdict`), saying
    which; the verdict is the worst replica's."""
    reasons, verdicts = [], []
    for k, (world, records) in enumerate(zip(worlds, per_replica, strict=True)):
        if records:
            flagged = verdict_of(world, records, closed)
            verdicts.append(flagged["load"])
            if flagged["saturated"]:
                reasons.append(f"replica {k}: {flagged['saturation']}")
    worst = max(verdicts, key=LOAD_ORDER.index, default="ok")
    return {"load": worst, "saturated": bool(reasons), "saturation": "; ".join(reasons)}


def merged_occupancy(worlds: list[TimedWorld]) -> list[tuple[float, int, int]]:
    """Cluster cache bytes over time: at each replica's sample, the sum over replicas of
    their latest KV and SSM bytes."""
    samples = sorted(
        (t, k, kv, ssm) for k, w in enumerate(worlds) for t, kv, ssm in w.stats.occupancy
    )
    kv_now, ssm_now = [0] * len(worlds), [0] * len(worlds)
    out = []
    for t, k, kv, ssm in samples:
        kv_now[k], ssm_now[k] = kv, ssm
        out.append((t, sum(kv_now), sum(ssm_now)))
    return out
