"""SWE-bench agent trajectories (mini-swe-agent, Gemini 3 Pro) as a tokenized agentic trace.

Source: ``<data_dir>/swe_agent/mini_swe_agent_gemini3pro_trajs.tar.gz``, read in place (never
extracted). Each member ``trajs/<instance>/<instance>.traj.json`` holds ``messages``: a linear,
untruncated history of ``{role, content, extra?}`` dicts with roles system/user/assistant.

Sessions and requests. One session per instance (``session_id`` in selection order), one request
per assistant message (= one LLM call): input = the rendered history of *every* earlier message,
output = that assistant message's content. The provider's hidden reasoning tokens are not in the
history and hence not in ``output_ids``; ``ref_completion_tokens`` keeps the billed figure.

Reference columns, from the assistant message's ``extra.response`` (the provider's record):

=====================  =======  ==============================================================
ref_instance_id        str      SWE-bench instance id (from the member path)
ref_prompt_tokens      float64  ``usage.prompt_tokens`` (provider tokenizer, not cl100k)
ref_cached_tokens      float64  ``usage.prompt_tokens_details.cached_tokens``
ref_completion_tokens  float64  ``usage.completion_tokens`` (visible reply + hidden reasoning)
ref_timestamp          float64  ``created`` (unix seconds, 1 s resolution)
=====================  =======  ==============================================================

A figure the record lacks (or holds as null) is NaN, never 0: "unknown" is not "no cache hit".
Selection: the first ``limit`` instances in sorted id order, or exactly ``instances`` (in the given
order, ``limit`` not applied). A malformed member raises :class:`TraceFileError` naming the tar
file, the member and the fault (``lenient=True``: the member is skipped, and the count logged, so
the trace has fewer sessions); an unreadable or empty archive raises :class:`TraceFileError`; a
missing tar raises :class:`DataFileMissingError`. ``path=FILE`` reads another archive laid out
the same way.

History options (:mod:`traces.agent_history`, off by default): ``truncate_history`` (SWE-agent's
last-5-observations truncation, as in the Marconi paper: reuse becomes "branch" instead of
"extend"), ``keep_last``, ``max_tokens`` and ``max_turns`` caps per session. With truncation the
provider's ``ref_prompt_tokens``/``ref_cached_tokens`` describe the untruncated calls and no
longer match the rendered inputs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tarfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traces.agent_history import AgentMessage, HistoryOptions, agent_requests
from traces.cache import cached_trace, source_fingerprint
from traces.format import Trace, make_frame, request_row
from traces.paths import TraceFileError, require_file, resolve_data_dir
from traces.progress import Progress
from traces.sources import resolve_source
from traces.tokenizer import TEMPLATE_VERSION, TOKENIZER_NAME, ChatRenderer

log = logging.getLogger(__name__)

TRACE_NAME = "swebench"
#: Bump when the request-construction rules in this module change (part of the cache key).
LOADER_VERSION = "swebench-v1"
TAR_RELATIVE = Path("swe_agent") / "mini_swe_agent_gemini3pro_trajs.tar.gz"
HOW_TO_GET = (
    "Get the mini-swe-agent trajectories from GitHub gruckion/mini-swe-agent, folder "
    "swebench_results/20251118_gemini-3-pro-74pct, and place the archive as "
    f"<data_dir>/{TAR_RELATIVE.as_posix()}."
)
_MEMBER = re.compile(r"^(?:\./)?trajs/([^/]+)/\1\.traj\.json$")
_NAN = float("nan")


def tar_path(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The trajectories archive under the resolved data directory; must exist."""
    path = resolve_data_dir(data_dir) / TAR_RELATIVE
    return require_file(path, "SWE-bench mini-swe-agent trajectories", HOW_TO_GET)


#: what reading a cut-short or corrupt gzip/tar stream raises
ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError)


def trajectory_members(archive: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """Instance id -> member, for every ``trajs/<id>/<id>.traj.json`` regular file; a cut-short
    or corrupt archive is a :class:`TraceFileError` naming the file and the last good member."""
    members: dict[str, tarfile.TarInfo] = {}
    last = "none"
    try:
        for info in archive:
            last = info.name
            match = _MEMBER.match(info.name)
            if match and info.isfile():
                members[match.group(1)] = info
    except ARCHIVE_ERRORS as exc:
        raise TraceFileError(
            f"{archive.name!s}: archive truncated or corrupt after member {last} ({exc})"
        ) from exc
    return members


def select_instances(
    available: Sequence[str], limit: int | None, instances: Sequence[str] | None, where: Path
) -> list[str]:
    """The instance ids to load: ``instances`` verbatim, else the first ``limit`` sorted ids."""
    if instances is not None:
        chosen = [str(i) for i in instances]
        unknown = sorted(set(chosen) - set(available))
        if unknown:
            raise ValueError(f"{where}: no trajectory for instance(s) {unknown[:5]}")
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"instances lists an instance more than once: {chosen}")
        return chosen
    ordered = sorted(available)
    return ordered if limit is None else ordered[: int(limit)]


def open_archive(path: Path) -> tarfile.TarFile:
    """``tarfile.open(path, "r:gz")``; an empty or non-gzip-tar file is a :class:`TraceFileError`."""
    try:
        return tarfile.open(path, "r:gz")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise TraceFileError(f"{path}: not a readable .tar.gz archive ({exc})") from exc


def read_trajectories(
    path: Path, instance_ids: list[str], lenient: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """Validated message lists of ``instance_ids``, read in archive order (one forward pass).

    With ``lenient`` a malformed member is skipped (absent from the result) and counted in a
    warning; otherwise it raises :class:`TraceFileError`.
    """
    skipped: list[str] = []
    with open_archive(path) as archive:
        members = trajectory_members(archive)
        chosen = select_instances(list(members), None, instance_ids, path)
        out = {}
        for info in sorted((members[i] for i in chosen), key=lambda m: m.offset):
            where = f"{path}:{info.name}"
            instance_id = _MEMBER.match(info.name).group(1)  # type: ignore[union-attr]
            try:
                out[instance_id] = _read_member(archive, info, where, instance_id)
            except TraceFileError as exc:
                if not lenient:
                    raise
                skipped.append(str(exc))
    if skipped:
        log.warning(
            "%s: skipped %d malformed trajectories (lenient); first: %s",
            path,
            len(skipped),
            skipped[0],
        )
    return out


def _read_member(
    archive: tarfile.TarFile, info: tarfile.TarInfo, where: str, instance_id: str
) -> list[dict[str, Any]]:
    try:
        handle = archive.extractfile(info)
        raw = handle.read() if handle is not None else None
    except ARCHIVE_ERRORS as exc:
        raise TraceFileError(f"{where}: member cannot be read ({exc})") from exc
    if raw is None:
        raise TraceFileError(f"{where}: member cannot be read")
    return parse_trajectory(raw, where, instance_id)


def parse_trajectory(raw: bytes, where: str, instance_id: str) -> list[dict[str, Any]]:
    """The ``messages`` list of one trajectory file, checked; TraceFileError names ``where``."""
    if not raw.strip():
        raise TraceFileError(f"{where}: empty file")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceFileError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise TraceFileError(f"{where}: top level is {type(doc).__name__}, expected an object")
    if doc.get("instance_id", instance_id) != instance_id:
        raise TraceFileError(f"{where}: instance_id {doc['instance_id']!r} != {instance_id!r}")
    messages = doc.get("messages")
    if not isinstance(messages, list):
        raise TraceFileError(f"{where}: 'messages' missing or not a list")
    for index, message in enumerate(messages):
        _check_message(message, f"{where}: messages[{index}]")
    if not any(m["role"] == "assistant" for m in messages):
        raise TraceFileError(f"{where}: no assistant message (no LLM call to replay)")
    return messages


def _check_message(message: Any, where: str) -> None:
    """Raise TraceFileError unless ``message`` has str role/content and well-typed extras."""
    if not isinstance(message, dict):
        raise TraceFileError(f"{where}: is {type(message).__name__}, expected an object")
    for field in ("role", "content"):
        if not isinstance(message.get(field), str):
            raise TraceFileError(f"{where}: '{field}' missing or not a string")
    extra = message.get("extra") or {}
    if not isinstance(extra, dict):
        raise TraceFileError(f"{where}: 'extra' is not an object")
    response = extra.get("response") or {}
    if not isinstance(response, dict) or not isinstance(response.get("usage") or {}, dict):
        raise TraceFileError(f"{where}: 'extra.response' or its 'usage' is not an object")
    _provider_figures(response, where)


def _response(message: dict[str, Any]) -> dict[str, Any]:
    """The provider record of a validated message (empty when it has none)."""
    return (message.get("extra") or {}).get("response") or {}


def _provider_figures(response: dict[str, Any], where: str) -> dict[str, float]:
    """The ``ref_*`` numbers of one provider record; absent/null -> NaN, wrong type -> error."""
    usage = response.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    if not isinstance(details, dict):
        raise TraceFileError(f"{where}: 'usage.prompt_tokens_details' is not an object")
    values = {
        "ref_prompt_tokens": usage.get("prompt_tokens"),
        "ref_cached_tokens": details.get("cached_tokens"),
        "ref_completion_tokens": usage.get("completion_tokens"),
        "ref_timestamp": response.get("created"),
    }
    return {name: _number(value, name, where) for name, value in values.items()}


def _number(value: Any, name: str, where: str) -> float:
    """A provider figure as float: None -> NaN; bools, strings and other types are errors."""
    if value is None:
        return _NAN
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise TraceFileError(f"{where}: {name} source value {value!r} is not a number")
    return float(value)


def session_rows(
    renderer: ChatRenderer,
    session_id: int,
    instance_id: str,
    messages: list[dict[str, Any]],
    opts: HistoryOptions | None = None,
) -> list[dict[str, Any]]:
    """One row per assistant message of a trajectory (already validated), after ``opts``."""
    history = [AgentMessage(m["role"], m["content"]) for m in messages]
    rows = []
    for turn, (pos, input_ids, output_ids) in enumerate(
        agent_requests(renderer, history, opts or HistoryOptions())
    ):
        rows.append(
            request_row(
                session_id,
                turn,
                input_ids,
                output_ids,
                ref_instance_id=instance_id,
                **_provider_figures(_response(messages[pos]), instance_id),
            )
        )
    return rows


def build_swebench(
    path: Path,
    limit: int | None,
    instances: Sequence[str] | None,
    opts: HistoryOptions | None = None,
    lenient: bool = False,
) -> Trace:
    """Tokenize the selected trajectories of the archive at ``path`` (no cache)."""
    with open_archive(path) as archive:
        instance_ids = select_instances(list(trajectory_members(archive)), limit, instances, path)
    if not instance_ids:
        raise TraceFileError(f"{path}: no trajectories selected")
    trajectories = read_trajectories(path, instance_ids, lenient)
    kept = [i for i in instance_ids if i in trajectories]
    if not kept:
        raise TraceFileError(f"{path}: every selected trajectory is malformed")
    renderer = ChatRenderer()
    rows: list[dict[str, Any]] = []
    with Progress(len(kept), "swebench: tokenizing sessions", check_every=1) as progress:
        for session_id, instance_id in enumerate(kept):
            messages = trajectories.pop(instance_id)
            rows.extend(session_rows(renderer, session_id, instance_id, messages, opts))
            progress.update()
    log.info(
        "swebench: %d sessions, %d requests, %d unique messages tokenized",
        len(kept),
        len(rows),
        renderer.unique_messages,
    )
    return Trace(name=TRACE_NAME, frame=make_frame(rows))


def load_swebench(
    data_dir: str | os.PathLike[str] | None = None,
    limit: int | None = 100,
    instances: Sequence[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    path: str | os.PathLike[str] | None = None,
    truncate_history: bool = False,
    keep_last: int = 5,
    max_tokens: int | None = None,
    max_turns: int | None = None,
    lenient: bool = False,
    **_: Any,
) -> Trace:
    """The SWE-bench agent trace (named ``swebench``), tokenized once and cached as parquet.

    The cache key holds the archive's identity and the selection settings (not the resolved
    ids), so a cache hit does not scan the archive. History options and ``lenient`` enter the
    key only when set, so entries built before they existed stay valid.
    """
    if instances is None and limit is not None and int(limit) < 1:
        raise ValueError(f"limit must be >= 1 or null, got {limit}")
    chosen = None if instances is None else [str(i) for i in instances]
    opts = HistoryOptions(
        bool(truncate_history),
        int(keep_last),
        None if max_tokens is None else int(max_tokens),
        None if max_turns is None else int(max_turns),
    )
    archive = resolve_source(
        path, data_dir, TAR_RELATIVE, "SWE-bench mini-swe-agent trajectories", HOW_TO_GET
    )
    key: dict[str, Any] = {
        "source": source_fingerprint(archive),
        "limit": None if limit is None or chosen is not None else int(limit),
        "instances": chosen,
        "tokenizer": TOKENIZER_NAME,
        "template": TEMPLATE_VERSION,
        "loader": LOADER_VERSION,
    }
    if not opts.is_default:
        key["history"] = opts.key()
    if lenient:
        key["lenient"] = True
    return cached_trace(
        TRACE_NAME,
        key,
        lambda: build_swebench(archive, limit, chosen, opts, bool(lenient)),
        cache_dir,
    )
