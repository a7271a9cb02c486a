"""The geometry study's page: for one model, trace and GPU memory, which engine settings give
the most reuse and the lowest TTFT (``+sweep=geometry``, ``+sweep=geometry_sglang``).

One bar per sweep point and policy, labelled by its swept settings and the geometry the engine
took (``summary.json``'s ``engine_geometry``: vLLM's forced block, SGLang's Mamba pool),
sorted by token hit rate; beside it the TTFT P50 and P95 of the timed engine (a saturated point's
label says so: its TTFTs measure the backlog). The best point of each panel is marked.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from simlab.report.describe import point_label
from simlab.report.load import SweepResults
from simlab.report.run_pages import SkipPage, Style
from simlab.report.style import new_page

GEOMETRY = "Engine geometry"
#: bars on one page (the rest are left to the points table)
MAX_BARS = 24


def geometry_note(text: object) -> str:
    """The geometry a point ran with, in a few words (``engine_geometry`` as a JSON string)."""
    if not isinstance(text, str):
        return ""
    geo = json.loads(text)
    parts = []
    if geo.get("block_size", 1) > 1:
        parts.append(f"block {geo['block_size']}")
    if "mamba_cache_mode" in geo:
        parts.append(geo["mamba_cache_mode"])
    if "mamba_radix_cache_strategy" in geo:
        parts.append(geo["mamba_radix_cache_strategy"])
    pool = geo.get("mamba_pool", {})
    if "slots" in pool:
        parts.append(f"{pool['slots']} state slots")
    if "ssm_state_dtype" in geo:
        parts.append(f"SSM {geo['ssm_state_dtype']}")
    return ", ".join(parts)


def saturated(flag: object) -> bool:
    """A point's ``saturated`` column (missing or NaN for a replay)."""
    return isinstance(flag, bool | np.bool_) and bool(flag)


def study_rows(sweep: SweepResults) -> pd.DataFrame:
    """Per point and policy: its label, token hit rate and TTFTs, best hit rate first."""
    points = sweep.points
    if "engine_geometry" not in points or points["engine_geometry"].isna().all():
        raise SkipPage("no point states its engine geometry (engine_geometry: vllm, sglang)")
    swept = [k for k in sweep.swept_keys if k != "policy"]
    labels = [
        f"{row['policy']}: {point_label({k: row[k] for k in swept}, ', ')} "
        f"[{geometry_note(row['engine_geometry'])}]"
        + (" (saturated)" if saturated(row.get("saturated")) else "")
        for _, row in points.iterrows()
    ]
    rows = pd.DataFrame({"label": labels, "hit": points["token_hit_rate"] * 100})
    for name in ("ttft_p50", "ttft_p95"):
        rows[name] = points[name] * 1000 if name in points else math.nan
    return rows.sort_values("hit", ascending=True, kind="stable").tail(MAX_BARS)


def draw_bars(ax: Axes, rows: pd.DataFrame, column: str, best: str, xlabel: str) -> None:
    """Horizontal bars of ``column``, the ``best`` (``max`` or ``min``) one marked."""
    values = rows[column].to_numpy(dtype=float)
    y = range(len(rows))
    target = values.max() if best == "max" else values[values == values].min()
    colours = ["tab:green" if v == target else "tab:blue" for v in values]
    ax.barh(list(y), values, color=colours)
    for i, v in zip(y, values, strict=True):
        if math.isfinite(v):
            ax.annotate(f"{v:.1f}", (v, i), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=7)  # fmt: skip
    ax.set_xlabel(xlabel)


def geometry_pages(sweep: SweepResults, style: Style) -> list[Figure]:
    """The study's page (skipped for a sweep whose points state no engine geometry)."""
    rows = study_rows(sweep)
    timed = rows["ttft_p50"].notna().any()
    title = "Engine settings: reuse and TTFT (best in green)"
    fig, axes = new_page(title, style.caption, 1, 3 if timed else 1, sharey=True)
    draw_bars(axes[0, 0], rows, "hit", "max", "Token hit rate (%)")
    axes[0, 0].set_yticks(range(len(rows)), rows["label"], fontsize=7)
    if timed:
        draw_bars(axes[0, 1], rows, "ttft_p50", "min", "TTFT P50 (ms)")
        draw_bars(axes[0, 2], rows, "ttft_p95", "min", "TTFT P95 (ms)")
    return [fig]
