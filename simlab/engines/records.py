"""One flat, typed record per request, and the per-policy summary computed from records.

Reports and sweeps read ``records.parquet`` and ``summary.json``, never live simulator objects.
A run holds its records as :data:`Columns` (numpy arrays by name, in :data:`RECORD_COLUMNS`
order) and writes them with pyarrow: a replay never imports pandas (``python -m simlab``'s
start-up); :func:`as_frame` gives the same table as a DataFrame, with the dtypes a DataFrame
built from the records would have.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from traces.atomic import atomic_path

if TYPE_CHECKING:
    import pandas as pd

    from simlab.model.spec import ModelSpec
    from traces.format import Request

#: a table: equal-length numpy columns by name, in order (records, occupancy)
Columns = dict[str, np.ndarray]


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
    ckpts_admitted: int  # SSM states admitted (an id's every state on a hash-id trace)
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


def request_record(
    policy: str, req: Request, model: ModelSpec, matched: int, hit: int, **cache: Any
) -> RequestRecord:
    """``req``'s record with its request columns filled from the request and the model
    (``matched`` and ``hit`` in tokens; FLOPs of the whole input and of the hit) and the
    ``cache`` columns (admitted, evicted, the cache's contents) from the engine."""
    return RequestRecord(
        policy=policy,
        request_id=req.request_id,
        session_id=req.session_id,
        turn=req.turn,
        arrival=req.arrival,
        input_tokens=req.input_tokens,
        output_tokens=req.output_len,
        prefill_flops=model.prefill_flops(0, req.input_tokens),
        **hit_columns(model, matched, hit),
        **cache,
    )


def hit_columns(model: ModelSpec, matched: int, hit: int) -> dict[str, Any]:
    """A record's lookup columns for ``matched`` and ``hit`` tokens. A request recomputed
    after a preemption reports its first scheduling's (SGLang's ``cached_tokens`` is counted
    once, ``retracted_stain``; vLLM's ``num_cached_tokens`` is set once)."""
    return {
        "matched_tokens": matched,
        "hit_tokens": hit,
        "flops_saved": model.prefill_flops(0, hit) if hit else 0.0,
    }


#: columns a run with a host tier adds (:mod:`simlab.cache.host_tier`)
HOST_COLUMNS = ["host_hit_tokens", "host_loaded_bytes", "host_load_s"]
RECORD_COLUMNS = [f.name for f in dataclasses.fields(RequestRecord) if f.name not in HOST_COLUMNS]


def record_columns(records: list[RequestRecord], extra: dict[str, Any] | None = None) -> Columns:
    """One column per record field (the host-tier columns only when the run had a host tier),
    then ``extra`` (an engine's per-record columns). Types are inferred from the values as a
    DataFrame infers them (ints -> int64, floats or ints and floats -> float64, bools -> bool);
    ``policy`` holds Python strings."""
    names = list(RECORD_COLUMNS)
    if records and records[0].host_hit_tokens is not None:
        names += HOST_COLUMNS
    rows = list(zip(*(operator.attrgetter(*names)(r) for r in records), strict=True))
    columns = {
        name: _column(values, object if name == "policy" else None)
        for name, values in zip(names, rows or [()] * len(names), strict=True)
    }
    for name, values in (extra or {}).items():
        columns[name] = _column(values)
    return columns


def _column(values: Any, dtype: Any = None) -> np.ndarray:
    if dtype is object:
        out = np.empty(len(values), dtype=object)
        out[:] = list(values)
        return out
    return np.asarray(values, dtype=dtype)


def concat_columns(tables: list[Columns]) -> Columns:
    """The tables one after another; a column some tables lack is NaN in their rows (as
    ``pd.concat`` fills it)."""
    if len(tables) == 1:
        return dict(tables[0])
    names = dict.fromkeys(name for table in tables for name in table)
    rows = [len(next(iter(table.values()), ())) for table in tables]
    return {
        name: np.concatenate(
            [
                t[name] if name in t else np.full(n, math.nan)
                for t, n in zip(tables, rows, strict=True)
            ]
        )
        for name in names
    }


def as_frame(columns: Columns) -> pd.DataFrame:
    """The table as a DataFrame (imports pandas: reports, sweeps and tests only)."""
    import pandas as pd

    return pd.DataFrame(columns)


def records_frame(records: list[RequestRecord]) -> pd.DataFrame:
    """One row per record; the host-tier columns only when the run had a host tier."""
    return as_frame(record_columns(records))


def summarize(
    frame: Columns | pd.DataFrame, min_hit_tokens: int = 1, min_hit_share: float = 0.0
) -> dict[str, Any]:
    """Hit rates, FLOPs and bytes of one policy's records (:data:`Columns` or a DataFrame). A
    request counts as a hit when it reuses at least ``min_hit_tokens`` tokens and
    ``min_hit_share`` of its input."""
    col = _columns_of(frame)
    inputs, hits = col("input_tokens"), col("hit_tokens")
    input_tokens = int(inputs.sum())
    flops = float(col("prefill_flops").sum())
    saved = float(col("flops_saved").sum())
    cache_total = col("cache_kv_bytes") + col("cache_ssm_bytes")
    is_hit = (hits >= max(1, min_hit_tokens)) & (hits >= min_hit_share * inputs)
    return {
        "requests": len(inputs),
        "sessions": len(np.unique(col("session_id"))),
        "input_tokens": input_tokens,
        "hit_tokens": int(hits.sum()),
        "token_hit_rate": float(hits.sum() / input_tokens) if input_tokens else 0.0,
        "request_hit_rate": float(is_hit.mean()),
        "matched_tokens": int(col("matched_tokens").sum()),
        "prefill_flops": flops,
        "flops_saved": saved,
        "flops_saved_ratio": saved / flops if flops else 0.0,
        "kv_bytes_admitted": int(col("kv_bytes_admitted").sum()),
        "ssm_bytes_admitted": int(col("ssm_bytes_admitted").sum()),
        "ckpts_admitted": int(col("ckpts_admitted").sum()),
        "bytes_evicted": int(col("bytes_evicted").sum()),
        "nodes_evicted": int(col("nodes_evicted").sum()),
        "admissions_truncated": int(col("admission_truncated").sum()),
        "final_kv_bytes": int(col("cache_kv_bytes")[-1]),
        "final_ssm_bytes": int(col("cache_ssm_bytes")[-1]),
        "max_resident_bytes": int(cache_total.max()),
    } | host_summary(frame, input_tokens)


def _columns_of(table: Columns | pd.DataFrame) -> Callable[[str], np.ndarray]:
    """``name -> numpy array`` of a :data:`Columns` table or a DataFrame."""
    return lambda name: np.asarray(table[name])


def host_summary(frame: Columns | pd.DataFrame, input_tokens: int) -> dict[str, Any]:
    """With a host tier: the hit split into its GPU and host parts (``token_hit_rate`` counts
    both), the bytes loaded back and their seconds on the critical path ({} without one)."""
    if "host_hit_tokens" not in frame:
        return {}
    col = _columns_of(frame)
    host = int(col("host_hit_tokens").sum())
    gpu = int(col("hit_tokens").sum()) - host
    load = _finite(col("host_load_s"))
    return {
        "host_hit_tokens": host,
        "host_token_hit_rate": host / input_tokens if input_tokens else 0.0,
        "gpu_token_hit_rate": gpu / input_tokens if input_tokens else 0.0,
        "host_hit_requests": int((col("host_hit_tokens") > 0).sum()),
        "host_loaded_gb": float(col("host_loaded_bytes").sum()) / 1e9,
        "host_load_s_total": float(load.sum()) if load.size else math.nan,
    }


def _finite(values: np.ndarray) -> np.ndarray:
    """``values`` without its NaNs (a DataFrame's ``dropna``)."""
    values = np.asarray(values, dtype=np.float64)
    return values[~np.isnan(values)]


#: Latency columns and the percentiles of each that a timed run's summary reports.
LATENCY_PERCENTILES = {
    "ttft": (5, 50, 95),
    "tpot": (50, 95),
    "e2e": (5, 50, 95),
    "queue_delay": (50, 95),
}


def latency_summary(frame: Columns | pd.DataFrame) -> dict[str, Any]:
    """TTFT / TPOT / end-to-end / queueing percentiles and throughput of a timed run ({} for
    replay records, whose latency columns are NaN). NaNs are skipped, as a DataFrame skips
    them."""
    col = _columns_of(frame)
    if np.isnan(col("ttft").astype(np.float64)).all():
        return {}
    out: dict[str, Any] = {}
    for name, pcts in LATENCY_PERCENTILES.items():
        values = _finite(col(name))
        for p in pcts:
            out[f"{name}_p{p}"] = float(np.percentile(values, p)) if values.size else math.nan
    span = float(np.nanmax(col("finished")) - np.nanmin(col("arrival")))
    out["makespan_s"] = span
    out["throughput_rps"] = len(col("ttft")) / span if span > 0 else math.nan
    out["throughput_tps"] = float(col("output_tokens").sum()) / span if span > 0 else math.nan
    out["mean_queue_delay"] = _nan_mean(col("queue_delay"))
    return out


def _nan_mean(values: np.ndarray) -> float:
    """The mean of the non-NaN values, summed as a DataFrame sums them (NaNs as zeros, so the
    floats are the same); NaN when there are none."""
    values = np.asarray(values, dtype=np.float64)
    present = ~np.isnan(values)
    count = int(present.sum())
    return float(np.where(present, values, 0.0).sum() / count) if count else math.nan


def write_records(table: Columns, path: Path) -> None:
    """``table`` as a parquet file, written atomically (:func:`traces.format.write_table_atomic`)."""
    from traces.format import write_table_atomic

    write_table_atomic(table, path)


def strict_json(value: Any) -> Any:
    """``value`` with every float made valid JSON (RFC 8259 has no NaN or Infinity): NaN (a
    metric with nothing to measure, e.g. ``hit_vs_infinite`` when the bound is 0) becomes null,
    an infinity the string ``"inf"`` / ``"-inf"`` (``cache.size_gb=inf``; ``float()`` reads it
    back); numpy scalars become Python ones. Containers are copied, everything else kept."""
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


def write_json_atomic(data: dict[str, Any], path: Path) -> None:
    """Write strict JSON (:func:`strict_json`) through a temp file and a rename, so readers
    never see a partial file."""
    with atomic_path(path) as tmp, tmp.open("w") as fh:
        json.dump(strict_json(data), fh, indent=2, sort_keys=True, allow_nan=False)
