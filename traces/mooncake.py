"""Mooncake-format production traces (hash ids of 512-token blocks) as a block-unit trace.

Input: JSON Lines, one request per line, ``{timestamp, input_length, output_length, hash_ids}``:
``timestamp`` arrival in ``time_unit`` (``ms``, Mooncake's own, or ``s``; never guessed), ``input_length`` / ``output_length``
tokens (integers, >= 1 and >= 0), ``hash_ids`` the ids of the prompt's consecutive blocks of
``block_size`` (512) tokens, chained so that an equal id at position ``i`` means an equal prefix
up to block ``i``; the last block may be partial, so ``len(hash_ids) == ceil(input_length /
block_size)`` is checked. Default file ``<data_dir>/mooncake/synthetic_trace.jsonl``
(GitHub kvcache-ai/Mooncake, ``FAST25-release/traces/``); ``path=FILE`` reads another trace in
this format (e.g. the FAST'25 ``conversation_trace.jsonl`` / ``toolagent_trace.jsonl``).

Canonical form (``Trace.block_size == block_size``):

=================  ==============================================================================
input_ids          the hash ids, one per block (int32; remapped to 0..k-1 by first appearance when
                   any id falls outside int32, which preserves equality and hence every match)
output_ids         empty: the reply's blocks are unknown, so nothing of it is admitted to the tree
output_len         ``output_length`` in **tokens** (decode steps), not blocks
ref_input_length   ``input_length``: true prompt tokens (the last block may be partial)
ref_timestamp      ``timestamp`` in seconds (``time_unit``) as recorded (not rebased)
=================  ==============================================================================

Sessions: the format has no session ids, so every request is its own session (``turn`` 0),
numbered in file order; reuse between them shows up as shared hash-id prefixes. Arrivals come
from ``ref_timestamp`` with ``arrivals.mode=timestamps`` (:mod:`traces.arrival_modes`).

Fields beyond these four are not read; their names are logged once at parse. A clock that
looks like the wrong unit (over 1,000 requests/s, or more than 100 requests within a second) is
a warning naming ``trace.time_unit``.

Engines convert block hits to tokens with :meth:`traces.format.Request.hit_tokens`:
``hit_tokens = min(hit_blocks * block_size, input_tokens)``.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from traces.cache import cached_trace, source_fingerprint
from traces.format import TOKEN_DTYPE, Trace, make_frame
from traces.jsonl import LineRecords, RecordError, get_int, get_list, get_number, json_object
from traces.sources import resolve_source

log = logging.getLogger(__name__)

TRACE_NAME = "mooncake"
LOADER_VERSION = "mooncake-v1"
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
#: ``trace.time_unit`` -> units of ``timestamp`` per second
TIME_UNITS = {"ms": 1000.0, "s": 1.0}
#: a clock faster than this (requests/s), or this many requests within one second, is suspect
SUSPECT_RATE, SUSPECT_BURST = 1000.0, 100
BLOCK_SIZE = 512
DEFAULT_FILE = Path("mooncake") / "synthetic_trace.jsonl"
HOW_TO_GET = (
    "Get Mooncake traces from GitHub kvcache-ai/Mooncake, folder FAST25-release/traces/ "
    "(e.g. synthetic_trace.jsonl) and place them under <data_dir>/mooncake/, or point "
    "trace.path=FILE at a JSON Lines file with timestamp, input_length, output_length, hash_ids."
)
_INT32_MAX = int(np.iinfo(np.int32).max)


class MooncakeRequest(NamedTuple):
    timestamp: float  # in the trace's time_unit
    input_length: int
    output_length: int
    hash_ids: list[int]
    extra: tuple[str, ...]  # fields of the record that are not read


def record_parser(block_size: int):
    """A line parser checking the fields and ``len(hash_ids) == ceil(input_length / block)``."""

    def parse(line: str) -> MooncakeRequest:
        record = json_object(line)
        timestamp = get_number(record, "timestamp", minimum=0)
        input_length = get_int(record, "input_length", minimum=1)
        output_length = get_int(record, "output_length", minimum=0)
        hash_ids = get_list(record, "hash_ids")
        for index, value in enumerate(hash_ids):
            if isinstance(value, bool) or not isinstance(value, int):
                raise RecordError(f"hash_ids[{index}] is {value!r:.30}, expected an integer")
        expected = math.ceil(input_length / block_size)
        if len(hash_ids) != expected:
            raise RecordError(
                f"hash_ids has {len(hash_ids)} blocks but input_length {input_length} needs "
                f"ceil({input_length}/{block_size}) = {expected}"
            )
        extra = tuple(sorted(set(record) - set(FIELDS)))
        return MooncakeRequest(timestamp, input_length, output_length, hash_ids, extra)

    return parse


def remap_ids(sequences: list[list[int]]) -> list[np.ndarray]:
    """The id sequences as int32 arrays; ids outside int32 force a remap to dense ids.

    The remap numbers distinct ids by first appearance, so two positions hold equal ids after
    the remap exactly when they did before: every prefix match is preserved.
    """
    flat = [v for seq in sequences for v in seq]
    if not flat or (min(flat) >= 0 and max(flat) <= _INT32_MAX):
        return [np.asarray(seq, dtype=TOKEN_DTYPE) for seq in sequences]
    dense: dict[int, int] = {}
    log.info("hash ids outside int32: remapping %d distinct ids", len(set(flat)))
    return [
        np.asarray([dense.setdefault(v, len(dense)) for v in seq], dtype=TOKEN_DTYPE)
        for seq in sequences
    ]


def log_unread_fields(requests: list[MooncakeRequest], path: Path) -> None:
    """One line naming the fields the format does not read, with how many records had each."""
    counts: dict[str, int] = {}
    for request in requests:
        for name in request.extra:
            counts[name] = counts.get(name, 0) + 1
    if counts:
        listed = ", ".join(f"{name} ({n})" for name, n in sorted(counts.items()))
        log.warning("%s: fields not read by the Mooncake format: %s", path, listed)


def check_clock(seconds: np.ndarray, time_unit: str, path: Path) -> None:
    """A warning naming ``trace.time_unit`` when the arrivals look like another unit's."""
    if len(seconds) < 2:
        return
    span = float(seconds.max() - seconds.min())
    rate = (len(seconds) - 1) / span if span > 0 else math.inf
    if rate > SUSPECT_RATE or (len(seconds) > SUSPECT_BURST and span < 1.0):
        log.warning(
            "%s: %d requests in %.3g s (%.3g requests/s) with trace.time_unit=%s: is the "
            "timestamp unit right?",
            path,
            len(seconds),
            span,
            rate,
            time_unit,
        )


def build_mooncake(
    path: Path, block_size: int, limit: int | None, lenient: bool, time_unit: str = "ms"
) -> Trace:
    """Parse (no cache); each request its own session, in file order."""
    records = LineRecords(path, record_parser(block_size), lenient=lenient)
    requests: list[MooncakeRequest] = []
    for _, request in records:
        requests.append(request)
        if limit is not None and len(requests) >= limit:
            break
    records.log_summary()
    log_unread_fields(requests, path)
    seconds = np.array([r.timestamp for r in requests], dtype=float) / TIME_UNITS[time_unit]
    check_clock(seconds, time_unit, path)
    ids = remap_ids([r.hash_ids for r in requests])
    empty = np.zeros(0, dtype=TOKEN_DTYPE)
    rows = [
        {
            "session_id": i,
            "turn": 0,
            "arrival": float("nan"),
            "input_ids": ids[i],
            "output_ids": empty,
            "output_len": r.output_length,
            "ref_input_length": r.input_length,
            "ref_timestamp": float(seconds[i]),
        }
        for i, r in enumerate(requests)
    ]
    log.info("mooncake: %d requests of %d-token blocks from %s", len(rows), block_size, path)
    return Trace(name=TRACE_NAME, frame=make_frame(rows), block_size=block_size)


def load_mooncake(
    path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    file: str = str(DEFAULT_FILE),
    block_size: int = BLOCK_SIZE,
    limit: int | None = None,
    lenient: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    time_unit: str = "ms",
    **_: Any,
) -> Trace:
    """The Mooncake trace (named ``mooncake``, block units), parsed once and cached as parquet."""
    if time_unit not in TIME_UNITS:
        raise ValueError(f"trace.time_unit: must be one of ms, s (got {time_unit!r})")
    if int(block_size) < 1:
        raise ValueError(f"block_size must be >= 1 tokens, got {block_size}")
    if limit is not None and int(limit) < 1:
        raise ValueError(f"limit must be >= 1 or null, got {limit}")
    source = resolve_source(path, data_dir, file, "Mooncake hash-id trace", HOW_TO_GET)
    key = {
        "source": source_fingerprint(source),
        "block_size": int(block_size),
        "limit": None if limit is None else int(limit),
        "lenient": bool(lenient),
        "loader": LOADER_VERSION,
    } | ({} if time_unit == "ms" else {"time_unit": time_unit})
    return cached_trace(
        TRACE_NAME,
        key,
        lambda: build_mooncake(source, int(block_size), limit, lenient, time_unit),
        cache_dir,
    )
