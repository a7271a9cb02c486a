"""Strict-or-lenient reading of line-oriented trace files (JSON Lines, CSV rows).

Every loader of a user-suppliable file goes through :class:`LineRecords`, so malformed input gets
the same treatment everywhere:

* strict (default): the first bad record raises :class:`~traces.paths.TraceFileError` naming the
  file, the 1-based line number and the fault (truncated line, invalid JSON, missing field, wrong
  field type, out-of-range value);
* ``lenient=True``: bad records are skipped and counted; :meth:`LineRecords.log_summary` logs the
  count and the first fault (a warning), so nothing is dropped silently;
* a file with no records at all (empty, only blank lines, or only a header) is always an error,
  and so is a lenient read in which every record was bad.

Field checks raise :class:`RecordError` (a message without location); the reader adds
``<file>:<line>:``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from traces.paths import TraceFileError

log = logging.getLogger(__name__)

T = TypeVar("T")


class RecordError(ValueError):
    """One record is malformed; the message says which field and why (no file/line)."""


class LineRecords(Generic[T]):
    """Iterate ``(line_number, parse(text))`` over the non-blank lines of ``path``.

    ``parse`` turns one line's text into a record or raises :class:`RecordError`. ``skip_lines``
    leading lines (a CSV header) are not parsed. Counters: ``parsed`` (good records yielded),
    ``skipped`` (bad records, lenient only). Iterating twice reads the file twice.
    """

    def __init__(
        self,
        path: Path,
        parse: Callable[[str], T],
        *,
        lenient: bool = False,
        skip_lines: int = 0,
    ) -> None:
        self.path = Path(path)
        self.parse = parse
        self.lenient = bool(lenient)
        self.skip_lines = int(skip_lines)
        self.parsed = 0
        self.skipped = 0
        self.first_fault: str | None = None

    def __iter__(self) -> Iterator[tuple[int, T]]:
        self.parsed = self.skipped = 0
        self.first_fault = None
        with self.path.open("rb") as handle:  # decoded per line: a bad byte is one bad record
            for number, raw in enumerate(handle, start=1):
                line = raw.decode("utf-8", errors="replace")
                if number <= self.skip_lines or not line.strip():
                    continue
                record = self._parse_line(number, line, raw)
                if record is not None:
                    self.parsed += 1
                    yield number, record[0]
        self._check_not_empty()

    def _parse_line(self, number: int, line: str, raw: bytes) -> tuple[T] | None:
        """``(record,)`` for a good line; None for a bad one when lenient; raise otherwise."""
        try:
            check_utf8(raw)
            return (self.parse(line),)
        except RecordError as exc:
            fault = str(exc)
            if not line.endswith("\n"):
                fault = f"{fault} (last line, no newline at end of file: truncated?)"
            where = f"{self.path}:{number}: {fault}"
            if not self.lenient:
                raise TraceFileError(where) from exc
            self.skipped += 1
            self.first_fault = self.first_fault or where
            return None

    def _check_not_empty(self) -> None:
        if self.parsed == 0 and self.skipped == 0:
            raise TraceFileError(f"{self.path}: empty file (no records)")
        if self.parsed == 0:
            raise TraceFileError(
                f"{self.path}: all {self.skipped} records are malformed (first: {self.first_fault})"
            )

    def log_summary(self) -> None:
        """Log how many records were read and (as a warning) how many were skipped."""
        if self.skipped:
            log.warning(
                "%s: skipped %d malformed record(s), kept %d (lenient); first: %s",
                self.path,
                self.skipped,
                self.parsed,
                self.first_fault,
            )
        else:
            log.info("%s: read %d records", self.path, self.parsed)


def check_utf8(raw: bytes) -> None:
    """:class:`RecordError` naming the first byte that is not UTF-8 (a binary or corrupt file)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
        ) from None


def json_object(line: str) -> dict[str, Any]:
    """One JSON Lines record as a dict; :class:`RecordError` for bad JSON or a non-object."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        what = exc.msg.removesuffix(" at")  # "Invalid control character at"
        raise RecordError(f"invalid JSON ({what} at column {exc.colno})") from exc
    if not isinstance(value, dict):
        raise RecordError(f"record is a JSON {type(value).__name__}, expected an object")
    return value


def _described(record: dict[str, Any], key: str) -> str:
    """What a bad field holds, for an error: ``missing``, ``null`` or its type and value."""
    if key not in record:
        return "missing"
    value = record[key]
    return "null" if value is None else f"{type(value).__name__} {value!r:.40}"


def get_int(record: dict[str, Any], key: str, *, minimum: int | None = None) -> int:
    """``record[key]`` as an int (bools and floats with a fraction are rejected)."""
    value = record.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"field {key!r} is {_described(record, key)}, expected an integer")
    if minimum is not None and value < minimum:
        raise RecordError(f"field {key!r} is {value}, expected >= {minimum}")
    return value


def get_number(record: dict[str, Any], key: str, *, minimum: float | None = None) -> float:
    """``record[key]`` as a finite float (ints accepted, bools rejected)."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise RecordError(f"field {key!r} is {_described(record, key)}, expected a number")
    if minimum is not None and value < minimum:
        raise RecordError(f"field {key!r} is {value}, expected >= {minimum}")
    return float(value)


def get_str(record: dict[str, Any], key: str, *, optional: bool = False) -> str | None:
    """``record[key]`` as a str; None when absent/null and ``optional``."""
    value = record.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise RecordError(f"field {key!r} is {_described(record, key)}, expected a string")
    return value


def get_list(record: dict[str, Any], key: str) -> list[Any]:
    """``record[key]`` as a list."""
    value = record.get(key)
    if not isinstance(value, list):
        raise RecordError(f"field {key!r} is {_described(record, key)}, expected a list")
    return value
