"""Whether a timed run's latencies measure the policy or a backlog: the load verdict, and
whether the run reached a steady state.

**Verdict** (``summary.json``: ``load``, ``saturated``, ``saturation``). A run is *saturated*
when its latencies measure a backlog rather than the policy, judged on queueing, not on GPU busy
alone. Any of these makes it so, each named in ``saturation``:

* the backlog builds: the mean queue delay of the worst fifth of requests by arrival is over a
  second and over :data:`GROWTH` times the first fifth's (a queue that grows to the end, or the
  hump of a finite session population that drains once arrivals thin out). Not in a closed loop
  of users (``trace.users``): its queue holds at most one request per user, and its delays grow
  with what the requests ask (longer contexts later in a session), not with a backlog;
* the GPU is the bottleneck: busy over :data:`BUSY` of the span while the median request waits
  longer than it is served (``queue_delay`` against ``ttft - queue_delay``);
* the KV pool is: at least :data:`POOL_SHARE` of the requests were preempted, or waited at the
  queue's head for pool memory while others ran (admission stalls), waiting longer on average
  than the median request is served.

Otherwise the verdict is ``queueing`` when the median request still waits longer than it is
served (latency is mostly waiting, at a load the system keeps up with), and ``ok``.

**Steady state** (``steady_state``). With ``R`` sessions starting per second (their observed
rate) that last ``L`` seconds on average, a steady state holds about ``R * L`` sessions open at
once (Little's law). A run whose open sessions never reach it is a burst; a run whose arrivals
stop while a backlog still waits measures a drain for its last part (the queue clearing after
the last arrival takes more than :data:`DRAIN_SHARE` of the arrivals' span). Either gets one
warning with its numbers, and a caveat in ``summary.json``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from simlab.engines.records import RequestRecord

__all__ = [
    "BUSY",
    "DRAIN_SHARE",
    "GROWTH",
    "LOAD_ORDER",
    "POOL_SHARE",
    "load_verdict",
    "steady_state",
]

#: the verdicts, from the lightest load
LOAD_ORDER = ("ok", "queueing", "saturated")

#: the worst arrival fifth's mean queue delay over the first's that counts as a building backlog
GROWTH = 2.0
#: GPU busy fraction that, with requests waiting longer than served, counts as GPU-bound
BUSY = 0.95
#: share of requests preempted, or stalled for pool memory, that counts as pool-bound
POOL_SHARE = 0.05
#: time the queue takes to clear after the last arrival, over the arrivals' span, past which the
#: run's end measures a drain
DRAIN_SHARE = 0.1


def load_verdict(
    records: Sequence[RequestRecord],
    busy: float,
    preempted: int,
    stalled: Collection[int],
    closed: bool = False,
) -> dict[str, Any]:
    """The verdict of a run of ``records`` whose GPU was ``busy`` (fraction of its span), with
    ``preempted`` requests preempted at least once and ``stalled`` the ids of the requests that
    waited for pool memory at the queue's head (see the module docstring); ``closed``: the
    requests come from a closed loop of users, whose queue cannot build past them."""
    n = len(records)
    wait = float(np.median([r.queue_delay for r in records])) if n else 0.0
    served = float(np.median([r.ttft - r.queue_delay for r in records])) if n else 0.0
    waits_longer = wait > served
    reasons = []
    fifths = [] if closed else _fifths(records)
    if fifths and max(fifths) > max(1.0, GROWTH * fifths[0]):
        shown = " -> ".join(f"{d:.2f}" for d in fifths)
        reasons.append(f"the backlog builds: mean queue delay by arrival fifth {shown} s")
    if busy > BUSY and waits_longer:
        reasons.append(
            f"GPU busy {busy:.2f} and the median request waits {wait:.2f} s, "
            f"longer than it is served ({served:.2f} s)"
        )
    if n and preempted >= POOL_SHARE * n:
        reasons.append(f"{preempted} of {n} requests preempted: the KV pool is the bottleneck")
    stalled_wait = _mean_wait(records, stalled)
    if n and len(stalled) >= POOL_SHARE * n and stalled_wait > served:
        reasons.append(
            f"{len(stalled)} of {n} requests waited for pool memory at the queue's head, "
            f"{stalled_wait:.2f} s on average"
        )
    verdict = "saturated" if reasons else ("queueing" if waits_longer else "ok")
    return {
        "load": verdict,
        "saturated": bool(reasons),
        "saturation": "; ".join(reasons),
        "queue_delay_p50": wait,
        "service_p50": served,
        "memory_stalled_requests": len(stalled),
    }


def _mean_wait(records: Sequence[RequestRecord], ids: Collection[int]) -> float:
    """Mean queue delay of the requests of ``records`` whose ids are in ``ids`` (0 for none)."""
    waits = [r.queue_delay for r in records if r.request_id in ids]
    return float(np.mean(waits)) if waits else 0.0


def _fifths(records: Sequence[RequestRecord]) -> list[float]:
    """Mean queue delay of each fifth of ``records`` by arrival (empty under 5 records)."""
    if len(records) < 5:
        return []
    delays = [r.queue_delay for r in sorted(records, key=lambda r: (r.arrival, r.request_id))]
    return [float(np.mean(part)) for part in np.array_split(np.asarray(delays), 5)]


def steady_state(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Whether the run reached a steady state (see the module docstring); ``{}`` under two
    sessions or without a span of session starts."""
    spans: dict[int, list[float]] = {}
    for r in records:
        span = spans.setdefault(r.session_id, [math.inf, -math.inf])
        span[0], span[1] = min(span[0], r.arrival), max(span[1], r.finished)
    starts = sorted(s for s, _ in spans.values())
    if len(starts) < 2 or starts[-1] <= starts[0]:
        return {}
    rate = (len(starts) - 1) / (starts[-1] - starts[0])
    mean_length = float(np.mean([end - start for start, end in spans.values()]))
    expected, peak = rate * mean_length, _peak_open(spans.values())
    last = max(r.arrival for r in records)
    clears = max((r.scheduled for r in records), default=last) - last
    queued = sum(1 for r in records if r.scheduled > last)
    arrivals = last - min(r.arrival for r in records)
    drains = queued > 1 and arrivals > 0 and clears > DRAIN_SHARE * arrivals
    out: dict[str, Any] = {
        "reached": peak >= expected and not drains,
        "peak_open_sessions": peak,
        "session_rate": rate,
        "mean_session_s": mean_length,
        "expected_open_sessions": expected,
        "queued_at_last_arrival": queued,
        "queue_clears_s": clears,
    }
    reasons = []
    if peak < expected:
        reasons.append(
            f"at most {peak} sessions open at once, below rate x mean session length "
            f"= {rate:.3g}/s x {mean_length:.0f} s = {expected:.0f}: a burst"
        )
    if drains:
        reasons.append(
            f"arrivals stop at {last:.0f} s with {queued} requests queued, and the queue clears "
            f"{clears:.0f} s later: the run's end measures a drain"
        )
    if reasons:
        out["caveat"] = "no steady state: " + "; ".join(reasons)
    return out


def _peak_open(spans: Any) -> int:
    """The most sessions open at once (a session is open from its first arrival to its last
    request's finish)."""
    events = sorted((t, d) for start, end in spans for t, d in ((start, 1), (end, -1)))
    open_now = peak = 0
    for _, delta in events:  # at a tie, a session's end (-1) comes before another's start
        open_now += delta
        peak = max(peak, open_now)
    return peak
