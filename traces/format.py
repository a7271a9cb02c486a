"""The canonical trace format every loader produces and every engine consumes.

A trace is a table with one row per request (one LLM call):

==============  ===========  ==========================================================
column          type         meaning
==============  ===========  ==========================================================
session_id      int64        conversation / agent episode the request belongs to
turn            int64        0-based index of the request within its session
arrival         float64      arrival time in seconds (NaN until arrivals are assigned)
input_ids       list<int32>  the exact prompt tokens sent (rendered with the chat template)
output_ids      list<int32>  the reply tokens (empty when only the length is known)
output_len      int64        number of reply tokens (== len(output_ids) when known)
ref_*           any          optional reference columns (provider figures, timestamps)
ref_user_words  int64        (chat loaders) words of the user message the request ends with,
                             its spaces (:func:`traces.sharegpt.user_words`); read by
                             ``arrivals.gaps=typing``
==============  ===========  ==========================================================

Units. ``input_ids`` / ``output_ids`` hold one id per *unit* of ``Trace.block_size`` tokens
(default 1: token ids). Hash-id traces (Mooncake) hold one id per 512-token block: equal ids mean
equal prefixes, the last block may be partial, ``ref_input_length`` keeps the true input tokens,
``output_ids`` is empty and ``output_len`` is in **tokens** (a reply is decoded token by token and
never admitted as blocks). :attr:`Request.input_tokens` and :meth:`Request.hit_tokens` convert a
request's units to tokens. ``block_size`` travels with the frame (``frame.attrs``) and with parquet
files (schema metadata ``simlab.block_size``).

Invariants (checked by :func:`validate`): ``(session_id, turn)`` is unique, turns of a session
are 0..n-1, token ids are non-negative, ``output_len >= 0`` and equals ``len(output_ids)``
whenever ``output_ids`` is non-empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from traces.atomic import atomic_path

TOKEN_DTYPE = np.int32
#: Parquet schema-metadata key (and ``DataFrame.attrs`` key) holding a trace's block size.
BLOCK_SIZE_KEY = "simlab.block_size"
COLUMNS_KEY = "simlab.columns"  # the frame's column order (the file stores inputs as chains)
REQUIRED_COLUMNS = ("session_id", "turn", "arrival", "input_ids", "output_ids", "output_len")


class TraceFormatError(ValueError):
    """A trace table violates the canonical format."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace, in the form the engines consume."""

    request_id: int
    session_id: int
    turn: int
    arrival: float
    input_ids: np.ndarray
    output_ids: np.ndarray
    output_len: int
    #: tokens per id of ``input_ids`` (1 for token traces, 512 for Mooncake hash ids)
    block_size: int = 1
    #: true input tokens when the trace knows them (``ref_input_length``), else None
    ref_input_tokens: int | None = None

    @property
    def input_len(self) -> int:
        """Input length in units (ids); tokens only when ``block_size == 1``."""
        return int(self.input_ids.shape[0])

    @property
    def input_tokens(self) -> int:
        """Input length in tokens: ``ref_input_tokens`` if known, else units x block_size."""
        if self.ref_input_tokens is not None:
            return self.ref_input_tokens
        return self.input_len * self.block_size

    def hit_tokens(self, hit_units: int) -> int:
        """Tokens whose prefill a hit of ``hit_units`` ids skips: ``min(units x block, tokens)``.

        A hit of at most ``input_len - 1`` units stays below ``input_tokens`` (the last block holds
        at least one token), so at least one token is still prefilled.
        """
        return min(int(hit_units) * self.block_size, self.input_tokens)

    def full_sequence(self) -> np.ndarray:
        """Input followed by the output tokens: what the cache admits after the request."""
        if self.output_ids.shape[0] == 0:
            return self.input_ids
        return np.concatenate((self.input_ids, self.output_ids))


@dataclass
class Trace:
    """A named canonical trace table plus the settings that produced it.

    ``block_size`` is the number of tokens per id (see the module docstring). When it is left at
    1 and ``frame.attrs`` carries a block size (a frame copied from a block trace, e.g. by
    :func:`traces.arrivals.assign_arrivals`), that value is adopted; a block size other than 1
    is recorded in ``frame.attrs`` so copies of the frame keep it.
    """

    name: str
    frame: pd.DataFrame
    block_size: int = 1

    def __post_init__(self) -> None:
        validate(self.frame, self.name)
        if self.block_size == 1:
            self.block_size = int(self.frame.attrs.get(BLOCK_SIZE_KEY, 1))
        if isinstance(self.block_size, bool) or int(self.block_size) < 1:
            raise TraceFormatError(f"trace {self.name!r}: block_size must be >= 1")
        self.block_size = int(self.block_size)
        if self.block_size != 1:
            self.frame.attrs[BLOCK_SIZE_KEY] = self.block_size

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def n_sessions(self) -> int:
        return int(self.frame["session_id"].nunique())

    @property
    def reference_columns(self) -> list[str]:
        return [c for c in self.frame.columns if c.startswith("ref_")]

    def requests(self) -> Iterator[Request]:
        """Requests in arrival order (ties by session, turn); request_id is the row position."""
        frame = self.frame
        order = np.lexsort(
            (frame["turn"].to_numpy(), frame["session_id"].to_numpy(), frame["arrival"].to_numpy())
        )
        # whole columns once (a row lookup per request costs more than the rest of start-up)
        sessions, turns = frame["session_id"].to_numpy(), frame["turn"].to_numpy()
        arrivals, output_lens = frame["arrival"].to_numpy(), frame["output_len"].to_numpy()
        inputs, outputs = frame["input_ids"].to_numpy(), frame["output_ids"].to_numpy()
        true_inputs = (
            frame["ref_input_length"].to_numpy() if "ref_input_length" in frame.columns else None
        )
        for pos in order.tolist():
            yield Request(
                request_id=pos,
                session_id=int(sessions[pos]),
                turn=int(turns[pos]),
                arrival=float(arrivals[pos]),
                input_ids=as_tokens(inputs[pos]),
                output_ids=as_tokens(outputs[pos]),
                output_len=int(output_lens[pos]),
                block_size=self.block_size,
                ref_input_tokens=None if true_inputs is None else int(true_inputs[pos]),
            )

    def to_parquet(self, path: Path) -> None:
        """Write the trace with its inputs stored as prefix chains (:mod:`traces.columnar`)."""
        from traces.columnar import encode

        metadata = {
            BLOCK_SIZE_KEY: str(self.block_size),
            COLUMNS_KEY: json.dumps([str(c) for c in self.frame.columns]),
        }
        write_frame_atomic(encode(self.frame), path, metadata)

    @classmethod
    def read_parquet(cls, path: Path, name: str) -> Trace:
        """The trace :meth:`to_parquet` wrote; token columns are views of one buffer each."""
        from traces.columnar import decode

        table = pq.read_table(path)
        metadata = table.schema.metadata or {}
        block_size = int(metadata.get(BLOCK_SIZE_KEY.encode(), b"1"))
        frame = decode(table)
        frame.attrs.pop(BLOCK_SIZE_KEY, None)
        columns = metadata.get(COLUMNS_KEY.encode())
        if columns is not None:
            frame = frame[json.loads(columns)]
        return cls(name=name, frame=frame, block_size=block_size)


def as_tokens(values: object) -> np.ndarray:
    """A token sequence as a contiguous int32 array (no copy when it already is one)."""
    return np.ascontiguousarray(np.asarray(values, dtype=TOKEN_DTYPE))


def request_row(
    session_id: int, turn: int, input_ids: Any, output_ids: Any, **refs: Any
) -> dict[str, Any]:
    """One canonical row: a request with its full output, arrival left to the arrival model
    (NaN); ``refs`` are extra ``ref_*`` columns."""
    return {
        "session_id": session_id,
        "turn": turn,
        "arrival": float("nan"),
        "input_ids": input_ids,
        "output_ids": output_ids,
        "output_len": len(output_ids),
        **refs,
    }


def make_frame(rows: list[dict]) -> pd.DataFrame:
    """Build a canonical frame from row dicts holding at least the required columns."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame({c: pd.Series(dtype=object) for c in REQUIRED_COLUMNS})
    for col in ("session_id", "turn", "output_len"):
        frame[col] = frame[col].astype(np.int64)
    frame["arrival"] = frame["arrival"].astype(np.float64)
    for col in ("input_ids", "output_ids"):
        frame[col] = [as_tokens(v) for v in frame[col]]
    return frame


def validate(frame: pd.DataFrame, name: str) -> None:
    """Raise :class:`TraceFormatError` naming the trace and row when an invariant fails."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise TraceFormatError(f"trace {name!r}: missing columns {missing}")
    if frame.empty:
        raise TraceFormatError(f"trace {name!r}: no requests")
    keys = frame[["session_id", "turn"]]
    if keys.duplicated().any():
        row = int(np.flatnonzero(keys.duplicated().to_numpy())[0])
        raise TraceFormatError(f"trace {name!r}: duplicate (session_id, turn) at row {row}")
    turns = frame.groupby("session_id")["turn"].agg(["min", "max", "count"])
    bad = turns[(turns["min"] != 0) | (turns["max"] != turns["count"] - 1)]
    if not bad.empty:
        raise TraceFormatError(f"trace {name!r}: session {bad.index[0]} turns are not 0..n-1")
    for pos, (inp, out, out_len) in enumerate(
        zip(frame["input_ids"], frame["output_ids"], frame["output_len"], strict=True)
    ):
        if len(inp) == 0:
            raise TraceFormatError(f"trace {name!r}: empty input at row {pos}")
        if len(out) and len(out) != out_len:
            raise TraceFormatError(f"trace {name!r}: output_len != len(output_ids) at row {pos}")
        if out_len < 0 or (len(inp) and int(np.min(inp)) < 0):
            raise TraceFormatError(f"trace {name!r}: negative length or token id at row {pos}")


def write_frame_atomic(
    frame: pd.DataFrame, path: Path, metadata: dict[str, str] | None = None
) -> None:
    """Write a frame to parquet so readers never see a partial file (temp file + rename).

    ``metadata`` (optional) is added to the parquet schema metadata.
    """
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if metadata:
        merged = dict(table.schema.metadata or {})
        merged.update({k.encode(): v.encode() for k, v in metadata.items()})
        table = table.replace_schema_metadata(merged)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
