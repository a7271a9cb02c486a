"""Every arrival mode behind one call: :func:`assign` (``arrivals.mode`` in the run config).

=============  ===================================================================================
mode           arrival times
=============  ===================================================================================
poisson        :func:`traces.arrivals.assign_arrivals`: Poisson session starts at
               ``session_rate``, Exponential(``think_time_mean``) gaps within a session
trace          same module: Poisson session starts, within-session gaps from ``ref_timestamp``
timestamps     the trace's own clock for *every* request: ``arrival = ref_timestamp -
               min(ref_timestamp)`` (seconds). For Mooncake (request = session) and the Azure
               baseline this replays the recorded arrival process exactly; for SWE-bench it
               replays the provider's ``created`` times. ``session_rate``/``think_time_mean``
               and ``seed`` are not used.
azure          session starts from a real arrival process: session ``i`` (in session_id order)
               starts at the ``i``-th Azure arrival time (rebased to 0) times ``time_scale``
               (``0.5`` = twice the rate); when the trace has more sessions than the Azure file
               has rows, the process repeats, shifted by its span plus its mean gap. Within a
               session, Exponential(``think_time_mean``) gaps drawn from ``default_rng(seed)`` in
               (session_id, turn) order. ``azure`` names the file (``conv`` | ``code``),
               ``azure_path`` overrides it.
=============  ===================================================================================

Invariants (all modes): the input trace is unchanged; the result keeps the trace's name and
``block_size``; arrivals are finite, >= 0 and non-decreasing in ``turn`` within every session
(``timestamps`` mode clamps a within-session step back in time to the previous arrival and logs
how many it clamped); the same inputs and seed give the same arrivals.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pandas as pd

from traces.arrivals import assign_arrivals
from traces.azure import azure_path as resolve_azure_path
from traces.azure import load_azure_arrivals
from traces.format import Trace

log = logging.getLogger(__name__)

MODES = ("poisson", "trace", "timestamps", "azure")


def assign(
    trace: Trace,
    *,
    mode: str = "poisson",
    session_rate: float = 1.0,
    think_time_mean: float = 0.0,
    seed: int = 0,
    azure: str = "conv",
    azure_path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    time_scale: float = 1.0,
) -> Trace:
    """A copy of ``trace`` with ``arrival`` set by ``mode`` (see the module docstring)."""
    if mode in ("poisson", "trace"):
        out = assign_arrivals(
            trace,
            session_rate=session_rate,
            think_time_mean=think_time_mean,
            seed=seed,
            mode=mode,
        )
        if out.block_size != trace.block_size:  # frame.attrs normally carries it over
            out = Trace(name=out.name, frame=out.frame, block_size=trace.block_size)
        return out
    if mode == "timestamps":
        return assign_timestamps(trace)
    if mode == "azure":
        if not np.isfinite(time_scale) or time_scale <= 0:
            raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
        starts = load_azure_arrivals(
            resolve_azure_path(azure, azure_path, data_dir, "arrivals.azure_path")
        ).timestamps_s
        return assign_session_starts(trace, starts * float(time_scale), think_time_mean, seed)
    raise ValueError(f"arrivals mode must be one of {MODES}, got {mode!r}")


def _session_order(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Row order by (session_id, turn) and a mask of each session's first row in that order."""
    order = np.lexsort((frame["turn"].to_numpy(), frame["session_id"].to_numpy()))
    sessions = frame["session_id"].to_numpy()[order]
    first = np.r_[True, sessions[1:] != sessions[:-1]] if len(order) else np.zeros(0, bool)
    return order, first


def _with_arrivals(trace: Trace, order: np.ndarray, arrival: np.ndarray) -> Trace:
    out = trace.frame.copy()
    column = np.empty(len(order))
    column[order] = arrival
    out["arrival"] = column
    return Trace(name=trace.name, frame=out, block_size=trace.block_size)


def assign_timestamps(trace: Trace) -> Trace:
    """``arrival = ref_timestamp - min(ref_timestamp)`` for every request (seconds)."""
    frame = trace.frame
    if "ref_timestamp" not in frame.columns:
        raise ValueError(
            f"arrivals mode 'timestamps' needs a ref_timestamp column; trace {trace.name!r} has "
            f"{trace.reference_columns or 'no reference columns'}"
        )
    stamps = pd.to_numeric(frame["ref_timestamp"]).to_numpy(dtype=np.float64)
    if not np.isfinite(stamps).all():
        raise ValueError(f"trace {trace.name!r}: missing or infinite ref_timestamp values")
    order, first = _session_order(frame)
    rebased = (stamps - stamps.min())[order]
    session_index = np.cumsum(first) - 1
    clamped = pd.Series(rebased).groupby(session_index).cummax().to_numpy()
    moved = int((clamped != rebased).sum())
    if moved:
        log.warning("trace %s: %d within-session timestamps clamped forward", trace.name, moved)
    return _with_arrivals(trace, order, clamped)


def tiled_starts(starts: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` times of ``starts`` repeated end to end (shift = span + mean gap)."""
    starts = np.asarray(starts, dtype=np.float64)
    if starts.size == 0:
        raise ValueError("no arrival times to map sessions onto")
    if n <= starts.size:
        return starts[:n]
    span = starts[-1] - starts[0]
    period = span + (span / (starts.size - 1) if starts.size > 1 else 1.0)
    reps = -(-n // starts.size)
    tiled = (starts[None, :] - starts[0] + period * np.arange(reps)[:, None]).ravel()
    return tiled[:n]


def assign_session_starts(
    trace: Trace, starts: np.ndarray, think_time_mean: float, seed: int
) -> Trace:
    """Session ``i`` starts at ``tiled_starts(starts)[i]``; Exponential think-time gaps after."""
    if not np.isfinite(think_time_mean) or think_time_mean < 0:
        raise ValueError(f"think_time_mean must be a finite number >= 0 s, got {think_time_mean}")
    rng = np.random.default_rng(seed)
    order, first = _session_order(trace.frame)
    session_index = np.cumsum(first) - 1
    begin = tiled_starts(starts, int(first.sum()))
    if think_time_mean > 0:
        gaps = rng.exponential(think_time_mean, size=len(order))
    else:
        gaps = np.zeros(len(order))
    gaps[first] = 0.0
    within = pd.Series(gaps).groupby(session_index).cumsum().to_numpy()
    return _with_arrivals(trace, order, begin[session_index] + within)
