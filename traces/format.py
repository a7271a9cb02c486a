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

A trace read from parquet (the trace cache) keeps its columns in arrow and numpy and builds its
DataFrame only when :attr:`Trace.frame` is asked for: a replay (requests, arrivals, validation)
never imports pandas.

Invariants (checked by :func:`validate`): ``(session_id, turn)`` is unique, turns of a session
are 0..n-1, token ids are non-negative, ``output_len >= 0`` and equals ``len(output_ids)``
whenever ``output_ids`` is non-empty.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traces.arrow_numpy import from_numpy, to_numpy
from traces.atomic import atomic_path
from traces.columnar import TOKEN_DTYPE, decode, encode

if TYPE_CHECKING:
    import pandas as pd

#: Parquet schema-metadata key (and ``DataFrame.attrs`` key) holding a trace's block size.
BLOCK_SIZE_KEY = "simlab.block_size"
COLUMNS_KEY = "simlab.columns"  # the frame's column order (the file stores inputs as chains)
REQUIRED_COLUMNS = ("session_id", "turn", "arrival", "input_ids", "output_ids", "output_len")


class TraceFormatError(ValueError):
    """A trace table violates the canonical format."""


@dataclass(frozen=True, slots=True)
class AgentStep:
    """Where a request of an agentic trace sits in its session graph and when it leaves
    (the ``ref_*`` columns of :mod:`traces.agents`)."""

    parent_session: int
    spawn_turn: int
    depth: int
    anchor: int
    delay: float
    users: int


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
    #: agentic traces only: the request's place in its session graph
    agent: AgentStep | None = None

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


class Trace:
    """A named canonical trace table plus the settings that produced it.

    Built from a DataFrame (``Trace(name, frame)``: the loaders) or from arrow columns
    (:meth:`from_columns`: a parquet file); :meth:`column` reads either without pandas, and
    :attr:`frame` is the DataFrame (built on first use for arrow columns, the same frame
    ``table.to_pandas()`` plus the token columns gives).

    ``block_size`` is the number of tokens per id (see the module docstring). When it is left at
    1 and ``frame.attrs`` carries a block size (a frame copied from a block trace, e.g. by
    :func:`traces.arrivals.assign_arrivals`), that value is adopted; a block size other than 1
    is recorded in ``frame.attrs`` so copies of the frame keep it.
    """

    def __init__(self, name: str, frame: pd.DataFrame | None = None, block_size: int = 1) -> None:
        self.name = name
        self._frame = frame
        self._scalars: pa.Table | None = None
        self._tokens: dict[str, np.ndarray] = {}
        self._order: list[str] = []
        if frame is not None:
            self._finish(block_size)

    @classmethod
    def from_columns(
        cls,
        name: str,
        scalars: pa.Table,
        tokens: dict[str, np.ndarray],
        order: list[str],
        block_size: int = 1,
    ) -> Trace:
        """A trace of arrow ``scalars`` and ``tokens`` (object arrays of id arrays), its columns
        in ``order``; validated like any other."""
        trace = cls(name)
        trace._scalars, trace._tokens, trace._order = scalars, tokens, list(order)
        trace._finish(block_size)
        return trace

    def _finish(self, block_size: int) -> None:
        validate_columns(self.columns, self.column, len(self), self.name)
        if block_size == 1 and self._frame is not None:
            block_size = int(self._frame.attrs.get(BLOCK_SIZE_KEY, 1))
        if isinstance(block_size, bool) or int(block_size) < 1:
            raise TraceFormatError(f"trace {self.name!r}: block_size must be >= 1")
        self.block_size = int(block_size)
        if self.block_size != 1 and self._frame is not None:
            self._frame.attrs[BLOCK_SIZE_KEY] = self.block_size

    @property
    def frame(self) -> pd.DataFrame:
        """The trace as a DataFrame (for arrow columns built here once: imports pandas)."""
        if self._frame is None:
            assert self._scalars is not None
            frame = self._scalars.to_pandas()
            for column, values in self._tokens.items():
                frame[column] = list(values)
            frame = frame[self._order]
            if self.block_size != 1:
                frame.attrs[BLOCK_SIZE_KEY] = self.block_size
            self._frame = frame
        return self._frame

    @property
    def columns(self) -> list[str]:
        return list(self._frame.columns) if self._frame is not None else list(self._order)

    def column(self, name: str) -> np.ndarray:
        """One column as a numpy array (token columns: object arrays of id arrays)."""
        if self._frame is not None:
            return self._frame[name].to_numpy()
        if name in self._tokens:
            return self._tokens[name]
        assert self._scalars is not None
        return to_numpy(self._scalars.column(name))

    def with_arrivals(self, arrival: np.ndarray) -> Trace:
        """A copy with the ``arrival`` column replaced (same name, block size and columns).
        Not validated again: no invariant of :func:`validate_columns` reads arrivals."""
        copy = Trace(self.name)
        copy.block_size = self.block_size
        copy._tokens, copy._order = self._tokens, list(self._order)
        if self._frame is not None:
            copy._frame = self._frame.copy()
            copy._frame["arrival"] = arrival
            return copy
        assert self._scalars is not None
        index = self._scalars.schema.get_field_index("arrival")
        values = from_numpy(np.asarray(arrival, dtype=np.float64))
        copy._scalars = self._scalars.set_column(index, "arrival", values)
        return copy

    def __len__(self) -> int:
        if self._frame is not None:
            return len(self._frame)
        assert self._scalars is not None
        return self._scalars.num_rows

    @property
    def n_sessions(self) -> int:
        return len(np.unique(self.column("session_id")))

    @property
    def reference_columns(self) -> list[str]:
        return [c for c in self.columns if c.startswith("ref_")]

    def requests(self) -> Iterator[Request]:
        """Requests in arrival order (ties by session, turn); request_id is the row position."""
        column = self.column
        # whole columns once (a row lookup per request costs more than the rest of start-up)
        sessions, turns, arrivals = column("session_id"), column("turn"), column("arrival")
        order = np.lexsort((turns, sessions, arrivals))
        output_lens = column("output_len")
        inputs, outputs = column("input_ids"), column("output_ids")
        true_inputs = column("ref_input_length") if "ref_input_length" in self.columns else None
        agents = self._agent_steps()
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
                agent=None if agents is None else agents[pos],
            )

    def _agent_steps(self) -> list[AgentStep] | None:
        """Per row, its :class:`AgentStep` (None: not an agentic trace)."""
        if "ref_parent_session" not in self.columns:
            return None
        names = ("ref_parent_session", "ref_spawn_turn", "ref_agent_depth", "ref_anchor")
        ints = [np.asarray(self.column(n)).tolist() for n in (*names, "ref_users")]
        delays = np.asarray(self.column("ref_delay"), dtype=np.float64).tolist()
        return [
            AgentStep(p, s, d, a, delay, u)
            for p, s, d, a, u, delay in zip(*ints, delays, strict=True)
        ]

    def to_parquet(self, path: Path) -> None:
        """Write the trace with its inputs stored as prefix chains (:mod:`traces.columnar`)."""
        metadata = {
            BLOCK_SIZE_KEY: str(self.block_size),
            COLUMNS_KEY: json.dumps([str(c) for c in self.columns]),
        }
        write_frame_atomic(encode(self.frame), path, metadata)

    @classmethod
    def read_parquet(cls, path: Path, name: str) -> Trace:
        """The trace :meth:`to_parquet` wrote; token columns are views of one buffer each."""
        table = pq.ParquetFile(path).read()  # not read_table: its datasets import pandas
        metadata = table.schema.metadata or {}
        block_size = int(metadata.get(BLOCK_SIZE_KEY.encode(), b"1"))
        scalars, tokens = decode(table)
        columns = metadata.get(COLUMNS_KEY.encode())
        order = json.loads(columns) if columns is not None else [*scalars.column_names, *tokens]
        return cls.from_columns(name, scalars, tokens, order, block_size)


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
    import pandas as pd

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
    validate_columns(list(frame.columns), lambda c: frame[c].to_numpy(), len(frame), name)


def validate_columns(
    names: list[str], column: Callable[[str], np.ndarray], n_rows: int, name: str
) -> None:
    """:func:`validate` on a table given as its column names, a column getter and its rows.
    Errors name the first offending row (a duplicate: its second occurrence) or the smallest
    offending session."""
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise TraceFormatError(f"trace {name!r}: missing columns {missing}")
    if n_rows == 0:
        raise TraceFormatError(f"trace {name!r}: no requests")
    sessions, turns = column("session_id"), column("turn")
    order = np.lexsort((turns, sessions))  # stable: equal keys keep their row order
    s, t = sessions[order], turns[order]
    repeat = np.r_[False, (s[1:] == s[:-1]) & (t[1:] == t[:-1])]
    if repeat.any():
        raise TraceFormatError(
            f"trace {name!r}: duplicate (session_id, turn) at row {int(order[repeat].min())}"
        )
    first = np.r_[True, s[1:] != s[:-1]]
    starts = np.flatnonzero(first)
    counts = np.diff(np.r_[starts, n_rows])
    last = np.r_[starts[1:], n_rows] - 1
    bad = (t[starts] != 0) | (t[last] != counts - 1)
    if bad.any():
        session = s[starts[np.flatnonzero(bad)[0]]]
        raise TraceFormatError(f"trace {name!r}: session {session} turns are not 0..n-1")
    _check_rows(name, column("input_ids"), column("output_ids"), column("output_len"))


def _check_rows(
    name: str, inputs: np.ndarray, outputs: np.ndarray, output_lens: np.ndarray
) -> None:
    """Every row's input is not empty, its output ids (when given) are ``output_len`` long,
    and no length or input id is negative. The error names the first offending row and, of
    its faults, the first in that order."""
    n = len(inputs)
    input_lens = np.fromiter(map(len, inputs), dtype=np.int64, count=n)
    got = np.fromiter(map(len, outputs), dtype=np.int64, count=n)
    lowest = np.fromiter(
        (np.minimum.reduce(ids) if len(ids) else 0 for ids in inputs), dtype=np.int64, count=n
    )
    output_lens = np.asarray(output_lens)
    empty = input_lens == 0
    mismatch = (got != 0) & (got != output_lens)
    bad = empty | mismatch | (output_lens < 0) | (lowest < 0)
    if not bad.any():
        return
    pos = int(np.argmax(bad))
    if empty[pos]:
        raise TraceFormatError(f"trace {name!r}: empty input at row {pos}")
    if mismatch[pos]:
        raise TraceFormatError(f"trace {name!r}: output_len != len(output_ids) at row {pos}")
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
    _write_table(table, path)


def write_table_atomic(columns: dict[str, np.ndarray], path: Path) -> None:
    """Numpy columns to parquet, atomically (:func:`write_frame_atomic` without pandas: read
    back, the same frame; strings as arrow strings)."""
    arrays = [from_numpy(values) for values in columns.values()]
    _write_table(pa.Table.from_arrays(arrays, names=list(columns)), path)


def _write_table(table: pa.Table, path: Path) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
