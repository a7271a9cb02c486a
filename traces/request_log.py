"""simlab's request-log format: one documented trace format for users' own logs.

JSON Lines (``.jsonl``, one request per line, a session's requests in order) or parquet (the
same fields as columns). Fields (``docs/guides/agentic-traces.md`` has the full page):

==============  ========================================================================
field           meaning
==============  ========================================================================
session         required: the session's id (a string or an integer)
input_ids       the prompt's token ids (a list of integers >= 0), or:
hash_ids        the prompt's block ids (equal id = equal prefix up to that block), with
block_size      tokens per block (every hash-id line of a file the same), and optionally
input_len       the true prompt tokens (default ``len(hash_ids) x block_size``; more than the
                whole blocks: the tail is unique, never hit; at least
                ``(len(hash_ids) - 1) x block_size + 1``)
output_len      required: reply tokens (integer >= 0)
t               optional: when the request was sent, in seconds on the log's clock
think           optional: seconds after the session's previous answer completed (a session's
                first request: after the session started)
parent          optional, on a session's first line: the session that starts it as a sub-agent
after           optional with ``parent``: how many of the parent's requests complete before it
                starts (default: the parent's requests on earlier lines); the parent's next
                request waits until it has finished
==============  ========================================================================

Timing (``timing``): ``think`` uses ``think`` (else the gap between ``t`` values after the
previous request was sent); ``original`` uses ``t`` (a request leaves at its session's start
plus its ``t`` minus the session's first ``t``; else ``think``). Root sessions start by
``arrivals.mode`` (``timestamps``: at their first ``t``). Every file is an agentic trace
(:mod:`traces.agents`), so the timed engine replays its sessions closed-loop and its
sub-agents as a dependency graph.

Errors name the file, the line (or parquet row) and the field; ``lenient`` skips bad lines and
counts them (:class:`traces.jsonl.LineRecords`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from traces.agents import READY, SENT, START, AgentRequest, AgentSession, agent_trace
from traces.cache import cached_trace, source_fingerprint
from traces.format import Trace
from traces.jsonl import LineRecords, RecordError, get_int, get_list, get_number, json_object
from traces.paths import TraceFileError
from traces.sources import resolve_source

log = logging.getLogger(__name__)

TRACE_NAME = "request_log"
LOADER_VERSION = "request-log-v1"
TIMINGS = ("think", "original")
HOW_TO_GET = "Write your log in simlab's request-log format (docs: guides/agentic-traces.md)."


@dataclass
class LogLine:
    """One parsed line."""

    session: str
    ids: list[int]
    hashed: bool  # hash_ids (True) or input_ids
    block_size: int
    input_len: int
    output_len: int
    t: float | None
    think: float | None
    parent: str | None
    after: int | None


def parse_record(record: dict[str, Any]) -> LogLine:
    """One record, checked field by field (:class:`RecordError` names the field)."""
    session = record.get("session")
    if isinstance(session, bool) or not isinstance(session, str | int):
        raise RecordError(f"field 'session' is {session!r:.40}, expected a string or integer")
    hashed = "hash_ids" in record
    if hashed == ("input_ids" in record):
        raise RecordError("give exactly one of the fields 'input_ids' and 'hash_ids'")
    ids = _ids(record, "hash_ids" if hashed else "input_ids")
    block = get_int(record, "block_size", minimum=1) if hashed else 1
    input_len = _input_len(record, len(ids), block)
    parent = record.get("parent")
    if parent is not None and (isinstance(parent, bool) or not isinstance(parent, str | int)):
        raise RecordError(f"field 'parent' is {parent!r:.40}, expected a string or integer")
    return LogLine(
        str(session),
        ids,
        hashed,
        block,
        input_len,
        get_int(record, "output_len", minimum=0),
        _optional_number(record, "t"),
        _optional_number(record, "think"),
        None if parent is None else str(parent),
        get_int(record, "after", minimum=0) if record.get("after") is not None else None,
    )


def _ids(record: dict[str, Any], key: str) -> list[int]:
    ids = get_list(record, key)
    if not ids:
        raise RecordError(f"field {key!r} is empty")
    for i, value in enumerate(ids):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RecordError(f"{key}[{i}] is {value!r:.30}, expected an integer >= 0")
    return ids


def _input_len(record: dict[str, Any], n: int, block: int) -> int:
    if record.get("input_len") is None:
        return n * block
    tokens = get_int(record, "input_len", minimum=1)
    if tokens <= (n - 1) * block or (block == 1 and tokens != n):
        raise RecordError(
            f"field 'input_len' is {tokens}: {n} ids of {block} tokens cannot hold it"
        )
    return tokens


def _optional_number(record: dict[str, Any], key: str) -> float | None:
    return None if record.get(key) is None else get_number(record, key, minimum=0)


# --------------------------------------------------------------------------- reading


def read_lines(path: Path, lenient: bool) -> Iterator[tuple[str, LogLine]]:
    """``(where, line)`` of a ``.jsonl`` file (``where`` = ``file:line``) or a parquet file's
    rows (``file: row N``)."""
    if path.suffix == ".parquet":
        yield from _parquet_rows(path, lenient)
        return
    records = LineRecords(path, lambda text: parse_record(json_object(text)), lenient=lenient)
    for number, line in records:
        yield f"{path}:{number}", line
    records.log_summary()


def _parquet_rows(path: Path, lenient: bool) -> Iterator[tuple[str, LogLine]]:
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(path).read().to_pylist()
    except Exception as exc:
        raise TraceFileError(f"{path}: not a readable parquet file ({exc})") from exc
    skipped, first = 0, None
    for i, row in enumerate(rows):
        record = {k: v for k, v in row.items() if v is not None}
        try:
            yield f"{path}: row {i}", parse_record(record)
        except RecordError as exc:
            if not lenient:
                raise TraceFileError(f"{path}: row {i}: {exc}") from None
            skipped, first = skipped + 1, first or f"row {i}: {exc}"
    if skipped:
        log.warning("%s: skipped %d malformed row(s) (lenient); first: %s", path, skipped, first)


class _Sessions:
    """Lines grouped into sessions (first appearance order), parents checked."""

    def __init__(self, timing: str) -> None:
        self.timing = timing
        self.index: dict[str, int] = {}
        self.sessions: list[AgentSession] = []
        self.lines: list[list[LogLine]] = []
        self.block: tuple[bool, int] | None = None
        self.starts: list[float] = []

    def add(self, where: str, line: LogLine) -> None:
        kind = (line.hashed, line.block_size)
        if self.block is not None and kind != self.block:
            raise TraceFileError(f"{where}: {_kind(kind)} after {_kind(self.block)} lines")
        self.block = kind
        sid = self.index.get(line.session)
        if sid is None:
            sid = self._new(where, line)
        elif line.parent is not None:
            raise TraceFileError(f"{where}: field 'parent' on a later line of {line.session!r}")
        self.lines[sid].append(line)

    def _new(self, where: str, line: LogLine) -> int:
        sid = self.index[line.session] = len(self.sessions)
        session = AgentSession(line.session)
        if line.parent is not None:
            parent = self.index.get(line.parent)
            if parent is None or parent == sid:
                raise TraceFileError(f"{where}: parent {line.parent!r} has no earlier line")
            done = len(self.lines[parent])
            session.parent, session.depth = parent, self.sessions[parent].depth + 1
            session.spawn_turn = done if line.after is None else line.after
        self.sessions.append(session)
        self.lines.append([])
        return sid

    def finish(self) -> list[AgentSession]:
        for session, lines in zip(self.sessions, self.lines, strict=True):
            session.requests = [self._request(lines, k) for k in range(len(lines))]
            t0 = lines[0].t
            self.starts.append(np.nan if t0 is None else t0)
        return self.sessions

    def _request(self, lines: list[LogLine], k: int) -> AgentRequest:
        line = lines[k]
        req = AgentRequest(np.asarray(line.ids, dtype=np.int64), line.input_len, line.output_len)
        first_t, prev_t = lines[0].t, lines[k - 1].t
        if self.timing == "original" and line.t is not None and first_t is not None:
            req.anchor, req.delay = START, max(line.t - first_t, 0.0)
        elif line.think is not None or k == 0:
            req.anchor, req.delay = READY, line.think or 0.0
        elif line.t is not None and prev_t is not None:
            req.anchor, req.delay = SENT, max(line.t - prev_t, 0.0)
        return req


def _kind(kind: tuple[bool, int]) -> str:
    return f"hash_ids of {kind[1]} tokens" if kind[0] else "input_ids"


def build_request_log(path: Path, timing: str, lenient: bool, limit: int | None) -> Trace:
    """Parse (no cache) one file."""
    sessions = _Sessions(timing)
    for n, (where, line) in enumerate(read_lines(path, lenient), start=1):
        sessions.add(where, line)
        if limit is not None and n >= limit:
            break
    parsed = sessions.finish()
    for session in parsed:
        if session.parent >= 0 and session.spawn_turn > len(sessions.lines[session.parent]):
            raise TraceFileError(
                f"{path}: session {session.name!r}: after={session.spawn_turn} but its parent "
                f"has {len(sessions.lines[session.parent])} requests"
            )
    assert sessions.block is not None
    trace = agent_trace(TRACE_NAME, parsed, sessions.block[1])
    return _with_timestamps(trace, sessions.starts)


def _with_timestamps(trace: Trace, starts: list[float]) -> Trace:
    """``ref_timestamp``: each session's first ``t`` on all its rows (roots start there with
    ``arrivals.mode=timestamps``); absent when no line has ``t``."""
    values = np.asarray(starts, dtype=np.float64)
    if np.isnan(values).all():
        return trace
    frame = trace.frame
    frame["ref_timestamp"] = values[frame["session_id"].to_numpy()]
    return Trace(trace.name, frame, trace.block_size)


def load_request_log(
    path: str | os.PathLike[str] | None = None,
    timing: str = "think",
    lenient: bool = False,
    limit: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **_: Any,
) -> Trace:
    """A request log (named ``request_log``), parsed once and cached as parquet; ``limit``:
    the first this many lines."""
    if timing not in TIMINGS:
        raise ValueError(f"trace.timing: must be one of {'|'.join(TIMINGS)}, got {timing!r}")
    if path is None or str(path) == "":
        raise ValueError(f"trace.path: the request log to read is required. {HOW_TO_GET}")
    source = resolve_source(path, None, "", "request log", HOW_TO_GET)
    key = {
        "source": source_fingerprint(source),
        "timing": timing,
        "lenient": bool(lenient),
        "limit": limit,
        "loader": LOADER_VERSION,
    }
    build = lambda: build_request_log(source, timing, bool(lenient), limit)  # noqa: E731
    return cached_trace(TRACE_NAME, key, build, cache_dir)
