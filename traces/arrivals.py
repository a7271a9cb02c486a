"""Arrival times for a canonical trace: session starts, then the gaps within each session.

Session starts (``session_id`` order; session ``i`` is the ``i``-th session in that order):

* ``mode="poisson"``: a Poisson process of rate ``session_rate`` sessions/s; the first session
  starts at ``t = 0`` (the gaps between starts are i.i.d. Exponential(1 / rate), so the process
  is the same, minus an idle lead-in that no metric sees);
* ``mode="uniform"``: session ``i`` starts at exactly ``i / session_rate`` (the Marconi paper's
  construction; no random draws);
* ``mode="trace"``: Poisson starts as in ``poisson``, but the within-session gaps are the trace's
  own ``ref_timestamp`` differences (for SWE-bench: provider ``created`` seconds, so a gap
  includes the previous call's generation time and the tool run); negative gaps (clock skew) are
  clamped to 0; ``gaps`` must be ``exponential`` (the default) and is not used.

Within-session gaps (``gaps``, modes ``poisson`` and ``uniform``; request ``k + 1`` of a session
arrives ``gap_{k+1}`` seconds after request ``k``; the first request's gap is 0):

* ``exponential`` (default): ``Exponential(mean=think_time_mean)`` (``0`` = back to back);
* ``typing``: the user's typing time of the message the request ends with, at ``typing_wpm``
  words per minute: ``gap = ref_user_words * 60 / typing_wpm`` seconds. ``ref_user_words`` is
  recorded by the chat loaders (:func:`user_words`: the Marconi reference's "counting spaces"
  rule: the number of spaces); a trace without that column raises :class:`GapsError`. No random draws;
* ``poisson_seconds``: ``Poisson(response_time)`` whole seconds (the paper's SWE-bench
  construction, its "average response time").

The replay engine has no service time, so these gaps are the whole inter-request spacing; the
timed engine may read them as think times after each answer completes.

Invariants: the input trace is not modified; the same ``(trace, parameters, seed)`` gives the same
arrivals; arrivals are non-decreasing in ``turn`` within every session; session ``i`` starts no
earlier than session ``i - 1``. Random draws, all from one ``numpy.random.default_rng(seed)``:
first the session-start gaps (``poisson`` and ``trace`` only: one per session), then the gaps in
(session_id, turn) order: ``exponential`` draws one per request (first requests included, then
zeroed; none when ``think_time_mean == 0``), ``poisson_seconds`` one per request after the first
of its session. So ``mode="poisson"`` with ``exponential`` gaps draws exactly what it always did.
"""

from __future__ import annotations

import logging
import math
import numbers

import numpy as np

from traces.format import Trace

log = logging.getLogger(__name__)

MODES = ("poisson", "uniform", "trace")
#: within-session gap models of modes ``poisson`` and ``uniform`` (see the module docstring)
GAPS = ("exponential", "typing", "poisson_seconds")
#: the reference column ``gaps="typing"`` reads (words of each request's user message)
USER_WORDS = "ref_user_words"


class GapsError(ValueError):
    """A gap model cannot be applied to this trace (e.g. ``typing`` without word counts)."""


def assign_arrivals(
    trace: Trace,
    *,
    session_rate: float,
    think_time_mean: float,
    seed: int,
    mode: str = "poisson",
    gaps: str = "exponential",
    typing_wpm: float = 90.0,
    response_time: float = 7.5,
) -> Trace:
    """A new :class:`Trace` equal to ``trace`` with its ``arrival`` column set (see module)."""
    _check_parameters(session_rate, think_time_mean, mode)
    check_gaps(gaps, typing_wpm, response_time)
    if mode == "trace" and gaps != "exponential":
        raise GapsError(f"mode 'trace' takes its gaps from ref_timestamp; gaps={gaps!r} unused")
    rng = np.random.default_rng(seed)
    order = np.lexsort((trace.column("turn"), trace.column("session_id")))
    sessions = trace.column("session_id")[order]
    first = np.r_[True, sessions[1:] != sessions[:-1]]
    n_sessions = int(first.sum())
    if mode == "uniform":
        starts = uniform_starts(n_sessions, session_rate)
    else:
        starts = _session_starts(rng, n_sessions, session_rate)
    if mode == "trace":
        within = _trace_gaps(trace, order)
        within[first] = 0.0
    else:
        within = within_session_gaps(
            rng,
            trace,
            order,
            first,
            gaps=gaps,
            think_time_mean=think_time_mean,
            typing_wpm=typing_wpm,
            response_time=response_time,
        )
    arrival = _cumulative_within_sessions(within, first) + np.repeat(starts, _run_lengths(first))
    column = np.empty(len(order))
    column[order] = arrival
    return trace.with_arrivals(column)


def _check_parameters(session_rate: float, think_time_mean: float, mode: str) -> None:
    """Clear errors for rates and means that cannot define a process."""
    if not _is_finite_real(session_rate) or session_rate <= 0:
        raise ValueError(
            f"session_rate must be a finite number > 0 sessions/s, got {session_rate!r}"
        )
    if not _is_finite_real(think_time_mean) or think_time_mean < 0:
        raise ValueError(f"think_time_mean must be a finite number >= 0 s, got {think_time_mean!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def check_gaps(gaps: str, typing_wpm: float, response_time: float) -> None:
    """Clear errors for an unknown gap model or parameters that cannot define one."""
    if gaps not in GAPS:
        raise ValueError(f"gaps must be one of {GAPS}, got {gaps!r}")
    if not _is_finite_real(typing_wpm) or typing_wpm <= 0:
        raise ValueError(f"typing_wpm must be a finite number > 0 words/min, got {typing_wpm!r}")
    if not _is_finite_real(response_time) or response_time < 0:
        raise ValueError(f"response_time must be a finite number >= 0 s, got {response_time!r}")


def _is_finite_real(value: object) -> bool:
    """True for finite int/float (numpy scalars included), False for bools and anything else."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def within_session_gaps(
    rng: np.random.Generator,
    trace: Trace,
    order: np.ndarray,
    first: np.ndarray,
    *,
    gaps: str,
    think_time_mean: float,
    typing_wpm: float,
    response_time: float,
) -> np.ndarray:
    """The gap before each request, rows in ``order`` ((session_id, turn) order); 0 where
    ``first`` (a session's first request). Draw order: see the module docstring."""
    n = len(order)
    if gaps == "exponential":
        out = _think_times(rng, n, think_time_mean)
    elif gaps == "typing":
        out = typing_gaps(trace, order, typing_wpm)
    elif gaps == "poisson_seconds":
        out = np.zeros(n)
        out[~first] = rng.poisson(response_time, size=n - int(first.sum()))
    else:
        raise ValueError(f"gaps must be one of {GAPS}, got {gaps!r}")
    out[first] = 0.0
    return out


def typing_gaps(trace: Trace, order: np.ndarray, typing_wpm: float) -> np.ndarray:
    """``ref_user_words * 60 / typing_wpm`` seconds per row, in ``order``; :class:`GapsError`
    when the trace has no (or an incomplete) ``ref_user_words`` column."""
    if USER_WORDS not in trace.columns:
        raise GapsError(
            f"trace {trace.name!r} has no {USER_WORDS} column (the word count of each request's "
            "user message, recorded by the chat loaders sharegpt and lmsys); use gaps "
            "'exponential' or 'poisson_seconds'"
        )
    words = np.asarray(trace.column(USER_WORDS), dtype=np.float64)[order]
    if not np.isfinite(words).all() or (words < 0).any():
        raise GapsError(f"trace {trace.name!r}: missing or negative {USER_WORDS} values")
    return words * 60.0 / float(typing_wpm)


def _think_times(rng: np.random.Generator, n: int, mean: float) -> np.ndarray:
    """``n`` Exponential(mean) draws; all zeros (and no draws) when ``mean == 0``."""
    return rng.exponential(mean, size=n) if mean > 0 else np.zeros(n)


def uniform_starts(n_sessions: int, session_rate: float) -> np.ndarray:
    """``i / session_rate`` for ``i = 0 .. n_sessions - 1`` (each one correctly rounded)."""
    return np.arange(n_sessions, dtype=np.float64) / float(session_rate)


def _session_starts(rng: np.random.Generator, n_sessions: int, session_rate: float) -> np.ndarray:
    """Start times of ``n_sessions`` Poisson arrivals, the first at 0."""
    gaps = rng.exponential(1.0 / session_rate, size=n_sessions)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def _trace_gaps(trace: Trace, order: np.ndarray) -> np.ndarray:
    """Within-session gaps of ``ref_timestamp`` in (session, turn) order; first-turn gaps unset."""
    if "ref_timestamp" not in trace.columns:
        raise ValueError(
            f"mode='trace' needs a ref_timestamp column; trace {trace.name!r} has "
            f"{trace.reference_columns or 'no reference columns'}"
        )
    stamps = np.asarray(trace.column("ref_timestamp"), dtype=np.float64)[order]
    if np.isnan(stamps).any():
        raise ValueError(f"mode='trace': trace {trace.name!r} has missing ref_timestamp values")
    gaps = np.diff(stamps, prepend=stamps[:1])
    negative = int((gaps < 0).sum())
    if negative:
        log.warning("trace %s: %d negative timestamp gaps clamped to 0", trace.name, negative)
    return np.maximum(gaps, 0.0)


def _run_lengths(first: np.ndarray) -> np.ndarray:
    """Lengths of the runs that start at each True of ``first`` (rows grouped by session)."""
    starts = np.flatnonzero(first)
    return np.diff(np.r_[starts, len(first)])


def _cumulative_within_sessions(gaps: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative sum of ``gaps`` restarting at every session start (where gaps are 0)."""
    total = np.cumsum(gaps)
    offsets = np.repeat(total[first], _run_lengths(first))
    return total - offsets
