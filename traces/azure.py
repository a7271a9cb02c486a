"""Azure LLM inference trace 2023: arrival times and lengths, no content.

Input: CSV with header ``TIMESTAMP,ContextTokens,GeneratedTokens``; ``TIMESTAMP`` is
``YYYY-MM-DD HH:MM:SS[.fffffff]`` (UTC, up to 7 fractional digits; read to the microsecond),
``ContextTokens`` >= 1 and ``GeneratedTokens`` >= 0 integers. Files:
``<data_dir>/azure/AzureLLMInferenceTrace_{conv,code}.csv`` (GitHub Azure/AzurePublicDataset,
``data/``), or any file of this form via ``path=FILE``.

Two uses:

* :func:`load_azure_arrivals` -> ``(timestamps_s, context_tokens, generated_tokens)``: the arrival
  process (seconds, rebased so the first request is at 0, sorted) and the length distribution, for
  ``arrivals.mode=azure`` (:mod:`traces.arrival_modes`) and for the synthetic generators'
  ``lengths: azure_conv|azure_code`` (:mod:`traces.synthetic`);
* :func:`load_azure` (``trace=azure_conv`` / ``trace=azure_code``): a **no-sharing baseline** for the
  timed engine. Every row becomes one request (its own session, turn 0) with ``ContextTokens``
  random input ids and ``GeneratedTokens`` random output ids from ``default_rng(seed)``; the first
  input id of request ``i`` is the unique marker ``UNIQUE_BASE + i``, so no two requests share even
  a one-token prefix: the ideal (infinite-cache) reuse is exactly 0 and every hit rate is 0. It is
  the load and length mix of a real service with prefix caching made useless. ``ref_timestamp``
  holds the rebased arrival seconds (``arrivals.mode=timestamps`` replays them).
"""

from __future__ import annotations

import csv
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from traces.format import TOKEN_DTYPE, Trace, make_frame
from traces.jsonl import LineRecords, RecordError
from traces.paths import TraceFileError
from traces.sources import resolve_source

log = logging.getLogger(__name__)

KINDS = {
    "conv": Path("azure") / "AzureLLMInferenceTrace_conv.csv",
    "code": Path("azure") / "AzureLLMInferenceTrace_code.csv",
}
HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
HOW_TO_GET = (
    "Get the Azure LLM inference trace 2023 from GitHub Azure/AzurePublicDataset, folder data/ "
    "(AzureLLMInferenceTrace_conv.csv, AzureLLMInferenceTrace_code.csv) and place the files under "
    "<data_dir>/azure/, or point trace.path=FILE at a CSV with the header "
    "TIMESTAMP,ContextTokens,GeneratedTokens."
)
#: Ordinary ids are drawn from [0, vocab); the per-request unique markers start here.
UNIQUE_BASE = 1 << 20


class AzureArrivals(NamedTuple):
    """Arrival seconds since the first request (sorted, first = 0) and per-request lengths."""

    timestamps_s: np.ndarray
    context_tokens: np.ndarray
    generated_tokens: np.ndarray


def parse_row(line: str) -> tuple[datetime, int, int]:
    """One CSV data row; :class:`RecordError` names the bad column."""
    fields = next(csv.reader([line]))
    if len(fields) != 3:
        raise RecordError(f"{len(fields)} columns, expected 3 ({','.join(HEADER)})")
    try:
        stamp = datetime.fromisoformat(fields[0].strip())
    except ValueError as exc:
        raise RecordError(f"TIMESTAMP {fields[0]!r:.40} is not a date-time") from exc
    return stamp, _count(fields[1], "ContextTokens", 1), _count(fields[2], "GeneratedTokens", 0)


def _count(text: str, column: str, minimum: int) -> int:
    try:
        value = int(text.strip())
    except ValueError as exc:
        raise RecordError(f"{column} {text!r:.40} is not an integer") from exc
    if value < minimum:
        raise RecordError(f"{column} is {value}, expected >= {minimum}")
    return value


def _check_header(path: Path) -> None:
    with path.open("rb") as handle:  # the header alone: a bad byte further down is a record's
        first = handle.readline().decode("utf-8", errors="replace")
    if not first.strip():
        raise TraceFileError(f"{path}: empty file (no header, no records)")
    names = [f.strip() for f in next(csv.reader([first]))]
    if names != HEADER:
        raise TraceFileError(f"{path}:1: header is {names}, expected {HEADER}")


def azure_path(
    kind: str = "conv",
    path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    key: str = "trace.path",
) -> Path:
    """``path`` if given, else the ``kind`` (conv|code) CSV under the data dir; must exist
    (``key``: the config key ``path`` came from, for the error)."""
    if kind not in KINDS:
        raise ValueError(f"azure kind must be one of {sorted(KINDS)}, got {kind!r}")
    return resolve_source(
        path,
        data_dir,
        KINDS[kind],
        f"Azure LLM trace ({kind})",
        HOW_TO_GET,
        key=key,
    )


def load_azure_arrivals(path: str | os.PathLike[str], lenient: bool = False) -> AzureArrivals:
    """Arrival seconds (rebased to 0, sorted stably) and lengths of every row of ``path``."""
    path = Path(path)
    _check_header(path)
    records = LineRecords(path, parse_row, lenient=lenient, skip_lines=1)
    rows = [row for _, row in records]
    records.log_summary()
    stamps = np.array([(s - rows[0][0]).total_seconds() for s, _, _ in rows])
    order = np.argsort(stamps, kind="stable")
    unsorted = int((np.diff(stamps) < 0).sum())
    if unsorted:
        log.warning("%s: %d rows out of time order; sorted by TIMESTAMP", path, unsorted)
    stamps = stamps[order] - stamps[order][0]
    context = np.array([c for _, c, _ in rows], dtype=np.int64)[order]
    generated = np.array([g for _, _, g in rows], dtype=np.int64)[order]
    return AzureArrivals(stamps, context, generated)


def random_request_ids(
    rng: np.random.Generator, index: int, input_len: int, output_len: int, vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """Random input/output ids; input id 0 is the unique marker ``UNIQUE_BASE + index``."""
    input_ids = rng.integers(0, vocab, input_len, dtype=TOKEN_DTYPE)
    input_ids[0] = UNIQUE_BASE + index
    return input_ids, rng.integers(0, vocab, output_len, dtype=TOKEN_DTYPE)


def load_azure(
    kind: str = "conv",
    path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    seed: int = 0,
    vocab: int = 100_000,
    lenient: bool = False,
    **_: Any,
) -> Trace:
    """The no-sharing baseline trace ``azure_<kind>`` (see the module docstring); not cached
    (building it is a few hundred milliseconds)."""
    if not 1 <= int(vocab) <= UNIQUE_BASE:
        raise ValueError(f"vocab must be in [1, {UNIQUE_BASE}], got {vocab}")
    if limit is not None and int(limit) < 1:
        raise ValueError(f"limit must be >= 1 or null, got {limit}")
    source = azure_path(kind, path, data_dir)
    arrivals = load_azure_arrivals(source, lenient=lenient)
    n = len(arrivals.timestamps_s) if limit is None else min(int(limit), len(arrivals.timestamps_s))
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        ctx, gen = int(arrivals.context_tokens[i]), int(arrivals.generated_tokens[i])
        input_ids, output_ids = random_request_ids(rng, i, ctx, gen, int(vocab))
        rows.append(
            {
                "session_id": i,
                "turn": 0,
                "arrival": float("nan"),
                "input_ids": input_ids,
                "output_ids": output_ids,
                "output_len": gen,
                "ref_timestamp": float(arrivals.timestamps_s[i]),
            }
        )
    log.info("azure_%s: %d requests (no shared prefixes) from %s", kind, n, source)
    return Trace(name=f"azure_{kind}", frame=make_frame(rows))
