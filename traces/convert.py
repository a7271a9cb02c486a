"""``python -m traces convert --from FORMAT IN OUT``: other trace formats to the request log.

Formats (``FORMAT``), each read as its source documents it; ``OUT`` is JSON Lines (``.jsonl``)
or parquet (``.parquet``) in the request-log format (:mod:`traces.request_log`):

============  ======================================================================================
mooncake      Mooncake FAST'25 JSONL ``{timestamp (ms), input_length, output_length, hash_ids}``
              (512-token blocks): one session per line, ``t`` = timestamp / 1000
bailian       Qwen-Bailian usage traces (alibaba-edu/qwen-bailian-usagetraces-anon) JSONL
              ``{chat_id, parent_chat_id (-1: root), timestamp (s), input_length, output_length,
              turn, hash_ids (16-token blocks)}``: a session per root chat, turns by their chain
aiperf        AIPerf custom datasets: ``mooncake_trace`` lines (``input_length``, ``hash_ids``,
              ``output_length``, optional ``session_id``, ``timestamp`` ms or ``delay`` ms),
              ``single_turn`` lines ``{text, output_length?, timestamp?, delay?}`` and
              ``multi_turn`` lines ``{session_id, turns: [{text, output_length?, delay?}]}``;
              text is tokenized (cl100k), and a turn's input holds the session's earlier texts
              (the responses are not in the file)
vllm_bench    vLLM's ``vllm bench serve --dataset-name custom`` JSONL ``{prompt, output_tokens?}``:
              one session per line, tokenized (cl100k)
claude_code   a Claude Code trace file or folder (:mod:`traces.claude_code`), its shared prefix
              and sub-agents kept (``parent``, ``after``, ``t`` and ``think``)
============  ======================================================================================

A missing output length is written as 0 (the request's prefill only).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from traces.jsonl import LineRecords, RecordError, get_int, get_list, get_number, json_object

log = logging.getLogger(__name__)

Record = dict[str, Any]


def _lines(path: Path, parse: Callable[[str], Record]) -> Iterator[Record]:
    records = LineRecords(path, parse)
    for _, record in records:
        yield record


def _hash_record(record: Record, block: int, length_key: str = "input_length") -> Record:
    return {
        "hash_ids": [int(v) for v in get_list(record, "hash_ids")],
        "block_size": block,
        "input_len": get_int(record, length_key, minimum=1),
        "output_len": get_int(record, "output_length", minimum=0),
    }


def from_mooncake(path: Path) -> Iterator[Record]:
    for i, record in enumerate(_lines(path, json_object)):
        t = get_number(record, "timestamp", minimum=0) / 1000.0
        yield {"session": i, "t": t, **_hash_record(record, 512)}


def from_bailian(path: Path) -> Iterator[Record]:
    root: dict[int, int] = {}
    for record in _lines(path, json_object):
        chat = get_int(record, "chat_id")
        parent = int(record.get("parent_chat_id", -1))
        root[chat] = root.get(parent, parent) if parent != -1 else chat
        t = get_number(record, "timestamp", minimum=0)
        yield {"session": root[chat], "t": t, **_hash_record(record, 16)}


def from_vllm_bench(path: Path) -> Iterator[Record]:
    from traces.tokenizer import encode_text

    for i, record in enumerate(_lines(path, json_object)):
        prompt = record.get("prompt")
        if not isinstance(prompt, str):
            raise RecordError(f"line {i + 1}: field 'prompt' is not a string")
        out = int(record.get("output_tokens") or 0)
        yield {"session": i, "input_ids": encode_text(prompt).tolist(), "output_len": out}


def from_aiperf(path: Path) -> Iterator[Record]:
    for i, record in enumerate(_lines(path, json_object)):
        if "turns" in record:
            yield from _aiperf_turns(record, i)
        elif "hash_ids" in record:
            yield {"session": record.get("session_id", i), **_aiperf_time(record)} | _hash_record(
                record, 512
            )
        else:
            yield from _aiperf_turns({"session_id": i, "turns": [record]}, i)


def _aiperf_time(turn: Record) -> Record:
    if turn.get("timestamp") is not None:
        return {"t": get_number(turn, "timestamp", minimum=0) / 1000.0}
    if turn.get("delay") is not None:
        return {"think": get_number(turn, "delay", minimum=0) / 1000.0}
    return {}


def _aiperf_turns(record: Record, i: int) -> Iterator[Record]:
    from traces.tokenizer import encode_text

    session = record.get("session_id", i)
    history: list[np.ndarray] = []
    for turn in get_list(record, "turns"):
        text = turn.get("text")
        if text is None and isinstance(turn.get("texts"), list):
            text = "\n".join(str(t) for t in turn["texts"])
        if not isinstance(text, str):
            raise RecordError(f"line {i + 1}: a turn has no 'text'")
        history.append(encode_text(text))
        out = int(turn.get("output_length") or 0)
        ids = np.concatenate(history).tolist()
        yield {"session": session, "input_ids": ids, "output_len": out, **_aiperf_time(turn)}


def from_claude_code(path: Path) -> Iterator[Record]:
    from traces.claude_code import Options, build_claude_code, trace_files

    files = trace_files(path)
    think = build_claude_code(files, Options(timing="think"), None, 0)
    original = build_claude_code(files, Options(timing="original"), None, 0)
    column = think.column
    names = column("ref_session_name")
    parents, spawns = column("ref_parent_session"), column("ref_spawn_turn")
    first_row = {int(s): r for r, s in reversed(list(enumerate(column("session_id"))))}
    for row in range(len(think)):
        record: Record = {"session": str(names[row])}
        if int(column("turn")[row]) == 0 and parents[row] >= 0:
            record["parent"] = str(names[first_row[int(parents[row])]])
            record["after"] = int(spawns[row])
        record["t"] = float(original.column("ref_delay")[row])
        record["think"] = float(column("ref_delay")[row])
        record["hash_ids"] = column("input_ids")[row].tolist()
        record["block_size"] = think.block_size
        record["input_len"] = int(column("ref_input_length")[row])
        record["output_len"] = int(column("output_len")[row])
        yield record


CONVERTERS: dict[str, Callable[[Path], Iterator[Record]]] = {
    "mooncake": from_mooncake,
    "bailian": from_bailian,
    "aiperf": from_aiperf,
    "vllm_bench": from_vllm_bench,
    "claude_code": from_claude_code,
}


def convert(fmt: str, source: Path, out: Path) -> int:
    """Write ``source`` (in ``fmt``) to ``out`` in the request-log format; returns the lines."""
    from traces.atomic import atomic_path
    from traces.paths import TraceFileError

    if fmt not in CONVERTERS:
        raise ValueError(f"--from: must be one of {'|'.join(CONVERTERS)}, got {fmt!r}")
    try:
        records = list(CONVERTERS[fmt](source))
    except RecordError as exc:
        raise TraceFileError(f"{source}: {exc}") from exc
    with atomic_path(out) as tmp:
        if out.suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            keys = list(dict.fromkeys(k for record in records for k in record))
            rows = [{k: record.get(k) for k in keys} for record in records]
            pq.write_table(pa.Table.from_pylist(rows), tmp)
        else:
            with open(tmp, "w") as handle:
                for record in records:
                    handle.write(json.dumps(record, separators=(",", ":")) + "\n")
    log.info("%s: %d requests written to %s", source, len(records), out)
    return len(records)
