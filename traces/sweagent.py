"""Classic SWE-agent trajectories (``<instance_id>.traj``) as a tokenized agentic trace.

Format (SWE-agent 0.7 - 1.x, ``docs/usage/trajectories.md``): one JSON object per file with

* ``history``: the messages the agent kept, ``[{role, content, agent?, message_type?, is_demo?,
  thought?, action?, tool_calls?, ...}]``; roles ``system`` / ``user`` / ``assistant`` / ``tool``;
  ``content`` a string or a list of segments ``{"type": "text", "text": ...}`` (text segments are
  joined; other segment types, e.g. images, are dropped); ``is_demo: true`` marks demonstration
  messages (context only, never a request);
* ``trajectory``: one entry per step ``{response, thought, action, observation, state, query?,
  execution_time?}`` (optional here; ``execution_time`` becomes ``ref_execution_time`` when the
  steps line up one-to-one with the history's LLM calls);
* ``info``: ``{exit_status, submission, model_stats, ...}`` (optional; ``exit_status`` becomes
  ``ref_exit_status``).

Requests: one per non-demonstration assistant message, input = the rendered history before it,
output = its content (see :mod:`traces.agent_history`, which also implements the optional
last-5-observations truncation and the ``max_tokens`` / ``max_turns`` caps). One session per file,
in sorted path order; ``ref_instance_id`` is the file name without ``.traj``.

Where: ``path=`` a ``.traj`` file, a folder searched recursively for ``*.traj`` (the layout
``sweagent run-batch`` writes: ``trajectories/<user>/<experiment>/<instance>/<instance>.traj``),
or a ``.tar``/``.tar.gz`` archive of them; default ``<data_dir>/swe_agent/classic/`` (not in the
shared data; see :data:`HOW_TO_GET`). A malformed file raises :class:`TraceFileError` naming the
file, the JSON line/column or the field (``history[3].content``); ``lenient=True`` skips it and
logs the count.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from traces.agent_history import AgentMessage, HistoryOptions, agent_requests, request_positions
from traces.cache import cached_trace, source_fingerprint
from traces.format import Trace, make_frame, request_row
from traces.paths import TraceFileError
from traces.sources import resolve_source
from traces.tokenizer import TEMPLATE_VERSION, TOKENIZER_NAME, ChatRenderer

log = logging.getLogger(__name__)

TRACE_NAME = "sweagent"
LOADER_VERSION = "sweagent-v1"
SUFFIX = ".traj"
DEFAULT_DIR = Path("swe_agent") / "classic"
HOW_TO_GET = (
    "Classic SWE-agent writes trajectories/<user>/<experiment>/<instance>/<instance>.traj; "
    "published runs are in GitHub SWE-bench/experiments (evaluation/<split>/<run>/trajs/). "
    "Point trace.path= at a .traj file, a folder of them or a .tar/.tar.gz archive, or place "
    "them under <data_dir>/swe_agent/classic/."
)
_NAN = float("nan")


class Trajectory(NamedTuple):
    """One parsed ``.traj``: its messages and per-step reference figures."""

    instance_id: str
    messages: list[AgentMessage]
    execution_times: list[float]
    exit_status: str


# --------------------------------------------------------------------------- finding files


def trajectory_sources(path: Path) -> Iterator[tuple[str, str, bytes]]:
    """``(instance_id, where, raw bytes)`` of every ``.traj`` under ``path``, in sorted order."""
    if path.is_dir():
        for file in sorted(path.rglob(f"*{SUFFIX}")):
            yield file.name[: -len(SUFFIX)], str(file), file.read_bytes()
    elif path.name.endswith(SUFFIX):
        yield path.name[: -len(SUFFIX)], str(path), path.read_bytes()
    else:
        yield from _archive_sources(path)


def _open_tar(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, "r:*")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise TraceFileError(
            f"{path}: not a .traj file, a folder or a tar archive ({exc})"
        ) from exc


def _archive_sources(path: Path) -> Iterator[tuple[str, str, bytes]]:
    with _open_tar(path) as archive:
        members = sorted(
            (m for m in archive.getmembers() if m.isfile() and m.name.endswith(SUFFIX)),
            key=lambda m: m.name,
        )
        for info in members:
            handle = archive.extractfile(info)
            raw = handle.read() if handle is not None else b""
            yield Path(info.name).name[: -len(SUFFIX)], f"{path}:{info.name}", raw


def fingerprint(path: Path) -> dict[str, Any]:
    """Cache identity of a file, or of every ``.traj`` in a folder (names, sizes, mtimes)."""
    if not path.is_dir():
        return source_fingerprint(path)
    digest = hashlib.sha256()
    for file in sorted(path.rglob(f"*{SUFFIX}")):
        stat = file.stat()
        digest.update(f"{file.relative_to(path)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return {"path": str(path.resolve()), "files": digest.hexdigest()}


# --------------------------------------------------------------------------- parsing


def parse_traj(raw: bytes, where: str, instance_id: str) -> Trajectory:
    """One ``.traj`` file, checked; :class:`TraceFileError` names ``where`` and the fault."""
    doc = _json_document(raw, where)
    history = doc.get("history")
    if not isinstance(history, list):
        raise TraceFileError(f"{where}: 'history' missing or not a list")
    messages = [_message(item, f"{where}: history[{i}]") for i, item in enumerate(history)]
    if not request_positions(messages):
        raise TraceFileError(f"{where}: no non-demonstration assistant message (no LLM call)")
    return Trajectory(
        instance_id,
        messages,
        _execution_times(doc.get("trajectory"), where),
        _exit_status(doc.get("info"), where),
    )


def _json_document(raw: bytes, where: str) -> dict[str, Any]:
    if not raw.strip():
        raise TraceFileError(f"{where}: empty file")
    try:
        doc = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise TraceFileError(f"{where}: not UTF-8 text ({exc})") from exc
    except json.JSONDecodeError as exc:
        at_end = exc.pos >= len(raw.rstrip()) or exc.msg.startswith("Unterminated string")
        cut = " (file truncated?)" if at_end else ""
        raise TraceFileError(
            f"{where}: line {exc.lineno} column {exc.colno}: invalid JSON ({exc.msg}){cut}"
        ) from exc
    if not isinstance(doc, dict):
        raise TraceFileError(f"{where}: top level is {type(doc).__name__}, expected an object")
    return doc


def _message(item: Any, where: str) -> AgentMessage:
    if not isinstance(item, dict):
        raise TraceFileError(f"{where}: is {type(item).__name__}, expected an object")
    role = item.get("role")
    if not isinstance(role, str):
        raise TraceFileError(f"{where}.role: missing or not a string")
    is_demo = item.get("is_demo", False)
    if not isinstance(is_demo, bool):
        raise TraceFileError(f"{where}.is_demo: {is_demo!r:.30} is not true/false")
    return AgentMessage(role, _content(item.get("content"), f"{where}.content"), is_demo)


def _content(value: Any, where: str) -> str:
    """A string, or the joined text of a list of ``{"type": "text", "text": ...}`` segments."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise TraceFileError(f"{where}: is {type(value).__name__}, expected a string or a list")
    parts = []
    for i, segment in enumerate(value):
        if not isinstance(segment, dict) or not isinstance(segment.get("type"), str):
            raise TraceFileError(f"{where}[{i}]: expected an object with a 'type'")
        if segment["type"] == "text":
            if not isinstance(segment.get("text"), str):
                raise TraceFileError(f"{where}[{i}].text: missing or not a string")
            parts.append(segment["text"])
    return "".join(parts)


def _execution_times(steps: Any, where: str) -> list[float]:
    if steps is None:
        return []
    if not isinstance(steps, list):
        raise TraceFileError(f"{where}: 'trajectory' is not a list")
    times = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise TraceFileError(f"{where}: trajectory[{i}] is not an object")
        value = step.get("execution_time")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise TraceFileError(f"{where}: trajectory[{i}].execution_time is not a number")
        times.append(_NAN if value is None else float(value))
    return times


def _exit_status(info: Any, where: str) -> str:
    if info is None:
        return ""
    if not isinstance(info, dict):
        raise TraceFileError(f"{where}: 'info' is not an object")
    status = info.get("exit_status")
    if status is not None and not isinstance(status, str):
        raise TraceFileError(f"{where}: info.exit_status is not a string")
    return status or ""


def read_trajectories(path: Path, limit: int | None, lenient: bool) -> list[Trajectory]:
    """The first ``limit`` well-formed trajectories under ``path`` (bad ones: see lenient)."""
    out: list[Trajectory] = []
    skipped: list[str] = []
    for instance_id, where, raw in trajectory_sources(path):
        try:
            out.append(parse_traj(raw, where, instance_id))
        except TraceFileError as exc:
            if not lenient:
                raise
            skipped.append(str(exc))
        if limit is not None and len(out) >= limit:
            break
    if skipped:
        log.warning(
            "%s: skipped %d malformed trajectories (lenient), kept %d; first: %s",
            path,
            len(skipped),
            len(out),
            skipped[0],
        )
    if not out:
        reason = f"all {len(skipped)} are malformed" if skipped else "no *.traj found"
        raise TraceFileError(f"{path}: no usable SWE-agent trajectory ({reason})")
    return out


# --------------------------------------------------------------------------- building


def session_rows(
    renderer: ChatRenderer, session_id: int, traj: Trajectory, opts: HistoryOptions
) -> list[dict[str, Any]]:
    """One row per LLM call of ``traj`` after truncation and caps."""
    calls = request_positions(traj.messages)
    aligned = len(traj.execution_times) == len(calls)
    step_of = {pos: k for k, pos in enumerate(calls)}
    rows = []
    for turn, (pos, input_ids, output_ids) in enumerate(
        agent_requests(renderer, traj.messages, opts)
    ):
        rows.append(
            request_row(
                session_id,
                turn,
                input_ids,
                output_ids,
                ref_instance_id=traj.instance_id,
                ref_exit_status=traj.exit_status,
                ref_execution_time=traj.execution_times[step_of[pos]] if aligned else _NAN,
            )
        )
    return rows


def build_sweagent(path: Path, limit: int | None, opts: HistoryOptions, lenient: bool) -> Trace:
    """Parse and tokenize (no cache)."""
    renderer = ChatRenderer()
    rows: list[dict[str, Any]] = []
    sessions = 0
    for traj in read_trajectories(path, limit, lenient):
        session = session_rows(renderer, sessions, traj, opts)
        if session:
            rows.extend(session)
            sessions += 1
    if not rows:
        raise TraceFileError(f"{path}: the caps {opts} leave no request")
    log.info("sweagent: %d sessions, %d requests from %s", sessions, len(rows), path)
    return Trace(name=TRACE_NAME, frame=make_frame(rows))


def load_sweagent(
    path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    truncate_history: bool = False,
    keep_last: int = 5,
    max_tokens: int | None = None,
    max_turns: int | None = None,
    lenient: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    **_: Any,
) -> Trace:
    """Classic SWE-agent trajectories (named ``sweagent``), tokenized once and cached."""
    if limit is not None and int(limit) < 1:
        raise ValueError(f"limit must be >= 1 or null, got {limit}")
    opts = HistoryOptions(
        bool(truncate_history),
        int(keep_last),
        None if max_tokens is None else int(max_tokens),
        None if max_turns is None else int(max_turns),
    )
    source = resolve_source(
        path, data_dir, DEFAULT_DIR, "SWE-agent trajectories (.traj)", HOW_TO_GET, allow_dir=True
    )
    key = {
        "source": fingerprint(source),
        "limit": None if limit is None else int(limit),
        "history": opts.key(),
        "lenient": bool(lenient),
        "tokenizer": TOKENIZER_NAME,
        "template": TEMPLATE_VERSION,
        "loader": LOADER_VERSION,
    }
    build_limit = None if limit is None else int(limit)
    return cached_trace(
        TRACE_NAME, key, lambda: build_sweagent(source, build_limit, opts, bool(lenient)), cache_dir
    )
