"""The comparison: one row per published number, simlab's value and verdict per mode."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from simlab.experiments.paper.claims import published
from simlab.experiments.paper.modes import MODES, Mode
from simlab.experiments.paper.results import ModeResults

UNITS: dict[str, Callable[[float], str]] = {
    "%": lambda v: f"{v:.2f}%",
    "x": lambda v: f"{v:.2f}x",
    "win": lambda v: f"{v:+.1f}%",
    "pp": lambda v: f"{v:+.1f} pp",
}
NOT_RUN = "not run"


def fmt_number(value: float | None, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return NOT_RUN
    return UNITS[unit](value)


def fmt_holds(holds: bool | None) -> str:
    return "-" if holds is None else ("yes" if holds else "NO")


def comparison(results: Sequence[ModeResults]) -> pd.DataFrame:
    """One row per published number: the paper's value, simlab's per mode, and whether the
    claim's direction holds per mode (True/False/None; None: not run)."""
    records = []
    for row in published():
        record: dict[str, Any] = {
            "figure": row.figure,
            "quantity": row.quantity,
            "setting": row.setting,
            "unit": row.unit,
            "paper": row.paper,
            "claim": row.claim,
        }
        for res in results:
            record[f"simlab_{res.mode.name}"] = row.value(res)
            record[f"holds_{res.mode.name}"] = row.holds(res)
        records.append(record)
    return pd.DataFrame.from_records(records)


def markdown_table(table: pd.DataFrame) -> list[str]:
    """The comparison as Markdown table lines."""
    head = ["Figure", "Quantity", "Setting", "Paper"]
    head += [f"simlab {m.label}" for m in MODES] + ["Claim", "Holds (paper mode / default)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table.itertuples(index=False):
        cells = [row.figure, row.quantity, row.setting, UNITS[row.unit](row.paper)]
        cells += [fmt_number(getattr(row, f"simlab_{m.name}"), row.unit) for m in MODES]
        holds = " / ".join(fmt_holds(getattr(row, f"holds_{m.name}")) for m in MODES)
        lines.append("| " + " | ".join([*cells, row.claim, holds]) + " |")
    return lines


def tally(table: pd.DataFrame, mode: Mode) -> str:
    """``N of M claims hold`` for one mode (rows not run left out)."""
    known = [h for h in table[f"holds_{mode.name}"] if h is not None]
    return f"{sum(bool(h) for h in known)} of {len(known)}"
