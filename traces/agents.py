"""Agent sessions as a dependency graph: the canonical columns of an agentic trace.

An *agentic* trace (``trace=claude_code``, ``trace=request_log``) is a canonical trace
(:mod:`traces.format`) whose sessions form trees: a **sub-agent** is a session of its own that
its parent starts when it reaches a marker, after its turn ``spawn_turn - 1`` completes; the
parent's turn ``spawn_turn`` waits until every sub-agent started at that marker (its
*siblings*, which run concurrently) has finished. A sub-agent started after the parent's last
turn is waited for before the parent ends. A **conversation** is a root session and its
sub-agents.

Columns (one value per request row):

===================  ========  ==================================================================
column               type      meaning
===================  ========  ==================================================================
ref_parent_session   int64     the parent's ``session_id``; -1 for a root session
ref_spawn_turn       int64     the parent's turn that waits for this session (-1 for a root)
ref_agent_depth      int64     0 for a root, parent's depth + 1 for a sub-agent
ref_anchor           int64     what ``ref_delay`` counts from: 0 ``ready`` (the moment the
                               request may leave: its session's previous answer completed, its
                               sub-agents finished, or the session started), 1 ``start`` (the
                               moment its session started), 2 ``sent`` (the moment its session's
                               previous request was sent)
ref_delay            float64   seconds after the anchor; a request never leaves before ``ready``
ref_input_length     int64     the true input tokens (ids are blocks of ``Trace.block_size``)
ref_users            int64     closed loop: this many users run the conversations one after
                               another; 0: conversations start by the arrival process
ref_session_name     str       the session's name in the source (``trace_0003/agent_001``)
===================  ========  ==================================================================

Blocks. ``input_ids`` are block ids of ``block_size`` tokens, equal ids meaning equal prefixes.
A prompt whose tokens pass its whole blocks (``input_tokens > blocks x block_size``) gets one
more id, unique to that request: its tail is never hit (the ids were computed over whole blocks
only), so a full match of the hashed blocks still leaves the tail to prefill.

Replay order (engines without a clock): the arrivals :func:`schedule` gives with no service
time: a parent's requests up to the marker, then its sub-agents' requests (siblings interleaved
by their own delays), then the parent's rest, strictly after its last sub-agent's last request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from traces.format import TOKEN_DTYPE, Trace

if TYPE_CHECKING:
    import pandas as pd

READY, START, SENT = 0, 1, 2
ANCHORS = {"ready": READY, "start": START, "sent": SENT}
#: the columns that make a trace agentic (the first one is the test)
AGENT_COLUMNS = (
    "ref_parent_session",
    "ref_spawn_turn",
    "ref_agent_depth",
    "ref_anchor",
    "ref_delay",
    "ref_users",
)
_INT32_MAX = int(np.iinfo(np.int32).max)


@dataclass
class AgentRequest:
    """One request: its block ids (any int64 ids; mapped by :func:`agent_trace`), its true input
    tokens, its output tokens, and when it leaves (``anchor``, ``delay``)."""

    ids: np.ndarray
    input_tokens: int
    output_len: int
    anchor: int = READY
    delay: float = 0.0


@dataclass
class AgentSession:
    """One session: ``parent`` is the index of its parent in the session list (-1: a root),
    listed before it; ``spawn_turn`` the parent's turn that waits for it."""

    name: str
    requests: list[AgentRequest] = field(default_factory=list)
    parent: int = -1
    spawn_turn: int = -1
    depth: int = 0


def is_agentic(trace: Trace) -> bool:
    return AGENT_COLUMNS[0] in trace.columns


def agent_trace(
    name: str, sessions: Sequence[AgentSession], block_size: int, users: int = 0
) -> Trace:
    """The canonical trace of ``sessions`` (session ``i`` gets ``session_id`` ``i``): ids as
    int32 (remapped densely when any falls outside int32), a unique tail id where the tokens
    pass the whole blocks (module docstring)."""
    from traces.format import make_frame

    sessions = [s for s in sessions if s.requests]
    if not sessions:
        raise ValueError(f"trace {name!r}: no requests")
    reqs = [r for s in sessions for r in s.requests]
    ids = _block_ids(reqs, block_size)
    rows, row = [], 0
    for sid, session in enumerate(sessions):
        for turn, req in enumerate(session.requests):
            rows.append(_row(sid, turn, session, req, ids[row], users))
            row += 1
    return Trace(name=name, frame=_typed(make_frame(rows)), block_size=block_size)


def _row(sid: int, turn: int, session: AgentSession, req: AgentRequest, ids, users: int) -> dict:
    return {
        "session_id": sid,
        "turn": turn,
        "arrival": math.nan,
        "input_ids": ids,
        "output_ids": np.zeros(0, dtype=TOKEN_DTYPE),
        "output_len": int(req.output_len),
        "ref_parent_session": session.parent,
        "ref_spawn_turn": session.spawn_turn,
        "ref_agent_depth": session.depth,
        "ref_anchor": int(req.anchor),
        "ref_delay": float(req.delay),
        "ref_input_length": int(req.input_tokens),
        "ref_users": int(users),
        "ref_session_name": session.name,
    }


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    for column in (*AGENT_COLUMNS, "ref_input_length"):
        dtype = np.float64 if column == "ref_delay" else np.int64
        frame[column] = frame[column].astype(dtype)
    return frame


def _block_ids(reqs: list[AgentRequest], block_size: int) -> list[np.ndarray]:
    """Each request's ids plus its unique tail id, as int32 (dense remap when needed)."""
    flat = np.concatenate(
        [np.asarray(r.ids, dtype=np.int64) for r in reqs] or [np.zeros(0, dtype=np.int64)]
    )
    lengths = np.fromiter((len(r.ids) for r in reqs), dtype=np.int64, count=len(reqs))
    if flat.size and (flat.min() < 0 or flat.max() > _INT32_MAX - len(reqs)):
        _, flat = np.unique(flat, return_inverse=True)  # order-free dense ids: equality kept
    flat = flat.astype(np.int64)
    next_id = int(flat.max()) + 1 if flat.size else 0
    out, start = [], 0
    for i, req in enumerate(reqs):
        ids = flat[start : start + lengths[i]]
        start += int(lengths[i])
        if req.input_tokens > len(ids) * block_size:
            ids = np.append(ids, next_id + i)
        out.append(ids.astype(TOKEN_DTYPE))
    return out


# --------------------------------------------------------------------------- the graph


@dataclass(frozen=True)
class Graph:
    """A trace's sessions as rows in turn order, and each marker's sub-agents."""

    rows: dict[int, list[int]]  # session -> its rows, in turn order
    children: dict[tuple[int, int], list[int]]  # (parent, spawn turn) -> sub-agent sessions
    roots: list[int]  # root sessions in session_id order


def graph(trace: Trace) -> Graph:
    sessions = np.asarray(trace.column("session_id"))
    order = np.lexsort((trace.column("turn"), sessions))
    rows: dict[int, list[int]] = {}
    for pos in order.tolist():
        rows.setdefault(int(sessions[pos]), []).append(pos)
    parent = trace.column("ref_parent_session")
    spawn = trace.column("ref_spawn_turn")
    children: dict[tuple[int, int], list[int]] = {}
    roots = []
    for sid, session_rows in rows.items():
        first = session_rows[0]
        if parent[first] < 0:
            roots.append(sid)
        else:
            children.setdefault((int(parent[first]), int(spawn[first])), []).append(sid)
    return Graph(rows, children, sorted(roots))


def schedule(trace: Trace, root_starts: np.ndarray) -> Trace:
    """A copy with arrivals from the graph with no service time (the replay order): root ``i``
    (in session_id order) starts at ``root_starts[i]``, or, with ``ref_users`` > 0, when a user
    is free (users take the conversations in order, each starting at 0); every request leaves
    at its anchor + delay, never before it is ready, and a parent resumes strictly after its
    last sub-agent's last request."""
    g = graph(trace)
    walk = _Walk(g, trace.column("ref_anchor"), trace.column("ref_delay"), len(trace))
    users = int(trace.column("ref_users")[g.rows[g.roots[0]][0]])
    if users > 0:
        free = [0.0] * users
        for root in g.roots:
            user = int(np.argmin(free))
            free[user] = walk.session(root, free[user])
    else:
        for root, start in zip(g.roots, np.asarray(root_starts).tolist(), strict=True):
            walk.session(root, start)
    return trace.with_arrivals(walk.times)


class _Walk:
    """The schedule's walk: sessions depth-first, times by anchor and delay."""

    def __init__(self, g: Graph, anchors: np.ndarray, delays: np.ndarray, n: int) -> None:
        self.g, self.anchors, self.delays = g, anchors, delays
        self.times = np.full(n, math.nan)

    def session(self, sid: int, start: float) -> float:
        """Time the requests of ``sid`` starting at ``start``; returns its end."""
        ready = sent = start
        rows = self.g.rows[sid]
        for turn, row in enumerate(rows):
            ready = self._spawn(sid, turn, ready)
            base = (ready, start, sent)[int(self.anchors[row])]
            sent = ready = max(ready, base + float(self.delays[row]))
            self.times[row] = sent
        return self._spawn(sid, len(rows), ready)

    def _spawn(self, sid: int, turn: int, ready: float) -> float:
        kids = self.g.children.get((sid, turn))
        if not kids:
            return ready
        end = max(self.session(kid, ready) for kid in kids)
        return float(np.nextafter(end, math.inf))


def within_session_reuse(trace: Trace) -> tuple[int, int]:
    """``(reused, total)`` input tokens: per request, the longest prefix of its ids shared with
    an earlier request of its own session (in turn order; a radix tree per session), in tokens,
    capped at its input tokens - 1; ``total`` sums the input tokens. What an infinite cache hits
    when no id is shared across sessions."""
    from traces.radix import RadixTree

    inputs, tokens = trace.column("input_ids"), trace.column("ref_input_length")
    reused = 0
    for rows in graph(trace).rows.values():
        tree = RadixTree()
        for row in rows:
            hit = tree.match(inputs[row]) * trace.block_size
            reused += min(hit, int(tokens[row]) - 1)
            tree.insert(inputs[row])
    return reused, int(np.sum(tokens))


#: ``arrivals.mode`` values an agentic trace takes (they start its root sessions)
AGENT_MODES = ("poisson", "uniform", "timestamps")


def assign_agent_arrivals(
    trace: Trace, *, mode: str, session_rate: float, seed: int, time_scale: float = 1.0
) -> Trace:
    """:func:`schedule` with root sessions starting by ``mode``: ``poisson`` (rate
    ``session_rate``, the first at 0, draws from ``default_rng(seed)``), ``uniform`` (root ``i``
    at ``i / session_rate``) or ``timestamps`` (each root's first ``ref_timestamp``, rebased to
    0, times ``time_scale``). Ignored with ``ref_users`` > 0 (a closed loop)."""
    g = graph(trace)
    n = len(g.roots)
    if mode == "poisson":
        gaps = np.random.default_rng(seed).exponential(1.0 / session_rate, n)
        gaps[0] = 0.0
        starts = np.cumsum(gaps)
    elif mode == "uniform":
        starts = np.arange(n) / session_rate
    elif mode == "timestamps" and "ref_timestamp" in trace.columns:
        stamps = np.asarray(trace.column("ref_timestamp"), dtype=np.float64)
        firsts = stamps[[g.rows[r][0] for r in g.roots]]
        starts = (firsts - firsts.min()) * time_scale
    else:
        raise ValueError(
            f"an agentic trace starts its sessions by {'|'.join(AGENT_MODES)} "
            f"(timestamps: when its requests have t), not {mode!r}"
        )
    return schedule(trace, starts)
