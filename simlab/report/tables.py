"""The summary table: per policy (a run) or per point and policy (a sweep).

The table builders return the DataFrame of raw values taken from ``summary.json`` /
``points.parquet`` (what the tests compare); rendering only formats them.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.table import Table
from matplotlib.ticker import PercentFormatter
from matplotlib.transforms import Bbox

from simlab.report.describe import short_names
from simlab.report.load import RunResults, SweepResults, metric
from simlab.report.style import blank_page, chunks, fmt_value


@dataclass(frozen=True)
class Column:
    key: str  # summary metric
    label: str
    fmt: Callable[[float], str]
    text: bool = False  # a word (the load verdict), not a number


def _pct(v: float) -> str:
    return f"{100 * v:.2f}%"


def _ms(v: float) -> str:
    return f"{1000 * v:,.1f}"


def _num(v: float) -> str:
    return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"


def _pflop(v: float) -> str:
    return f"{v / 1e15:,.3g}"


COLUMNS = (
    Column("requests", "Requests", lambda v: f"{v:,.0f}"),
    Column("token_hit_rate", "Token hit\nrate", _pct),
    Column("request_hit_rate", "Request hit\nrate", _pct),
    Column("flops_saved_ratio", "FLOPs saved\n(share)", _pct),
    Column("flops_saved", "FLOPs saved\n(PFLOP)", _pflop),
    Column("hit_vs_clairvoyant", "Hit rate /\nclairvoyant", _pct),
    Column("ttft_p5", "TTFT P5\n(ms)", _ms),
    Column("ttft_p50", "TTFT P50\n(ms)", _ms),
    Column("ttft_p95", "TTFT P95\n(ms)", _ms),
    Column("throughput_rps", "Throughput\n(req/s)", _num),
    Column("throughput_tps", "Throughput\n(tok/s)", _num),
    Column("load", "Load", str, text=True),
)
TIMED_KEYS = ("ttft_p5", "ttft_p50", "ttft_p95", "throughput_rps", "throughput_tps", "load")
ROWS_PER_PAGE = 20
USABLE_HEIGHT = 6.9  # inches of a page between title and caption
NA = "n/a"


def run_table(run: RunResults) -> pd.DataFrame:
    """One row per policy (index), one column per :data:`COLUMNS` key; NaN where absent."""
    rows = {p: _row(run.summary["policies"][p]) for p in run.policies}
    return pd.DataFrame.from_dict(rows, orient="index")[[c.key for c in COLUMNS]]


def _row(metrics: dict[str, Any]) -> dict[str, Any]:
    """A policy's :data:`COLUMNS` values: numbers as floats (NaN where absent), words as
    they are (None where absent)."""
    return {c.key: metrics.get(c.key) if c.text else metric(metrics, c.key) for c in COLUMNS}


def sweep_table(sweep: SweepResults) -> pd.DataFrame:
    """``points.parquet`` rows (point, swept keys, policy, metrics), ordered by point and policy."""
    frame = sweep.points.copy()
    for col in COLUMNS:
        if col.key not in frame.columns:
            frame[col.key] = None if col.text else math.nan
    order = {p: i for i, p in enumerate(sweep.policies)}
    frame = frame.sort_values(
        ["point", "policy"], key=lambda s: s.map(order) if s.name == "policy" else s
    )
    return frame[["point", *sweep.keys, "policy", *(c.key for c in COLUMNS)]].reset_index(drop=True)


def format_cell(col: Column, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NA
    return str(value) if col.text else col.fmt(float(value))


def draw_table(
    ax: Axes, frame: pd.DataFrame, label_columns: Sequence[str], colours: dict[str, str]
) -> None:
    """``frame``'s label columns as they are, metric columns formatted; filling ``ax`` (size it
    with :func:`table_height`)."""
    labels = short_names([c for c in label_columns if c not in ("point", "policy")])
    header = [labels.get(c, c) for c in label_columns] + [c.label for c in COLUMNS]
    cells = [
        [fmt_value(frame.at[r, c]) for c in label_columns]
        + [format_cell(col, frame.at[r, col.key]) for col in COLUMNS]
        for r in frame.index
    ]
    chars = [
        max([len(line) for line in h.splitlines()] + [len(row[i]) for row in cells] + [5])
        for i, h in enumerate(header)
    ]
    widths = 1.15 * np.array(chars, dtype=float) + 2  # bold headers and policy names are wider
    table = ax.table(
        cellText=cells,
        colLabels=header,
        colWidths=list(widths / widths.sum()),
        cellLoc="center",
        bbox=Bbox.from_bounds(0, 0, 1, 1),
    )
    table.auto_set_font_size(False)
    table.set_fontsize(9.5)
    _style_table(table, frame, label_columns, colours)


def table_height(rows: int) -> float:
    """Inches for a table of ``rows`` rows plus its two-line header."""
    return 0.5 + 0.26 * rows


def _style_table(
    table: Table, frame: pd.DataFrame, label_columns: Sequence[str], colours: dict[str, str]
) -> None:
    ncols = len(label_columns) + len(COLUMNS)
    for c in range(ncols):
        table[0, c].set_facecolor("#E8E8E8")
        table[0, c].set_text_props(fontweight="bold", fontsize=8)  # two-line labels fit
    policy_col = list(label_columns).index("policy")
    for r, policy in enumerate(frame["policy"], start=1):
        colour = colours.get(str(policy), "black")
        table[r, policy_col].set_text_props(color=colour, fontweight="bold")
        if r % 2 == 0:
            for c in range(ncols):
                table[r, c].set_facecolor("#F5F5F5")


def draw_notes(ax: Axes, notes: Sequence[str], width: int = 80) -> None:
    ax.set_axis_off()
    lines = []
    for note in notes:
        indent = len(note) - len(note.lstrip())
        lines += textwrap.wrap(note, width, subsequent_indent=" " * (indent + 2)) or [""]
    ax.text(0, 1, "\n".join(lines), va="top", ha="left", fontsize=9.5, transform=ax.transAxes)


def draw_glance(
    ax: Axes,
    table: pd.DataFrame,
    colours: dict[str, str],
    bounds: dict[str, float] | None = None,
) -> None:
    """Grouped bars: token hit rate, request hit rate and FLOPs saved per policy (%); the
    token-hit-rate bounds (infinite cache, clairvoyant) as dashed lines over their group."""
    keys = [
        ("token_hit_rate", "Token hit rate"),
        ("request_hit_rate", "Request hit rate"),
        ("flops_saved_ratio", "FLOPs saved"),
    ]
    width = 0.8 / len(table)
    for i, policy in enumerate(table.index):
        xs = np.arange(len(keys)) + (i - (len(table) - 1) / 2) * width
        values = [100 * table.at[policy, k] for k, _ in keys]
        bars = ax.bar(
            xs,
            values,
            width * 0.95,
            color=colours[policy],
            label=policy,
            edgecolor="black",
            linewidth=0.5,
        )
        ax.bar_label(bars, fmt="%.1f", fontsize=8, padding=2)
    for name, rate in (bounds or {}).items():
        ax.hlines(100 * rate, -0.45, 0.45, colors="black", linestyles="--", linewidth=1.0)
        ax.annotate(
            f"{name} bound {100 * rate:.1f}%",
            (0.45, 100 * rate),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=7.5,
        )
    ax.set_xticks(range(len(keys)), [label for _, label in keys])
    ax.set_ylim(0, 112)
    ax.set_yticks(range(0, 101, 20))
    ax.yaxis.set_major_formatter(PercentFormatter())
    ax.set_ylabel("Share of input tokens / requests / prefill FLOPs (%)")
    ax.grid(axis="x", visible=False)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)


def run_summary_page(
    title: str,
    caption: str,
    table: pd.DataFrame,
    notes: Sequence[str],
    colours: dict[str, str],
    bounds: dict[str, float] | None = None,
) -> Figure:
    """The run's first page: the table on top; notes and an at-a-glance bar chart below."""
    fig = blank_page(title, caption)
    height = table_height(len(table))
    axes = fig.subplot_mosaic(
        [["table", "table"], ["notes", "glance"]],
        height_ratios=[height, max(USABLE_HEIGHT - height, 3.0)],
        width_ratios=[1, 1.25],
    )
    axes["table"].set_axis_off()
    draw_table(axes["table"], table.rename_axis("policy").reset_index(), ["policy"], colours)
    draw_notes(axes["notes"], notes, width=72)
    draw_glance(axes["glance"], table, colours, bounds)
    return fig


def sweep_summary_pages(
    title: str,
    caption: str,
    frame: pd.DataFrame,
    label_columns: Sequence[str],
    notes: Sequence[str],
    colours: dict[str, str],
) -> list[Figure]:
    """Table pages of ``ROWS_PER_PAGE`` rows; ``notes`` under the table on the first page."""
    pages = []
    row_chunks = chunks(list(frame.index), ROWS_PER_PAGE)
    for i, rows in enumerate(row_chunks):
        page_title = title if i == 0 else f"{title} (continued, {i + 1}/{len(row_chunks)})"
        fig = blank_page(page_title, caption)
        height = table_height(len(rows))
        notes_height = 1.4 if i == 0 and notes else 0.0
        rest = max(USABLE_HEIGHT - height - notes_height, 0.05)
        axes = fig.subplots(3, 1, height_ratios=[height, notes_height or 0.01, rest])
        draw_notes(axes[1], notes if i == 0 else [], width=150)
        axes[2].set_axis_off()
        axes[0].set_axis_off()
        draw_table(axes[0], frame.loc[list(rows)], label_columns, colours)
        pages.append(fig)
    return pages


def table_notes(frame: pd.DataFrame, engine: str, hit_rule: str | None = None) -> list[str]:
    """The table's definitions; ``hit_rule``: what counts as a request hit (summary.json's
    ``request_hit_rule``; results without one counted any hit)."""
    counted = f"reusing {hit_rule}" if hit_rule else "with any hit"
    notes = [
        "Token hit rate = tokens whose prefill was skipped / all input tokens; request hit rate = "
        f"share of requests {counted}; FLOPs saved = prefill FLOPs skipped (share of all "
        "prefill FLOPs, and PFLOP = 1e15 FLOPs)."
    ]
    if frame[list(TIMED_KEYS)].isna().any().any():
        notes.append(
            f"{NA}: not in the results; TTFT and throughput come from the timed engine "
            f"(engine here: {engine})."
        )
    if frame["load"].notna().any():
        notes.append(
            "Load: ok; queueing = the median request waits longer than it is served; "
            "saturated = its latencies measure a backlog (summary.json's saturation says why)."
        )
    return notes


def trace_note(trace: dict) -> str:
    """One line of trace statistics from summary.json's ``trace``."""
    parts = [f"{trace.get('requests', '?')} requests", f"{trace.get('sessions', '?')} sessions"]
    if "input_tokens" in trace:
        parts.append(f"{trace['input_tokens']:,} input tokens")
    if "input_len_p50" in trace:
        parts.append(
            f"input length P50 {trace['input_len_p50']:,.0f}, P95 {trace.get('input_len_p95', 0):,.0f}"
        )
    if "output_tokens" in trace:
        parts.append(f"{trace['output_tokens']:,} output tokens")
    return f"Trace {trace.get('name', '?')}: " + ", ".join(parts) + "."
