"""``paper.pdf``: the comparison table, then Figs. 7-8, 10a and 11-13 as plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simlab.experiments.paper.claims import NAMES, published
from simlab.experiments.paper.comparison import markdown_table
from simlab.experiments.paper.metrics import BIN_TOKENS, SPLIT_TOKENS, length_diff
from simlab.experiments.paper.modes import MODES
from simlab.experiments.paper.plan import (
    FIG11_GB,
    FIG12A_LAYERS,
    FIG12B_DIM,
    FIG13A_SPS,
    FIG13B_ART,
    THREE,
    TWO,
    Plan,
    Value,
    fmt_value,
)
from simlab.experiments.paper.results import ModeResults
from simlab.util.provenance import code_version


def pdf_pages(plan: Plan, results: Sequence[ModeResults], table: pd.DataFrame) -> list[Any]:
    """The table, then Figs. 7-8 (box plots), Fig. 10a (bars) and Figs. 11-13 (lines)."""
    from simlab.report.style import chunks

    caption = (
        f"simlab.experiments.paper, {plan.name} plan; the traces are not the authors' (absolute values "
        f"differ); code version {code_version()}"
    )
    parts = chunks(list(table.index), 28)
    pages = [table_page(table.loc[list(part)], caption) for part in parts]
    return [
        *pages,
        boxes_page(results, caption),
        diff_page(results, caption),
        lines_page(results, caption),
    ]


def table_page(part: pd.DataFrame, caption: str) -> Any:
    """One page of the comparison table (the rows of ``part``), columns as wide as their text."""
    from matplotlib.transforms import Bbox

    from simlab.report.style import new_page

    fig, axes = new_page("Marconi paper vs simlab: published numbers", caption)
    ax = axes[0, 0]
    ax.set_axis_off()
    cells = [line.strip("| ").split(" | ") for line in markdown_table(part)[2:]]
    header = ["Figure", "Quantity", "Setting", "Paper", "paper mode", "default", "Claim", "Holds"]
    chars = np.array([max(len(h), *(len(r[i]) for r in cells)) + 3 for i, h in enumerate(header)])
    height = min(1.0, 0.035 * (len(cells) + 1))
    tbl = ax.table(
        cellText=cells,
        colLabels=header,
        colWidths=list(chars / chars.sum()),
        cellLoc="left",
        bbox=Bbox.from_bounds(0, 1 - height, 1, height),
    )
    tbl.auto_set_font_size(False)
    tbl.set_fontsize(6.5)
    for (row, col), cell in tbl.get_celld().items():
        if row == 0:
            cell.set_text_props(fontweight="bold")
        elif col == len(header) - 1 and "NO" in cell.get_text().get_text():
            cell.set_text_props(color="#D55E00", fontweight="bold")
    return fig


def boxes_page(results: Sequence[ModeResults], caption: str) -> Any:
    """Figs. 7-8: per trace, the token hit rates over its configs per policy and mode."""
    from simlab.report.style import new_page, palette

    colours = palette(THREE)
    fig, axes = new_page("Figs. 7-8: token hit rate over each trace's configs", caption, 1, 3)
    for ax, trace in zip(axes[0], ("lmsys", "sharegpt", "swebench"), strict=True):
        data, labels, tints = [], [], []
        for res in results:
            table = res.per_point(f"fig7_8_{trace}")
            for policy in THREE:
                data.append(100 * table[policy].to_numpy() if policy in table else np.array([]))
                labels.append(f"{NAMES[policy]}\n{res.mode.name}")
                tints.append(colours[policy])
        box = ax.boxplot(data, whis=(5, 95), patch_artist=True, showfliers=False)
        for patch, tint in zip(box["boxes"], tints, strict=True):
            patch.set_facecolor(tint)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
        ax.set_title(trace)
        ax.set_ylabel("token hit rate (%)")
    return fig


def diff_page(results: Sequence[ModeResults], caption: str) -> Any:
    """Fig. 10a: Marconi - SGLang+ mean per-request hit rate per 1K-token input bin."""
    from simlab.report.style import new_page

    fig, axes = new_page("Fig. 10a: Marconi - SGLang+ by input length", caption)
    ax = axes[0, 0]
    width = BIN_TOKENS * 0.4
    for k, res in enumerate(results):
        diff = length_diff(res, "fig10", "marconi", "sglang_plus")
        ax.bar(diff.index + width * (k + 0.5), diff.to_numpy(), width, label=res.mode.label)
    ax.axvline(SPLIT_TOKENS, color="grey", linestyle=":")
    ax.set_xlabel("input length (tokens), 1K bins")
    ax.set_ylabel("hit rate difference (pp)")
    ax.legend()
    return fig


LINE_FIGURES: tuple[tuple[str, str, tuple[Value, ...], tuple[str, ...]], ...] = (
    ("fig11", "Fig. 11: cache size (GB)", FIG11_GB, TWO),
    ("fig12a", "Fig. 12a: Attention:SSM", FIG12A_LAYERS, THREE),
    ("fig12b", "Fig. 12b: SSM state dimension", FIG12B_DIM, THREE),
    ("fig13a", "Fig. 13a: sessions/s", FIG13A_SPS, TWO),
    ("fig13b", "Fig. 13b: response time (s)", FIG13B_ART, TWO),
)


def lines_page(results: Sequence[ModeResults], caption: str) -> Any:
    """Figs. 11-13: published series (dotted) beside simlab's paper mode (solid) and default
    semantics (dashed), one colour per policy."""
    from simlab.report.style import new_page, palette

    colours = palette(THREE)
    paper = paper_series()
    fig, axes = new_page("Figs. 11-13: token hit rate (%)", caption, 2, 3)
    for ax, (study, title, xs, policies) in zip(axes.flat, LINE_FIGURES, strict=False):
        at = range(len(xs))
        for policy in policies:
            style = {"color": colours[policy]}
            ax.plot(at, paper[study].get(policy, [np.nan] * len(xs)), ":o", **style)
            for res, line in zip(results, ("-", "--"), strict=False):
                ys = [res.hit(study, policy, i) for i in at]
                ax.plot(at, [np.nan if y is None else y for y in ys], line, **style)
        ax.set_xticks(list(at), [fmt_value(x).replace("to", ":") for x in xs])
        ax.set_title(title)
    legend_page(axes.flat[-1], colours)
    return fig


def legend_page(ax: Any, colours: dict[str, str]) -> None:
    """The line styles (the paper, simlab's two modes) and the policies' colours."""
    from matplotlib.lines import Line2D

    ax.set_axis_off()
    handles = [Line2D([], [], color=colours[p], linewidth=4, label=NAMES[p]) for p in THREE]
    handles += [
        Line2D([], [], color="black", linestyle=":", marker="o", label="the paper (published)"),
        Line2D([], [], color="black", linestyle="-", label=f"simlab {MODES[0].label}"),
        Line2D([], [], color="black", linestyle="--", label=f"simlab {MODES[1].label}"),
    ]
    ax.legend(handles=handles, loc="center", frameon=False)


def paper_series() -> dict[str, dict[str, list[float]]]:
    """The published series of Figs. 11-13 by study and policy (from :func:`published`)."""
    series: dict[str, dict[str, list[float]]] = {}
    keys = {"Fig. 11": "fig11", "Fig. 12a": "fig12a", "Fig. 12b": "fig12b"}
    keys |= {"Fig. 13a": "fig13a", "Fig. 13b": "fig13b"}
    for row in published():
        study = keys.get(row.figure)
        policy = next((p for p, n in NAMES.items() if row.quantity == f"{n} token hit rate"), None)
        if study is not None and policy is not None:
            series.setdefault(study, {}).setdefault(policy, []).append(row.paper)
    return series


def write_pdf(path: Path, pages: Sequence[Any]) -> None:
    import matplotlib

    from simlab.report.build import write_pdf as write
    from simlab.report.style import RC

    with matplotlib.rc_context(RC):
        write(path, pages, title="simlab vs the Marconi paper")
