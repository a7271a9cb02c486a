"""The reuse breakdown page: per policy, a waterfall from all input tokens through ideal reuse
down to the hit, one step per part lost (``summary.json``'s ``reuse_breakdown``,
:mod:`simlab.run.breakdown`)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from simlab.report.load import RunResults
from simlab.report.run_pages import SkipPage, Style
from simlab.report.style import hide_unused, new_page

BREAKDOWN = "Where the lost hits went"
#: the parts lost between ideal reuse and the hit, in the order of attribution
LOSSES = ("granularity", "placement", "capacity", "concurrency", "routing")
PARTS = ("hit", "compulsory", *LOSSES)
COLOURS = {
    "input": "#9e9e9e",
    "compulsory": "#bdbdbd",
    "ideal": "#5c6bc0",
    "granularity": "#ffb74d",
    "placement": "#e57373",
    "capacity": "#ba68c8",
    "concurrency": "#4db6ac",
    "routing": "#a1887f",
    "hit": "#43a047",
}
PER_PAGE = 4


def breakdown_table(run: RunResults) -> pd.DataFrame:
    """Per policy (rows, the run's order), each part as a share of all input tokens."""
    policies = run.summary["policies"]
    rows = {
        p: policies[p]["reuse_breakdown"]
        for p in run.policies
        if policies[p].get("reuse_breakdown")
    }
    if not rows:
        raise SkipPage(
            "no reuse breakdown in summary.json (reuse_breakdown=false, or an older run)"
        )
    return pd.DataFrame.from_dict(rows, orient="index")[list(PARTS)]


def waterfall_steps(shares: dict[str, float]) -> list[tuple[str, float, float]]:
    """The waterfall's bars as (label, bottom, height): all input, the compulsory step down to
    ideal reuse, ideal reuse, a step down per part lost, and the hit."""
    ideal = 1.0 - shares["compulsory"]
    steps = [
        ("input", 0.0, 1.0),
        ("compulsory", ideal, shares["compulsory"]),
        ("ideal", 0.0, ideal),
    ]
    level = ideal
    for part in LOSSES:
        level -= shares[part]
        steps.append((part, level, shares[part]))
    return [*steps, ("hit", 0.0, shares["hit"])]


def draw_waterfall(ax: Axes, policy: str, shares: dict[str, float], notes: dict[str, Any]) -> None:
    """One policy's waterfall, each bar labelled with its share of the input."""
    steps = waterfall_steps(shares)
    labels = [label for label, _, _ in steps]
    for x, (label, bottom, height) in enumerate(steps):
        ax.bar(x, height, bottom=bottom, color=COLOURS[label], edgecolor="black", linewidth=0.5)
        ax.text(
            x, bottom + height + 0.01, f"{100 * height:.1f}%", ha="center", va="bottom", fontsize=7
        )
    ax.set_xticks(range(len(labels)), labels, rotation=40, ha="right", fontsize=8)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("share of input tokens")
    grid = notes.get("grid_tokens")
    extra = [f"grid {grid} tok"] if grid else []
    if notes.get("clamped"):
        extra.append(f"clamped {100 * notes['clamped']:.1f}%")
    extra += [f"{part} not computed" for part in notes.get("uncomputed") or {}]
    ax.set_title(f"{policy} ({', '.join(extra)})" if extra else policy, fontsize=10)


def breakdown_pages(run: RunResults, style: Style) -> list[Figure]:
    """The waterfall of every policy, :data:`PER_PAGE` to a page."""
    table = breakdown_table(run)
    policies = run.summary["policies"]
    names = list(table.index)
    pages = []
    for start in range(0, len(names), PER_PAGE):
        chunk = names[start : start + PER_PAGE]
        cols = 1 if len(chunk) == 1 else 2
        fig, axes = new_page(BREAKDOWN, style.caption, (len(chunk) + cols - 1) // cols, cols)
        for ax, name in zip(axes.flat, chunk, strict=False):
            notes = policies[name].get("reuse_breakdown_notes") or {}
            draw_waterfall(ax, name, table.loc[name].to_dict(), notes)
        hide_unused(axes, len(chunk))
        pages.append(fig)
    return pages
