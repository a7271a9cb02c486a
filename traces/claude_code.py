"""Claude Code agentic coding sessions (the kv-cache-tester format) as an agentic trace.

Format (``claude_code/trace_replay_tester.md`` in the data directory, GitHub
``callanjfox/kv-cache-tester``): one JSON document per conversation, ``.json`` or ``.json.gz``,
``{id, block_size: 64, system_tokens, tool_tokens, requests: [...]}``; a request is ``{t (s from
the session's start), type: n|s, in, out, hash_ids, think_time?, api_time?, ...}``, a sub-agent
``{type: subagent, t (when it finished, on the parent's clock), duration_ms?, subagent_type?,
system_tokens?, tool_tokens?, requests: [...]}`` nesting its own requests. Consecutive
sub-agent entries are siblings: started together, waited for together.

Blocks. ``hash_ids`` hold one id per whole 64-token block (``floor(in / 64)`` of them; checked);
the tokens past the last whole block get one id unique to the request, never hit
(:mod:`traces.agents`). The file's ids are scoped to the file; here every session (a sub-agent
too) gets its own id space, except the shared prefix:

``shared_prefix`` (default ``system+tools``): a session's first ``floor(L / 64)`` blocks, ``L =
system_tokens + tool_tokens`` (``system``: ``system_tokens``; ``none``: nothing), get ids common
to every session of its kind (the main agent, or one sub-agent type), position by position:
Claude Code sends its system prompt and tool definitions first in every call of every session,
so in real serving they are one cached prefix; the local ids hide that. Prompts of different
lengths are taken to agree on their common length (an upper bound on what they share).

Timing (``timing``; the replay strategies of kv-cache-tester; the timed engine applies them,
:mod:`simlab.engines.timed.agents`):

* ``think``: a request leaves ``think_time`` after its session's previous answer completes (the
  client's own time: tool runs, the user);
* ``original``: at its recorded ``t`` after its session started (never before it is ready);
* ``scaled``: ``api_time x api_time_scale + think_time`` after the previous request was sent
  (a server ``1 / api_time_scale`` times as fast as the recorded one; never before ready).

A sub-agent starts at its recorded start (``t - duration``) after the parent's previous answer;
the parent's next request leaves its recorded gap after the last sibling finished (its
``think_time`` spans the sub-agents' run, which the simulation replays). Missing ``think_time``
or ``api_time``: the gap of the recorded ``t`` (as kv-cache-tester falls back).

Errors name the file, the session and the request (``requests[54].requests[3]``); ``lenient``
skips a bad request, or a bad file, and logs how many.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from traces.agents import READY, SENT, START, AgentRequest, AgentSession, agent_trace
from traces.cache import cached_trace
from traces.format import Trace
from traces.jsonl import RecordError, get_int, get_list, get_number
from traces.paths import TraceFileError
from traces.sources import resolve_source

log = logging.getLogger(__name__)

TRACE_NAME = "claude_code"
LOADER_VERSION = "claude-code-v1"
DEFAULT_DIR = Path("claude_code") / "traces"
SHARED_PREFIXES = ("system+tools", "system", "none")
TIMINGS = ("think", "original", "scaled")
SUFFIXES = (".json", ".json.gz")
HOW_TO_GET = (
    "Get the traces from GitHub callanjfox/kv-cache-tester (folder traces/) and place them under "
    "<data_dir>/claude_code/traces/, or point trace.path= at a .json/.json.gz file or a folder."
)
#: shared-prefix ids live below this; sessions' own ids above it
_SESSION_BASE = 1 << 24
_MAX_SHARED = 4096  # blocks of one kind's shared prefix (262k tokens)


@dataclass(frozen=True)
class Options:
    shared_prefix: str = "system+tools"
    timing: str = "think"
    api_time_scale: float = 1.0
    lenient: bool = False


@dataclass
class _Call:
    t: float
    think: float | None
    api: float | None
    request: AgentRequest


@dataclass
class _Marker:
    end: float  # ``t``: when the sub-agent finished
    start: float  # ``t - duration``
    session: int  # index in the conversation's session list


# --------------------------------------------------------------------------- files


def trace_files(path: Path) -> list[Path]:
    """A file, or the ``.json``/``.json.gz`` files of a folder in name order."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.name.endswith(SUFFIXES))
    if not files:
        raise TraceFileError(f"{path}: no .json or .json.gz files")
    return files


def read_document(path: Path) -> dict[str, Any]:
    """One file's JSON object; :class:`TraceFileError` naming the file for a truncated or
    corrupt gzip, bytes that are not UTF-8 JSON, or a top level that is not an object."""
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceFileError(f"{path}: not a complete gzip file ({exc}): truncated?") from exc
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text)
    except UnicodeDecodeError as exc:
        raise TraceFileError(f"{path}: not UTF-8 JSON text (a binary file?)") from exc
    except json.JSONDecodeError as exc:
        cut = " (truncated?)" if exc.pos >= len(text.rstrip()) else ""
        raise TraceFileError(
            f"{path}: line {exc.lineno} column {exc.colno}: invalid JSON ({exc.msg}){cut}"
        ) from exc
    if not isinstance(doc, dict):
        raise TraceFileError(f"{path}: top level is {type(doc).__name__}, expected an object")
    return doc


# --------------------------------------------------------------------------- one conversation


class _Conversation:
    """Parse one document into sessions (root first, sub-agents depth-first)."""

    def __init__(
        self, path: Path, doc: dict[str, Any], opts: Options, kinds: dict[str, int], offset: int = 0
    ):
        self.path, self.opts, self.kinds, self.offset = path, opts, kinds, offset
        self.name = str(doc.get("id", path.name.split(".")[0]))
        self.block_size = self._int(doc, "block_size", self.name, minimum=1)
        self.sessions: list[AgentSession] = []
        self.skipped = 0
        self.first_fault: str | None = None
        self._session(doc, self.name, -1, -1, 0, "main", 0.0)

    def _int(self, record: dict[str, Any], key: str, where: str, minimum: int = 0) -> int:
        try:
            return get_int(record, key, minimum=minimum)
        except RecordError as exc:
            raise TraceFileError(f"{self.path}: session {where}: {exc}") from None

    def _session(self, doc, name, parent, spawn, depth, kind, lead) -> None:
        index = len(self.sessions)
        session = AgentSession(name, parent=parent, spawn_turn=spawn, depth=depth)
        self.sessions.append(session)
        shared = self._shared_blocks(doc, name)
        entries = self._entries(doc, name)
        calls: list[_Call] = []
        markers: dict[int, list[_Marker]] = {}
        for i, entry in enumerate(entries):
            where = f"{name}: requests[{i}]"
            if isinstance(entry, dict) and entry.get("type") == "subagent":
                markers.setdefault(len(calls), []).append(
                    self._subagent(entry, where, index, len(calls), depth, calls)
                )
                continue
            call = self._call(entry, where, index, kind, shared)
            if call is not None:
                calls.append(call)
        session.requests = [c.request for c in calls]
        _time_session(calls, markers, self.opts, lead)

    def _entries(self, doc: dict[str, Any], name: str) -> list[Any]:
        try:
            return get_list(doc, "requests")
        except RecordError as exc:
            raise TraceFileError(f"{self.path}: session {name}: {exc}") from None

    def _shared_blocks(self, doc: dict[str, Any], name: str) -> int:
        how = self.opts.shared_prefix
        if how == "none":
            return 0
        tokens = self._int(doc, "system_tokens", name)
        if how == "system+tools":
            tokens += self._int(doc, "tool_tokens", name)
        return min(tokens // self.block_size, _MAX_SHARED)

    def _subagent(self, entry, where, parent, spawn, depth, calls) -> _Marker:
        try:
            end = get_number(entry, "t", minimum=0)
            duration = get_number(entry, "duration_ms", minimum=0) if "duration_ms" in entry else 0
        except RecordError as exc:
            raise TraceFileError(f"{self.path}: session {where}: {exc}") from None
        start = end - duration / 1000.0
        before = calls[-1] if calls else None
        ready = 0.0 if before is None else before.t + (before.api or 0.0)
        name = f"{self.name}/{entry.get('agent_id', len(self.sessions))}"
        kind = f"subagent:{entry.get('subagent_type', '')}"
        marker = _Marker(end, start, len(self.sessions))
        self._session(entry, name, parent, spawn, depth + 1, kind, max(start - ready, 0.0))
        return marker

    def _call(self, entry, where, session, kind, shared) -> _Call | None:
        try:
            call = _parse_call(entry, self.block_size)
        except RecordError as exc:
            fault = f"{self.path}: session {where}: {exc}"
            if not self.opts.lenient:
                raise TraceFileError(fault) from None
            self.skipped += 1
            self.first_fault = self.first_fault or fault
            return None
        ids = call.request.ids + _SESSION_BASE + (self.offset + session) * (1 << 17)
        n = min(shared, len(ids))
        ids[:n] = self.kinds.setdefault(kind, len(self.kinds)) * _MAX_SHARED + np.arange(n)
        call.request.ids = ids
        return call


def _parse_call(entry: Any, block_size: int) -> _Call:
    if not isinstance(entry, dict):
        raise RecordError(f"is a JSON {type(entry).__name__}, expected an object")
    t = get_number(entry, "t", minimum=0)
    tokens = get_int(entry, "in", minimum=1)
    out = get_int(entry, "out", minimum=0)
    ids = _hash_ids(get_list(entry, "hash_ids"))
    if len(ids) != tokens // block_size:
        raise RecordError(
            f"hash_ids has {len(ids)} blocks but in={tokens} needs floor({tokens}/{block_size})"
        )
    think = (
        get_number(entry, "think_time", minimum=0) if entry.get("think_time") is not None else None
    )
    api = get_number(entry, "api_time", minimum=0) if entry.get("api_time") is not None else None
    request = AgentRequest(ids, tokens, out)
    return _Call(t, think, api, request)


def _hash_ids(values: list[Any]) -> np.ndarray:
    """The ids as int64; :class:`RecordError` unless all are integers in [0, 2^17)."""
    ids = np.asarray(values) if values else np.zeros(0, dtype=np.int64)
    if ids.dtype.kind not in "iu" or (ids.size and (ids.min() < 0 or ids.max() >= 1 << 17)):
        raise RecordError("hash_ids: not all integers in [0, 131072)")
    return ids.astype(np.int64, copy=False)


def _time_session(
    calls: list[_Call], markers: dict[int, list[_Marker]], opts: Options, lead: float
) -> None:
    """Set each request's anchor and delay by ``opts.timing`` (module docstring)."""
    for k, call in enumerate(calls):
        req = call.request
        resumed = markers.get(k, [])
        if k == 0 or resumed:
            gap = lead if k == 0 else max(call.t - max(m.end for m in resumed), 0.0)
        else:
            gap = _ready_gap(calls[k - 1], call)
        if opts.timing == "original":
            req.anchor, req.delay = START, lead + call.t - calls[0].t
        elif opts.timing == "scaled" and k and not resumed:
            req.anchor, req.delay = SENT, _scaled_gap(calls[k - 1], call, opts.api_time_scale)
        else:
            req.anchor, req.delay = READY, gap


def _ready_gap(prev: _Call, call: _Call) -> float:
    if call.think is not None:
        return call.think
    return max(call.t - prev.t - (prev.api or 0.0), 0.0)


def _scaled_gap(prev: _Call, call: _Call, scale: float) -> float:
    if prev.api is None or call.think is None:
        return max(call.t - prev.t, 0.0)
    return prev.api * scale + call.think


# --------------------------------------------------------------------------- the loader


def build_claude_code(files: list[Path], opts: Options, limit: int | None, users: int) -> Trace:
    """Parse (no cache) ``files`` in order into one agentic trace."""
    kinds: dict[str, int] = {}
    sessions: list[AgentSession] = []
    block_sizes: set[int] = set()
    skipped_files, skipped, first_fault = 0, 0, None
    for path in files:
        try:
            conv = _Conversation(path, read_document(path), opts, kinds, len(sessions))
        except TraceFileError as exc:
            if not opts.lenient:
                raise
            skipped_files += 1
            first_fault = first_fault or str(exc)
            continue
        skipped += conv.skipped
        first_fault = first_fault or conv.first_fault
        block_sizes.add(conv.block_size)
        _append(sessions, conv.sessions)
        if limit is not None and sum(len(s.requests) for s in sessions) >= limit:
            break
    if skipped_files or skipped:
        log.warning(
            "claude_code: skipped %d file(s) and %d request(s) (lenient); first: %s",
            skipped_files,
            skipped,
            first_fault,
        )
    if len(block_sizes) > 1:
        raise TraceFileError(f"claude_code: files with different block sizes {sorted(block_sizes)}")
    block = block_sizes.pop() if block_sizes else 64
    return agent_trace(TRACE_NAME, sessions, block, users)


def _append(sessions: list[AgentSession], new: list[AgentSession]) -> None:
    """Add one conversation's sessions, their parent indices shifted to the whole list's."""
    offset = len(sessions)
    for s in new:
        if s.parent >= 0:
            s.parent += offset
        sessions.append(s)


def _fingerprint(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for f in files:
        stat = f.stat()
        digest.update(f"{f.resolve()}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _select(files: list[Path], sessions: Any) -> list[Path]:
    if sessions is None:
        return files
    if isinstance(sessions, int) and not isinstance(sessions, bool):
        if sessions < 1:
            raise ValueError(f"trace.sessions: must be >= 1 or a list of ids, got {sessions}")
        return files[:sessions]
    wanted = {str(s) for s in sessions}
    chosen = [f for f in files if f.name.split(".")[0] in wanted]
    missing = wanted - {f.name.split(".")[0] for f in chosen}
    if missing:
        raise ValueError(f"trace.sessions: no file for {sorted(missing)[:3]}")
    return chosen


def check_options(opts: Options, limit: int | None, users: int | None) -> None:
    if opts.shared_prefix not in SHARED_PREFIXES:
        raise ValueError(f"trace.shared_prefix: must be one of {'|'.join(SHARED_PREFIXES)}")
    if opts.timing not in TIMINGS:
        raise ValueError(f"trace.timing: must be one of {'|'.join(TIMINGS)}, got {opts.timing!r}")
    if not opts.api_time_scale > 0:
        raise ValueError(f"trace.api_time_scale: must be > 0, got {opts.api_time_scale!r}")
    if limit is not None and int(limit) < 1:
        raise ValueError(f"trace.limit: must be >= 1 or null, got {limit}")
    if users is not None and int(users) < 1:
        raise ValueError(f"trace.users: must be >= 1 or null, got {users}")


def load_claude_code(
    path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    sessions: Any = None,  # an int, a list of ids or None (checked by _select)
    limit: int | None = None,
    shared_prefix: str = "system+tools",
    timing: str = "think",
    api_time_scale: float = 1.0,
    users: int | None = None,
    lenient: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    **_: Any,
) -> Trace:
    """The Claude Code sessions (named ``claude_code``), parsed once and cached as parquet.
    ``sessions``: how many conversations (files, in name order) or their ids; ``limit``: stop
    after the conversation that reaches this many requests; ``users``: a closed loop of this
    many users (null: conversations start by ``arrivals.*``)."""
    opts = Options(shared_prefix, timing, float(api_time_scale), bool(lenient))
    check_options(opts, limit, users)
    source = resolve_source(
        path, data_dir, DEFAULT_DIR, "Claude Code traces", HOW_TO_GET, allow_dir=True
    )
    files = _select(trace_files(source), sessions)
    key = {
        "files": _fingerprint(files),
        "options": [shared_prefix, timing, float(api_time_scale), bool(lenient)],
        "limit": limit,
        "users": users,
        "loader": LOADER_VERSION,
    }
    build = lambda: build_claude_code(files, opts, limit, int(users or 0))  # noqa: E731
    return cached_trace(TRACE_NAME, key, build, cache_dir)
