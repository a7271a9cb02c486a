"""``python -m bench.identity compare --accept-added``: the parquet columns and ``summary.json``
keys that only the second directory's outputs have (a change that adds outputs on purpose) are
listed once each, with how many cases have them, instead of counted as differences."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

ONLY_IN_B = ": only in B"


def is_added(diff: str) -> bool:
    """Whether a ``summary.json`` difference is a key only B has."""
    return diff.endswith(ONLY_IN_B)


def without_added(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """B without the columns only it has, when the others are A's in A's order (else B)."""
    rest = [c for c in b.columns if c in a.columns]
    return b[rest] if rest == list(a.columns) else b


def added_columns(path_a: Path, path_b: Path) -> list[str]:
    """Columns of B's parquet file that A's lacks."""
    import pyarrow.parquet as pq

    known = set(pq.read_schema(path_a).names)
    return [c for c in pq.read_schema(path_b).names if c not in known]


def case_added(dir_a: Path, dir_b: Path, files: tuple[str, ...], summary: list[str]) -> list[str]:
    """What one case's outputs in B add: columns of its parquet ``files``, and the keys among
    ``summary`` (the case's ``summary.json`` differences)."""
    if not all((d / f).is_file() for d in (dir_a, dir_b) for f in files):
        return []
    columns = [f"{f}: column {c}" for f in files for c in added_columns(dir_a / f, dir_b / f)]
    return columns + [d.removesuffix(ONLY_IN_B) for d in summary if is_added(d)]


def added_lines(cases: list[list[str]]) -> list[str]:
    """One line per added item over all cases (a policy's key under ``<policy>``)."""
    counts: dict[str, int] = {}
    for items in cases:
        for item in items:
            generic = re.sub(r"^(summary\.json policies)\.[^.]+\.", r"\1.<policy>.", item)
            counts[generic] = counts.get(generic, 0) + 1
    return [f"added (accepted): {item} ({n} case entries)" for item, n in sorted(counts.items())]


def print_added(
    dir_a: Path,
    dir_b: Path,
    results: dict[str, list[str]],
    files: tuple[str, ...],
    summary_diffs: Callable[[Path, Path], list[str]],
) -> None:
    """Print what B adds over the compared cases with every file on both sides (``results``:
    their differences; ``summary_diffs``: the differences of two ``summary.json`` files)."""
    cases = [n for n, diffs in results.items() if not any("missing" in d for d in diffs)]
    added = [
        case_added(a, b, files, summary_diffs(a / "summary.json", b / "summary.json"))
        for a, b in ((dir_a / n, dir_b / n) for n in cases)
    ]
    for line in added_lines(added):
        print(line)
