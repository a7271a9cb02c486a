"""Measured prefill times that ``python -m simlab.predict measured.path=FILE`` checks its
prediction against, row by row (a TTFT table measured on a real engine, or ``gpu_validate``'s
forward passes).

The table is CSV, JSON lines (``.jsonl``) or parquet, one row per measurement:

* ``measured.tokens`` (default ``prompt_tokens``): the prompt's length in tokens, cached
  prefix included;
* ``measured.time`` (default ``ttft_ms``): the measured time, in ``measured.unit`` (``ms`` or
  ``s``);
* ``measured.prefix`` (optional, a column name): the tokens of the prompt already cached; else
  the config's ``prefix`` for every row;
* ``measured.tp`` (optional, a column name): the tensor-parallel degree the row was measured
  at; else ``engine.tp`` for every row.

Each row is predicted exactly as ``prefill=[tokens - prefix] prefix=... engine.tp=...`` would
predict it (with the config's ``batch`` and scheduling). Errors are ``predicted / measured - 1``.
The summary (:func:`compare`) gives MAPE (the mean ``|error|``), the median and P90 ``|error|``,
the median ratio ``predicted / measured`` and the mean signed error, over all rows and per band
of prompt length (:data:`BANDS`). Nothing is fitted to the table: it only measures the error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simlab.config import ConfigError

#: upper edges (tokens, inclusive) of the prompt-length bands of :func:`compare`; the last
#: band holds every longer prompt
BANDS = (64, 512, 2048, 8192, 32768)
UNITS = {"ms": 1e-3, "s": 1.0}
READERS = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}


@dataclass(frozen=True)
class MeasuredTable:
    """A table's rows: prompt tokens, cached prefix tokens and tensor-parallel degree (int64),
    measured seconds (float64). Invariant: ``0 <= prefix < tokens``, ``tp >= 1``,
    ``seconds > 0`` and finite."""

    path: Path
    tokens: np.ndarray
    prefix: np.ndarray
    tp: np.ndarray
    seconds: np.ndarray

    @property
    def new(self) -> np.ndarray:
        """Tokens each row prefills (its prompt past the cached prefix)."""
        return self.tokens - self.prefix


def settings(cfg: Any) -> dict[str, Any] | None:
    """The ``measured`` settings, or None when no table is asked for (``measured.path``
    null, or a config without the key)."""
    section = cfg.get("measured") if cfg is not None else None
    if section is None or section.get("path") in (None, ""):
        return None
    known = {"path", "tokens", "time", "unit", "prefix", "tp"}
    for key in section:
        if key not in known:
            raise ConfigError(f"measured.{key}: unknown key (known: {', '.join(sorted(known))})")
    unit = section.get("unit", "ms")
    if unit not in UNITS:
        raise ConfigError(f"measured.unit: must be one of {', '.join(UNITS)} (got {unit!r})")
    return {
        "path": Path(str(section["path"])),
        "tokens": str(section.get("tokens") or "prompt_tokens"),
        "time": str(section.get("time") or "ttft_ms"),
        "unit": unit,
        "prefix": section.get("prefix"),
        "tp": section.get("tp"),
    }


def load(cfg: Any, prefix: int, tp: int) -> MeasuredTable | None:
    """The table ``cfg.measured`` names (None: none asked for), checked before any
    prediction: a missing or unreadable file, a missing column or a bad value is a
    :class:`ConfigError` naming the key, the file and the row. ``prefix`` and ``tp``: every
    row's when the table has no such column."""
    opts = settings(cfg)
    if opts is None:
        return None
    path: Path = opts["path"]
    frame = _read(path)
    if len(frame) == 0:
        raise ConfigError(f"measured.path: {path} has no rows")
    columns = {"tokens": opts["tokens"], "time": opts["time"]}
    columns.update({key: str(opts[key]) for key in ("prefix", "tp") if opts[key]})
    for key, column in columns.items():
        if column not in frame.columns:
            raise ConfigError(
                f"measured.{key}: column {column!r} is not in {path} "
                f"(columns: {', '.join(map(str, frame.columns))})"
            )
    tokens = _integers(frame[columns["tokens"]], "tokens", path, low=1)
    rows = len(tokens)
    prefixes = (
        _integers(frame[columns["prefix"]], "prefix", path, low=0)
        if "prefix" in columns
        else np.full(rows, prefix, dtype=np.int64)
    )
    tps = (
        _integers(frame[columns["tp"]], "tp", path, low=1)
        if "tp" in columns
        else np.full(rows, tp, dtype=np.int64)
    )
    seconds = _times(frame[columns["time"]], path) * UNITS[opts["unit"]]
    covered = np.flatnonzero(prefixes >= tokens)
    if covered.size:
        i = int(covered[0])
        raise ConfigError(
            f"measured.prefix: row {i + 1} of {path} caches {prefixes[i]} of its "
            f"{tokens[i]} prompt tokens (a prefill needs at least one new token)"
        )
    return MeasuredTable(path, tokens, prefixes, tps, seconds)


def _read(path: Path) -> Any:
    """The file as a pandas frame, by its suffix."""
    kind = READERS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(
            f"measured.path: {path}: unknown table format (one of {', '.join(READERS)})"
        )
    if not path.is_file():
        raise ConfigError(f"measured.path: no such file: {path}")
    import pandas as pd

    try:
        if kind == "csv":
            return pd.read_csv(path)
        if kind == "jsonl":
            return pd.read_json(path, lines=True)
        return pd.read_parquet(path)
    except (ValueError, OSError) as err:  # pandas' and pyarrow's parse errors are ValueErrors
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"measured.path: {path} cannot be read as {kind}: {first}") from err


def _integers(column: Any, key: str, path: Path, low: int) -> np.ndarray:
    """``column`` as int64, every value a whole number >= ``low`` (else the first bad row)."""
    values = np.asarray(column, dtype=object)
    out = np.empty(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        number = _real(value)
        if number is None or not number.is_integer() or number < low:
            raise ConfigError(
                f"measured.{key}: row {i + 1} of {path} is {value!r} (a whole number >= {low})"
            )
        out[i] = int(number)
    return out


def _times(column: Any, path: Path) -> np.ndarray:
    """``column`` as float64, every value finite and > 0 (else the first bad row)."""
    values = np.asarray(column, dtype=object)
    out = np.empty(len(values), dtype=np.float64)
    for i, value in enumerate(values):
        number = _real(value)
        if number is None or not (math.isfinite(number) and number > 0):
            raise ConfigError(f"measured.time: row {i + 1} of {path} is {value!r} (a time > 0)")
        out[i] = number
    return out


def _real(value: Any) -> float | None:
    """``value`` as a float when it is a real number (not a bool, a string or NaN)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
        return None
    number = float(value)
    return None if math.isnan(number) else number


def compare(predicted_s: np.ndarray, table: MeasuredTable) -> dict[str, Any]:
    """``prediction.json``'s ``measured`` entry: the rows (milliseconds), the error over all
    of them (:func:`errors`) and per prompt-length band (those with rows)."""
    predicted = np.asarray(predicted_s, dtype=np.float64)
    ratio = predicted / table.seconds
    bands = []
    low = 1
    for high in (*BANDS, None):
        rows = (
            table.tokens >= low if high is None else (table.tokens >= low) & (table.tokens <= high)
        )
        if rows.any():
            label = f"> {low - 1:,}" if high is None else f"{low:,}-{high:,}"
            bands.append({"prompt_tokens": label, "rows": int(rows.sum()), **errors(ratio[rows])})
        low = (high or 0) + 1
    return {
        "path": str(table.path),
        "rows": len(table.tokens),
        "prompt_tokens": table.tokens.tolist(),
        "prefix_tokens": table.prefix.tolist(),
        "tp": table.tp.tolist(),
        "measured_ms": (1000 * table.seconds).tolist(),
        "predicted_ms": (1000 * predicted).tolist(),
        "error": errors(ratio),
        "by_length": bands,
    }


def errors(ratio: np.ndarray) -> dict[str, float]:
    """Of ratios ``predicted / measured``: ``mape`` (mean ``|ratio - 1|``), ``median_abs`` and
    ``p90_abs`` (of ``|ratio - 1|``), ``median_ratio`` and ``mean_signed`` (> 0: predicted too
    slow)."""
    err = ratio - 1.0
    absolute = np.abs(err)
    return {
        "mape": float(absolute.mean()),
        "median_abs": float(np.median(absolute)),
        "p90_abs": float(np.quantile(absolute, 0.9)),
        "median_ratio": float(np.median(ratio)),
        "mean_signed": float(err.mean()),
    }


def lines(measured: dict[str, Any]) -> list[str]:
    """The comparison as :func:`simlab.experiments.predict.table` prints it: all rows, then each band."""
    tokens = measured["prompt_tokens"]
    out = [
        f"measured: {measured['path']}, {_rows(measured['rows'])} (prompts of "
        f"{min(tokens):,}-{max(tokens):,} tokens): {_summary(measured['error'])}"
    ]
    for band in measured["by_length"]:
        out.append(
            f"  prompts of {band['prompt_tokens']} tokens, {_rows(band['rows'])}: {_summary(band)}"
        )
    return out


def _rows(n: int) -> str:
    return f"{n:,} row" if n == 1 else f"{n:,} rows"


def _summary(e: dict[str, float]) -> str:
    return (
        f"MAPE {100 * e['mape']:.1f}%, |error| median {100 * e['median_abs']:.1f}% / "
        f"P90 {100 * e['p90_abs']:.1f}%, predicted / measured median {e['median_ratio']:.3f}"
    )
