"""Arrow arrays to numpy and back through their buffers, without pandas.

pyarrow's own conversions (``Array.to_numpy``, ``pa.array``) probe for pandas and import it when
it is installed: a quarter of a second of a short run's start-up, for tables that never become a
DataFrame. For the types a trace's and a run's columns have (fixed-width numbers without nulls,
booleans, strings) the buffers are read and built here directly; anything else (nulls, other
types) goes through pyarrow's conversions. Invariant: the results equal pyarrow's
(``to_numpy(chunked)`` equals ``chunked.to_numpy()``, ``from_numpy(v)`` equals ``pa.array(v)``
but for strings, which are ``large_string`` as pandas writes them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa


def to_numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column's values as numpy: a view of the buffer for fixed-width numbers without nulls."""
    array = _one_chunk(column)
    dtype = _fixed_width(array.type)
    if dtype is None or array.null_count:
        return column.to_numpy()
    if len(array) == 0 or array.buffers()[1] is None:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(array.buffers()[1], dtype=dtype)[array.offset : array.offset + len(array)]


def list_views(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A list column's (flat values, offsets into them): one buffer each, nothing per row."""
    array = _one_chunk(column)
    if array.null_count:
        raise ValueError("a list column with nulls has no flat values")
    offsets = _offsets(array)
    values = to_numpy(array.values)
    return values, offsets


def _offsets(array: pa.Array) -> np.ndarray:
    """A list array's ``len + 1`` offsets into its values (the slice's own, as ``offsets``)."""
    width = np.int64 if pa.types.is_large_list(array.type) else np.int32
    buffer = np.frombuffer(array.buffers()[1], dtype=width)
    return buffer[array.offset : array.offset + len(array) + 1]


def _one_chunk(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def _fixed_width(kind: pa.DataType) -> np.dtype | None:
    """The numpy type of an arrow integer or float type (None for any other)."""
    if pa.types.is_integer(kind):
        return np.dtype(f"{'i' if pa.types.is_signed_integer(kind) else 'u'}{kind.bit_width // 8}")
    if pa.types.is_floating(kind):
        return np.dtype(f"f{kind.bit_width // 8}")
    return None


def from_numpy(values: np.ndarray) -> pa.Array:
    """A numpy column as an arrow array: numbers and booleans from their buffers, Python
    strings as ``large_string``; other columns through ``pa.array``."""
    values = np.asarray(values)
    n = len(values)
    if values.dtype.kind in "iuf":
        data = np.ascontiguousarray(values)
        return pa.Array.from_buffers(pa.from_numpy_dtype(data.dtype), n, [None, pa.py_buffer(data)])
    if values.dtype == np.bool_:
        bits = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bits)])
    if values.dtype == object and all(type(v) is str for v in values.tolist()):
        encoded = [v.encode() for v in values.tolist()]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
        return pa.Array.from_buffers(pa.large_string(), n, buffers)
    return pa.array(values)


#: the numpy type of each arrow type :func:`from_optional` builds from a data buffer
_OPTIONAL_NUMBERS = {pa.int64(): np.int64, pa.float64(): np.float64}


def from_optional(values: list[Any], kind: pa.DataType) -> pa.Array:
    """Python values, None for a null, as an arrow array of ``kind`` (int64, float64, bool or
    string) built from its buffers, with a validity bitmap where a value is missing; equals
    ``pa.array(values, type=kind)``."""
    n = len(values)
    valid = np.fromiter((v is not None for v in values), dtype=np.bool_, count=n)
    nulls = n - int(valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    if kind == pa.string():
        encoded = [b"" if v is None else v.encode() for v in values]
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    elif kind == pa.bool_():
        bits = np.fromiter((bool(v) for v in values), dtype=np.bool_, count=n)
        buffers = [validity, pa.py_buffer(np.packbits(bits, bitorder="little"))]
    else:
        data = np.fromiter((0 if v is None else v for v in values), _OPTIONAL_NUMBERS[kind], n)
        buffers = [validity, pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, n, buffers, null_count=nulls)
