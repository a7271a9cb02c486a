"""The record format: one JSON object per line (JSONL), appended and flushed one at a time.

A run writes, in order: a ``header`` (device, clocks, software versions, model, hardware
preset), then one record per measured case, then an ``end`` record (why it stopped). A run cut
off at any point leaves every record written so far; a truncated last line is skipped on
reading. ``--resume`` appends a new header and skips the cases already recorded.

Record kinds and their fields (all records carry ``kind``, ``run_id`` and ``schema``):

* ``op`` / ``floor`` / ``component``: ``suite``, ``op_name``, ``variant``, ``op_class`` (one of
  :data:`simlab.cost.shapes.OP_CLASSES`; ``None`` for components), ``params`` (shape),
  ``flops``, ``bytes``, ``launches`` (what the simlab cost model assigns to that op for that
  shape; ``None`` for components), ``median_s``, ``p10_s``, ``p90_s``, ``mean_s``, ``n_reps``,
  ``device``, ``impl`` (which kernel ran).
* ``stack``: the same timing fields, ``op_class`` ``None``, and ``ops``: the cost model's whole
  op list for that iteration (``name``, ``op_class``, ``flops``, ``bytes``, ``launches``).
* ``check``: ``name``, ``max_abs_err``, ``rel_err``, ``tol``, ``ok``.
* ``error``: ``suite``, ``op_name``, ``variant``, ``params``, ``error`` (the case failed; the
  run went on).
* ``header`` / ``end``: run metadata.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from gpu_validate.cases import Case, op_dict, record_key
from simlab.cost.shapes import OP_CLASSES

log = logging.getLogger(__name__)

SCHEMA = 1
RECORDS_FILE = "records.jsonl"
TIMED_KINDS = ("op", "floor", "component", "stack")
_TIMING = ("median_s", "p10_s", "p90_s", "n_reps")


class RecordWriter:
    """Appends records to a JSONL file, flushing (and fsyncing) after every record."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        validate(record)
        if self._fh is None:
            raise ValueError(f"{self.path}: writer is closed")
        self._fh.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def validate(record: dict[str, Any]) -> None:
    """Raise ``ValueError`` if ``record`` lacks what its kind needs."""
    kind = record.get("kind")
    if kind in TIMED_KINDS:
        missing = [k for k in ("suite", "op_name", "params", *_TIMING) if k not in record]
        if missing:
            raise ValueError(f"{kind} record lacks {missing}")
        if not (record["p10_s"] <= record["median_s"] <= record["p90_s"]):
            raise ValueError(f"{kind} record: need p10 <= median <= p90, got {record}")
    if kind in ("op", "floor"):
        if record.get("op_class") not in OP_CLASSES:
            raise ValueError(
                f"op_class must be one of {OP_CLASSES}, got {record.get('op_class')!r}"
            )
        for k in ("flops", "bytes", "launches"):
            if not isinstance(record.get(k), int | float) or record[k] < 0:
                raise ValueError(f"{kind} record: {k} must be a number >= 0, got {record.get(k)!r}")
    if kind == "stack" and not record.get("ops"):
        raise ValueError("stack record lacks its cost-model ops")


def record_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named, or ``DIR/records.jsonl`` for a directory."""
    out = []
    for p in paths:
        path = Path(p)
        out.append(path / RECORDS_FILE if path.is_dir() else path)
    return out


def iter_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of one file; an unreadable line (a run killed mid-write) is skipped."""
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d: unreadable record skipped", path, lineno)
                continue
            if isinstance(rec, dict):
                yield rec


def read_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """All records of the given files or run directories, in order."""
    out: list[dict[str, Any]] = []
    for path in record_files(paths):
        if not path.exists():
            raise FileNotFoundError(f"no records at {path}")
        out.extend(iter_records(path))
    return out


def key_of(record: dict[str, Any]) -> str:
    return record_key(
        record["suite"], record["op_name"], record.get("variant", ""), record["params"]
    )


def done_keys(records: Iterable[dict[str, Any]]) -> set[str]:
    """Keys of the cases already measured or checked (errors are retried on resume)."""
    return {key_of(r) for r in records if r.get("kind") in (*TIMED_KINDS, "check")}


def timed(records: Iterable[dict[str, Any]], kinds: Iterable[str] = ("op",)) -> list[dict]:
    """Records of the given kinds, one per key (the last one wins: a re-measured shape
    replaces the earlier measurement)."""
    wanted = set(kinds)
    by_key: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("kind") in wanted:
            by_key[key_of(r)] = r
    return list(by_key.values())


def case_header(case: Case, run_id: str, device: str, kind: str) -> dict[str, Any]:
    """The fields every record about a case starts with (timed, check or error)."""
    return {
        "kind": kind,
        "schema": SCHEMA,
        "run_id": run_id,
        "suite": case.suite,
        "op_name": case.op_name,
        "variant": case.variant,
        "params": case.params,
        "device": device,
    }


def record_for(
    case: Case, run_id: str, device: str, impl: str, timing: dict[str, Any]
) -> dict[str, Any]:
    """The record of a timed case (same layout for real and synthetic runs)."""
    rec: dict[str, Any] = {
        **case_header(case, run_id, device, case.kind),
        "op_class": case.op_class,
        "flops": case.flops,
        "bytes": case.bytes,
        "launches": case.launches,
        "impl": impl,
        **timing,
    }
    if case.kind == "stack":
        rec["ops"] = [op_dict(o) for o in case.ops]
    if case.kind == "op" and len(case.ops) == 1:
        op = case.ops[0]
        rec["tokens"] = op.tokens  # a class curve's argument
        if op.units:
            rec["shape"], rec["units"] = list(op.shape), op.units  # a profile's key
    return rec


def headers(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "header"]
