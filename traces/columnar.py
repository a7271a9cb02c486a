"""Prefix-chain storage of a trace's token columns (the parquet layout of ``Trace.to_parquet``).

A session's inputs usually extend one another: an agent's call ``t + 1`` sends call ``t``'s
whole conversation plus an observation, so storing every input whole stores each session's
history once per call (SWE-bench, 500 sessions: 287M input tokens for about 20M distinct ones).
Here the inputs of a session that are prefixes of one another form a *chain* stored once, at
the row of its longest input (its *owner*); every row stores its owner's row and its own
length. Reading slices each input out of one flat buffer: numpy views, nothing copied, and the
file holds each chain once.

Columns written in place of ``input_ids``: ``_input_owner`` (int64 row), ``_input_len``
(int64), ``_input_chain`` (list<int32>: the owner's tokens, empty on other rows).
``output_ids`` stays a list column and is read as views too. Invariant: ``decode(encode(f))``
equals ``f`` row for row (same columns, same ids in every cell).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from traces.arrow_numpy import list_views, to_numpy

if TYPE_CHECKING:
    import pandas as pd

#: the dtype of token ids in every trace (re-exported by :mod:`traces.format`)
TOKEN_DTYPE = np.int32

CHAIN_COLUMNS = ("_input_owner", "_input_len", "_input_chain")


def chain_owners(frame: pd.DataFrame) -> np.ndarray:
    """For each row, the row whose input holds it as a prefix, within its session, walking the
    session's turns in order (a row that extends its chain becomes the chain's owner)."""
    sessions = frame["session_id"].to_numpy()
    order = np.lexsort((frame["turn"].to_numpy(), sessions))
    inputs = frame["input_ids"].tolist()
    chain_of = np.empty(len(frame), dtype=np.int64)
    owners: list[int] = []  # chain -> owner row
    current, session = -1, None
    for row in order.tolist():
        ids = inputs[row]
        if sessions[row] != session:
            current, session = -1, sessions[row]
        longest = inputs[owners[current]] if current >= 0 else None
        if longest is not None and _is_prefix(longest, ids):
            owners[current] = row  # the chain grows: this row holds it now
        elif longest is None or not _is_prefix(ids, longest):
            owners.append(row)
            current = len(owners) - 1
        chain_of[row] = current
    return np.asarray(owners, dtype=np.int64)[chain_of]


def _is_prefix(short: np.ndarray, long: np.ndarray) -> bool:
    n = short.shape[0]
    return n <= long.shape[0] and bool(np.array_equal(long[:n], short))


def encode(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``input_ids`` replaced by the chain columns (module docstring)."""
    owners = chain_owners(frame)
    inputs = frame["input_ids"].tolist()
    empty = np.zeros(0, dtype=TOKEN_DTYPE)
    out = frame.drop(columns=["input_ids"])
    out["_input_owner"] = owners
    out["_input_len"] = np.asarray([len(ids) for ids in inputs], dtype=np.int64)
    out["_input_chain"] = [
        inputs[row] if owner == row else empty for row, owner in enumerate(owners.tolist())
    ]
    return out


def decode(table: pa.Table) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """An :func:`encode`-d table as its scalar columns (arrow, the chain columns dropped) and
    ``input_ids`` / ``output_ids`` as object arrays of views (:class:`traces.format.Trace`'s
    columns)."""
    values, offsets = list_views(table.column("_input_chain"))
    values = values.astype(TOKEN_DTYPE, copy=False)
    owners = to_numpy(table.column("_input_owner"))
    lengths = to_numpy(table.column("_input_len"))
    starts = offsets[owners]
    out_values, out_offsets = list_views(table.column("output_ids"))
    out_values = out_values.astype(TOKEN_DTYPE, copy=False)
    inputs = _objects(
        values[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)
    )
    outputs = _objects(
        out_values[a:b]
        for a, b in zip(out_offsets[:-1].tolist(), out_offsets[1:].tolist(), strict=True)
    )
    scalars = table.drop(["_input_chain", "output_ids", "_input_owner", "_input_len"])
    return scalars, {"input_ids": inputs, "output_ids": outputs}


def _objects(arrays: Iterator[np.ndarray]) -> np.ndarray:
    """An object array holding ``arrays`` (numpy would stack equal-length ones into 2-D)."""
    items = list(arrays)
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out
