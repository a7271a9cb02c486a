"""Every arrival mode behind one call: :func:`assign` (``arrivals.mode`` in the run config).

=============  ===================================================================================
mode           arrival times
=============  ===================================================================================
poisson        :func:`traces.arrivals.assign_arrivals`: Poisson session starts at
               ``session_rate`` (sessions/s), the first at 0; within-session gaps by ``gaps``
uniform        same module: session ``i`` (in session_id order) starts at exactly
               ``i / session_rate`` (the Marconi paper's construction); gaps by ``gaps``
trace          same module: Poisson session starts, within-session gaps from ``ref_timestamp``
timestamps     the trace's own clock for *every* request: ``arrival = (ref_timestamp -
               min(ref_timestamp)) x time_scale`` (seconds; ``0.5`` = twice as fast). For
               Mooncake (request = session) and the Azure baseline this replays the recorded
               arrival process exactly; for SWE-bench it replays the provider's ``created``
               times. ``session_rate``/``think_time_mean``
               and ``seed`` are not used.
azure          session starts from a real arrival process: session ``i`` (in session_id order)
               starts at the ``i``-th Azure arrival time (rebased to 0) times ``time_scale``
               (``0.5`` = twice the rate); when the trace has more sessions than the Azure file
               has rows, the process repeats, shifted by its span plus its mean gap. Within a
               session, gaps by ``gaps`` drawn from ``default_rng(seed)`` in (session_id, turn)
               order. ``azure`` names the file (``conv`` | ``code``), ``azure_path`` overrides it.
=============  ===================================================================================

Within-session gaps (``gaps``; modes ``poisson``, ``uniform`` and ``azure``; the gap before a
session's first request is 0; ``trace`` and ``timestamps`` take theirs from the trace and accept
only the default):

===============  ==================================================================================
gaps             gap before request ``k >= 1`` of a session
===============  ==================================================================================
exponential      Exponential(mean ``think_time_mean`` s), ``0`` = back to back (the default; the
                 draws are those of every earlier version, so existing runs are unchanged)
typing           the user's typing time of the message request ``k`` ends with:
                 ``ref_user_words * 60 / typing_wpm`` s (the Marconi paper: 90 words/min).
                 ``ref_user_words`` = spaces in the message text, recorded by the chat loaders
                 (:func:`traces.sharegpt.user_words`); other traces raise
                 :class:`traces.arrivals.GapsError`. No random draws
poisson_seconds  Poisson(``response_time``) whole seconds (the paper's SWE-bench "average response
                 time", 5 / 7.5 / 10 s), one draw per request after its session's first, from
                 ``default_rng(seed)`` in (session_id, turn) order (after the session-start draws
                 of ``poisson``)
===============  ==================================================================================

Invariants (all modes): the input trace is unchanged; the result keeps the trace's name and
``block_size``; arrivals are finite, >= 0 and non-decreasing in ``turn`` within every session
(``timestamps`` mode clamps a within-session step back in time to the previous arrival and logs
how many it clamped); the same inputs and seed give the same arrivals.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from traces.arrivals import GapsError, assign_arrivals, check_gaps, within_session_gaps
from traces.azure import azure_path as resolve_azure_path
from traces.azure import load_azure_arrivals
from traces.format import Trace

log = logging.getLogger(__name__)

MODES = ("poisson", "uniform", "trace", "timestamps", "azure")
#: modes whose within-session gaps follow ``gaps`` (the others take them from the trace)
GAP_MODES = ("poisson", "uniform", "azure")


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
    gaps: str = "exponential",
    typing_wpm: float = 90.0,
    response_time: float = 7.5,
) -> Trace:
    """A copy of ``trace`` with ``arrival`` set by ``mode`` and ``gaps`` (see the module
    docstring); :class:`ValueError` for a bad parameter, :class:`GapsError` for ``gaps`` that
    this mode or trace cannot apply."""
    check_gaps(gaps, typing_wpm, response_time)
    if gaps != "exponential" and mode not in GAP_MODES:
        raise GapsError(f"gaps={gaps!r} applies to modes {GAP_MODES} only, not {mode!r}")
    if mode in ("poisson", "uniform", "trace"):
        out = assign_arrivals(
            trace,
            session_rate=session_rate,
            think_time_mean=think_time_mean,
            seed=seed,
            mode=mode,
            gaps=gaps,
            typing_wpm=typing_wpm,
            response_time=response_time,
        )
        return out
    if mode in ("timestamps", "azure") and (not np.isfinite(time_scale) or time_scale <= 0):
        raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
    if mode == "timestamps":
        return assign_timestamps(trace, time_scale)
    if mode == "azure":
        starts = load_azure_arrivals(
            resolve_azure_path(azure, azure_path, data_dir, "arrivals.azure_path")
        ).timestamps_s
        return assign_session_starts(
            trace,
            starts * float(time_scale),
            think_time_mean,
            seed,
            gaps=gaps,
            typing_wpm=typing_wpm,
            response_time=response_time,
        )
    raise ValueError(f"arrivals mode must be one of {MODES}, got {mode!r}")


def _session_order(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Row order by (session_id, turn) and a mask of each session's first row in that order."""
    order = np.lexsort((trace.column("turn"), trace.column("session_id")))
    sessions = trace.column("session_id")[order]
    first = np.r_[True, sessions[1:] != sessions[:-1]] if len(order) else np.zeros(0, bool)
    return order, first


def _with_arrivals(trace: Trace, order: np.ndarray, arrival: np.ndarray) -> Trace:
    column = np.empty(len(order))
    column[order] = arrival
    return trace.with_arrivals(column)


def assign_timestamps(trace: Trace, time_scale: float = 1.0) -> Trace:
    """``arrival = (ref_timestamp - min(ref_timestamp)) x time_scale`` for every request
    (seconds; ``time_scale=0.5`` replays the trace twice as fast)."""
    if "ref_timestamp" not in trace.columns:
        raise ValueError(
            f"arrivals mode 'timestamps' needs a ref_timestamp column; trace {trace.name!r} has "
            f"{trace.reference_columns or 'no reference columns'}"
        )
    stamps = np.asarray(trace.column("ref_timestamp"), dtype=np.float64)
    if not np.isfinite(stamps).all():
        raise ValueError(f"trace {trace.name!r}: missing or infinite ref_timestamp values")
    order, first = _session_order(trace)
    rebased = (stamps - stamps.min())[order]
    if time_scale != 1.0:  # 1.0 leaves the arrivals bit-identical
        rebased = rebased * float(time_scale)
    clamped = running_max_within(rebased, first)
    moved = int((clamped != rebased).sum())
    if moved:
        log.warning("trace %s: %d within-session timestamps clamped forward", trace.name, moved)
    return _with_arrivals(trace, order, clamped)


def running_max_within(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The running maximum of ``values`` restarting where ``first`` is set (rows grouped by
    session): only the sessions that ever step back are walked."""
    out = np.array(values, dtype=np.float64)
    back = np.flatnonzero((np.diff(out) < 0) & ~first[1:]) + 1
    if back.size == 0:
        return out
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(out)]
    for s in np.unique(starts[np.searchsorted(starts, back, side="right") - 1]).tolist():
        e = int(ends[np.searchsorted(starts, s)])
        out[s:e] = np.maximum.accumulate(out[s:e])
    return out


def compensated_cumsum_within(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The cumulative sum of ``values`` restarting where ``first`` is set (rows grouped by
    session), with Kahan compensation: the floats of a grouped pandas ``cumsum``, bit for bit
    (earlier versions computed it so; runs keep their arrivals). Steps every session's ``k``-th
    row together, so the loop runs as many times as the longest session has rows."""
    values = np.asarray(values, dtype=np.float64)
    starts = np.flatnonzero(first)
    lengths = np.diff(np.r_[starts, len(values)])
    out = np.empty_like(values)
    accum = np.zeros(len(starts))
    compensation = np.zeros(len(starts))
    for k in range(int(lengths.max()) if len(starts) else 0):
        alive = np.flatnonzero(lengths > k)
        rows = starts[alive] + k
        y = values[rows] - compensation[alive]
        t = accum[alive] + y
        compensation[alive] = (t - accum[alive]) - y
        accum[alive] = t
        out[rows] = t
    return out


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
    trace: Trace,
    starts: np.ndarray,
    think_time_mean: float,
    seed: int,
    *,
    gaps: str = "exponential",
    typing_wpm: float = 90.0,
    response_time: float = 7.5,
) -> Trace:
    """Session ``i`` starts at ``tiled_starts(starts)[i]``; ``gaps`` within sessions (drawn from
    ``default_rng(seed)`` in (session_id, turn) order)."""
    if not np.isfinite(think_time_mean) or think_time_mean < 0:
        raise ValueError(f"think_time_mean must be a finite number >= 0 s, got {think_time_mean}")
    rng = np.random.default_rng(seed)
    order, first = _session_order(trace)
    session_index = np.cumsum(first) - 1
    begin = tiled_starts(starts, int(first.sum()))
    within_gaps = within_session_gaps(
        rng,
        trace,
        order,
        first,
        gaps=gaps,
        think_time_mean=think_time_mean,
        typing_wpm=typing_wpm,
        response_time=response_time,
    )
    within = compensated_cumsum_within(within_gaps, first)
    return _with_arrivals(trace, order, begin[session_index] + within)
