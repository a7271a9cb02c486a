"""One flat, typed record per request, and the per-policy summary computed from records.

Reports and sweeps read ``records.parquet`` and ``summary.json``, never live simulator objects.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.atomic import atomic_path
from traces.format import write_frame_atomic


@dataclass(slots=True)
class RequestRecord:
    policy: str
    request_id: int
    session_id: int
    turn: int
    arrival: float
    input_tokens: int
    output_tokens: int
    matched_tokens: int  # longest cached prefix, ignoring the checkpoint rule
    hit_tokens: int  # tokens whose prefill was skipped
    prefill_flops: float  # FLOPs to prefill the whole input from scratch
    flops_saved: float  # FLOPs of the skipped prefix
    kv_bytes_admitted: int
    ssm_bytes_admitted: int
    ckpts_admitted: int
    bytes_evicted: int
    nodes_evicted: int
    admission_truncated: bool
    cache_kv_bytes: int  # cache contents after the request was admitted
    cache_ssm_bytes: int
    # timed engine only (NaN in replay), simulated seconds
    scheduled: float = math.nan  # left the queue, prefix looked up
    first_token: float = math.nan
    finished: float = math.nan
    ttft: float = math.nan  # first_token - arrival
    queue_delay: float = math.nan  # scheduled - arrival
    tpot: float = math.nan  # (finished - first_token) / (output_tokens - 1)
    e2e: float = math.nan  # finished - arrival
    prefill_time: float = math.nan  # cost model: this request's uncached prefill, alone
    # host tier only (``cache.host_gb``; None without one, and then no column): the part of
    # ``hit_tokens`` loaded back from the host, the bytes loaded (KV + states), and the load's
    # seconds on the request's critical path (timed engine; NaN in replay)
    host_hit_tokens: int | None = None
    host_loaded_bytes: int | None = None
    host_load_s: float = math.nan


#: columns a run with a host tier adds (:mod:`simlab.tiers`)
HOST_COLUMNS = ["host_hit_tokens", "host_loaded_bytes", "host_load_s"]
RECORD_COLUMNS = [f.name for f in dataclasses.fields(RequestRecord) if f.name not in HOST_COLUMNS]
_as_row = operator.attrgetter(*RECORD_COLUMNS)


def records_frame(records: list[RequestRecord]) -> pd.DataFrame:
    """One row per record; the host-tier columns only when the run had a host tier."""
    frame = pd.DataFrame.from_records([_as_row(r) for r in records], columns=RECORD_COLUMNS)
    if records and records[0].host_hit_tokens is not None:
        frame = frame.assign(**{c: [getattr(r, c) for r in records] for c in HOST_COLUMNS})
    return frame


def summarize(
    frame: pd.DataFrame, min_hit_tokens: int = 1, min_hit_share: float = 0.0
) -> dict[str, Any]:
    """Hit rates, FLOPs and bytes of one policy's records. A request counts as a hit when it
    reuses at least ``min_hit_tokens`` tokens and ``min_hit_share`` of its input."""
    input_tokens = int(frame["input_tokens"].sum())
    flops = float(frame["prefill_flops"].sum())
    cache_total = frame["cache_kv_bytes"] + frame["cache_ssm_bytes"]
    return {
        "requests": len(frame),
        "sessions": int(frame["session_id"].nunique()),
        "input_tokens": input_tokens,
        "hit_tokens": int(frame["hit_tokens"].sum()),
        "token_hit_rate": float(frame["hit_tokens"].sum() / input_tokens) if input_tokens else 0.0,
        "request_hit_rate": float(
            (
                (frame["hit_tokens"] >= max(1, min_hit_tokens))
                & (frame["hit_tokens"] >= min_hit_share * frame["input_tokens"])
            ).mean()
        ),
        "matched_tokens": int(frame["matched_tokens"].sum()),
        "prefill_flops": flops,
        "flops_saved": float(frame["flops_saved"].sum()),
        "flops_saved_ratio": float(frame["flops_saved"].sum() / flops) if flops else 0.0,
        "kv_bytes_admitted": int(frame["kv_bytes_admitted"].sum()),
        "ssm_bytes_admitted": int(frame["ssm_bytes_admitted"].sum()),
        "ckpts_admitted": int(frame["ckpts_admitted"].sum()),
        "bytes_evicted": int(frame["bytes_evicted"].sum()),
        "nodes_evicted": int(frame["nodes_evicted"].sum()),
        "admissions_truncated": int(frame["admission_truncated"].sum()),
        "final_kv_bytes": int(frame["cache_kv_bytes"].iloc[-1]),
        "final_ssm_bytes": int(frame["cache_ssm_bytes"].iloc[-1]),
        "max_resident_bytes": int(cache_total.max()),
    } | host_summary(frame, input_tokens)


def host_summary(frame: pd.DataFrame, input_tokens: int) -> dict[str, Any]:
    """With a host tier: the hit split into its GPU and host parts (``token_hit_rate`` counts
    both), the bytes loaded back and their seconds on the critical path ({} without one)."""
    if "host_hit_tokens" not in frame.columns:
        return {}
    host = int(frame["host_hit_tokens"].sum())
    gpu = int(frame["hit_tokens"].sum()) - host
    load = frame["host_load_s"].dropna()
    return {
        "host_hit_tokens": host,
        "host_token_hit_rate": host / input_tokens if input_tokens else 0.0,
        "gpu_token_hit_rate": gpu / input_tokens if input_tokens else 0.0,
        "host_hit_requests": int((frame["host_hit_tokens"] > 0).sum()),
        "host_loaded_gb": float(frame["host_loaded_bytes"].sum()) / 1e9,
        "host_load_s_total": float(load.sum()) if load.size else math.nan,
    }


#: Latency columns and the percentiles of each that a timed run's summary reports.
LATENCY_PERCENTILES = {
    "ttft": (5, 50, 95),
    "tpot": (50, 95),
    "e2e": (5, 50, 95),
    "queue_delay": (50, 95),
}


def latency_summary(frame: pd.DataFrame) -> dict[str, Any]:
    """TTFT / TPOT / end-to-end / queueing percentiles and throughput of a timed run ({} for
    replay records, whose latency columns are NaN)."""
    if frame["ttft"].isna().all():
        return {}
    out: dict[str, Any] = {}
    for col, pcts in LATENCY_PERCENTILES.items():
        values = frame[col].dropna().to_numpy()
        for p in pcts:
            out[f"{col}_p{p}"] = float(np.percentile(values, p)) if values.size else math.nan
    span = float(frame["finished"].max() - frame["arrival"].min())
    out["makespan_s"] = span
    out["throughput_rps"] = len(frame) / span if span > 0 else math.nan
    out["throughput_tps"] = float(frame["output_tokens"].sum()) / span if span > 0 else math.nan
    out["mean_queue_delay"] = float(frame["queue_delay"].mean())
    return out


def write_records(frame: pd.DataFrame, path: Path) -> None:
    write_frame_atomic(frame, path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_json_atomic(data: dict[str, Any], path: Path) -> None:
    """Write JSON through a temp file and a rename, so readers never see a partial file."""
    with atomic_path(path) as tmp, tmp.open("w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=_jsonable)
