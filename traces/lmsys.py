"""LMSYS-Chat-1M conversations (the dataset's own JSON Lines schema) as a tokenized trace.

Input: one JSON object per line, ``{conversation_id, model, turn, language, conversation:
[{role, content}, ...]}``; only ``conversation`` is required (``conversation_id``, ``model``,
``language`` must be strings and ``turn`` an integer when present). Default file:
``<data_dir>/lmsys/lmsys_1000.jsonl`` (191 real conversations, English, 3-20 turns); the full
dataset is gated, see :data:`HOW_TO_GET`; ``path=FILE`` reads any file in this schema.

Sessions and requests (same rules as :mod:`traces.sharegpt`): one session per selected
conversation in file order; one request per assistant message that directly follows a user
message, input = the chat-template rendering of every earlier message, output = that reply.
So ``input_k + output_k`` is a prefix of ``input_{k+1}``.

Selection (default = the Marconi paper's LMSys setup, as we read it):

* ``min_turns`` (10): at least this many requests (user turns with a reply);
* ``max_non_ascii`` (0.5): conversations whose text is *mostly* non-ASCII (fraction of
  characters with code point > 127 above this) are excluded; ``1.0`` keeps everything;
* ``max_tokens`` (32768): a session stops before its first request whose input + output exceeds
  the cap (the history no longer fits a 32K context); a conversation left with no request is
  not selected; ``null`` = no cap;
* ``limit`` (100): the first ``limit`` conversations passing all of the above, in file order.

On the shared 191-conversation sample the default selects 15 conversations (all those with >= 10
turns; none is mostly non-ASCII and none is cut by the 32K cap).

Reference columns: ``ref_conversation_id``, ``ref_model``, ``ref_language`` (the record's fields)
and ``ref_user_words`` (int64): :func:`traces.sharegpt.user_words` of the user message the
request ends with, which ``arrivals.gaps=typing`` turns into the user's typing time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from traces.cache import cached_trace, source_fingerprint
from traces.format import Trace, make_frame, request_row
from traces.jsonl import LineRecords, RecordError, get_int, get_list, get_str, json_object
from traces.paths import TraceFileError
from traces.sharegpt import capped_session, request_positions, user_words
from traces.sources import resolve_source
from traces.tokenizer import TEMPLATE_VERSION, TOKENIZER_NAME, ChatRenderer

log = logging.getLogger(__name__)

TRACE_NAME = "lmsys"
#: Bump when the request-construction or selection rules change (part of the cache key).
#: v2: the ref_user_words column.
LOADER_VERSION = "lmsys-v3"
DEFAULT_FILE = Path("lmsys") / "lmsys_1000.jsonl"
HOW_TO_GET = (
    "LMSYS-Chat-1M is gated: on Hugging Face open lmsys/lmsys-chat-1m, accept its license, then "
    "export it as JSON Lines, e.g. datasets.load_dataset('lmsys/lmsys-chat-1m', split='train')"
    ".to_json('lmsys-chat-1m.jsonl'); place the file at <data_dir>/lmsys/ and set "
    "trace.file=lmsys/lmsys-chat-1m.jsonl, or point trace.path=FILE at it. A 191-conversation "
    "sample is GitHub chenwenxiaolive/lmsys-chat-1000 (lmsys_1000.jsonl)."
)


class Conversation(NamedTuple):
    """One parsed LMSYS record: ids and ``(role, content)`` messages."""

    conversation_id: str
    model: str
    language: str
    messages: list[tuple[str, str]]


def parse_record(line: str) -> Conversation:
    """A JSON line in the LMSYS schema; :class:`RecordError` names the bad field."""
    record = json_object(line)
    conversation = get_list(record, "conversation")
    if not conversation:
        raise RecordError("field 'conversation' is an empty list")
    messages = [_message(item, index) for index, item in enumerate(conversation)]
    if "turn" in record:
        get_int(record, "turn", minimum=0)
    return Conversation(
        conversation_id=get_str(record, "conversation_id", optional=True) or "",
        model=get_str(record, "model", optional=True) or "",
        language=get_str(record, "language", optional=True) or "",
        messages=messages,
    )


def _message(item: Any, index: int) -> tuple[str, str]:
    if not isinstance(item, dict):
        raise RecordError(f"conversation[{index}] is {type(item).__name__}, expected an object")
    try:
        role = get_str(item, "role")
        content = get_str(item, "content")
    except RecordError as exc:
        raise RecordError(f"conversation[{index}]: {exc}") from exc
    assert role is not None and content is not None
    return role, content


def non_ascii_fraction(messages: list[tuple[str, str]]) -> float:
    """Fraction of the conversation's characters (all contents) with a code point > 127."""
    total = sum(len(content) for _, content in messages)
    if total == 0:
        return 0.0
    wide = sum(1 for _, content in messages for ch in content if ord(ch) > 127)
    return wide / total


class Selection(NamedTuple):
    min_turns: int
    max_non_ascii: float
    max_tokens: int | None
    limit: int | None


def selected_sessions(
    records: LineRecords[Conversation], renderer: ChatRenderer, sel: Selection
) -> Iterator[tuple[Conversation, list[int], list[tuple[Any, Any]]]]:
    """The first ``sel.limit`` conversations passing the selection, with their request
    positions and capped requests (``requests[j]`` is at ``positions[j]``)."""
    taken = 0
    for _, conv in records:
        positions = request_positions(conv.messages)
        if len(positions) < sel.min_turns:
            continue
        if non_ascii_fraction(conv.messages) > sel.max_non_ascii:
            continue
        requests = capped_session(renderer, conv.messages, positions, sel.max_tokens)
        if not requests:
            continue
        yield conv, positions, requests
        taken += 1
        if sel.limit is not None and taken >= sel.limit:
            return


def build_lmsys(path: Path, sel: Selection, lenient: bool) -> Trace:
    """Parse, select and tokenize (no cache)."""
    records = LineRecords(path, parse_record, lenient=lenient)
    renderer = ChatRenderer()
    rows: list[dict[str, Any]] = []
    sessions = 0
    selected = selected_sessions(records, renderer, sel)
    for session_id, (conv, positions, requests) in enumerate(selected):
        sessions += 1
        for turn, (input_ids, output_ids) in enumerate(requests):
            rows.append(
                request_row(
                    session_id,
                    turn,
                    input_ids,
                    output_ids,
                    ref_conversation_id=conv.conversation_id,
                    ref_model=conv.model,
                    ref_language=conv.language,
                    ref_user_words=user_words(conv.messages[positions[turn] - 1][1]),
                )
            )
    records.log_summary()
    if not rows:
        raise TraceFileError(
            f"{path}: no conversation passes the selection {sel._asdict()} "
            "(lower trace.min_turns or raise trace.max_tokens)"
        )
    log.info("lmsys: %d sessions, %d requests from %s", sessions, len(rows), path)
    frame = make_frame(rows)
    frame["ref_user_words"] = frame["ref_user_words"].astype("int64")
    return Trace(name=TRACE_NAME, frame=frame)


def _check(sel: Selection) -> None:
    if sel.min_turns < 1:
        raise ValueError(f"min_turns must be >= 1, got {sel.min_turns}")
    if not 0.0 <= sel.max_non_ascii <= 1.0:
        raise ValueError(f"max_non_ascii must be in [0, 1], got {sel.max_non_ascii}")
    if sel.max_tokens is not None and sel.max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2 or null, got {sel.max_tokens}")
    if sel.limit is not None and sel.limit < 1:
        raise ValueError(f"limit must be >= 1 or null, got {sel.limit}")


def load_lmsys(
    path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    file: str = str(DEFAULT_FILE),
    min_turns: int = 10,
    max_non_ascii: float = 0.5,
    max_tokens: int | None = 32768,
    limit: int | None = 100,
    lenient: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    **_: Any,
) -> Trace:
    """The LMSys trace (named ``lmsys``): ``path``, else ``<data_dir>/<file>``; cached as parquet."""
    sel = Selection(
        int(min_turns),
        float(max_non_ascii),
        None if max_tokens is None else int(max_tokens),
        None if limit is None else int(limit),
    )
    _check(sel)
    source = resolve_source(path, data_dir, file, "LMSYS-Chat-1M conversations", HOW_TO_GET)
    key = {
        "source": source_fingerprint(source),
        **sel._asdict(),
        "lenient": bool(lenient),
        "tokenizer": TOKENIZER_NAME,
        "template": TEMPLATE_VERSION,
        "loader": LOADER_VERSION,
    }
    return cached_trace(TRACE_NAME, key, lambda: build_lmsys(source, sel, lenient), cache_dir)
