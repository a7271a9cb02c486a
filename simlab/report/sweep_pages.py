"""Figures of a sweep: metric vs each swept key (contention curve over ``cache.size_gb``, alpha
sensitivity over ``*.alpha``, any other key), hit-rate boxes across points, and per-point small
multiples of the run figures."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import textwrap
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import PercentFormatter

from simlab.report.describe import (
    cost_model_note,
    latency_error_note,
    point_label,
    unique_in_order,
)
from simlab.report.load import RunResults, SweepResults
from simlab.report.run_pages import (
    BOX_NOTE,
    SkipPage,
    Style,
    draw_hit_boxes,
    draw_hit_cdf,
    draw_hit_diff,
    draw_ttft_cdf,
)
from simlab.report.style import (
    chunks,
    fmt_value,
    grid_shape,
    hide_unused,
    new_page,
    policy_legend,
)

CACHE_KEY = "cache.size_gb"
SEED_KEY = "seed"  # swept seeds are repetitions: a band over them, not a facet or a page
POINTS_PER_BOX_PAGE = 8
PANELS_PER_PAGE = 6
FACETS_PER_PAGE = 6


def is_alpha(key: str) -> bool:
    return key.rsplit(".", 1)[-1] == "alpha"


def key_title(key: str) -> str:
    if key == CACHE_KEY:
        return "Token hit rate vs cache size (contention curve)"
    if is_alpha(key):
        return f"Alpha sensitivity ({key})"
    return f"Sweep over {key}"


def key_axis_label(key: str) -> str:
    """Short x label with units (the page title names the full key)."""
    short = key.rsplit(".", 1)[-1]
    if key == CACHE_KEY:
        return "Cache size (GB)"
    if is_alpha(key):
        return "alpha (0 = recency only)"
    if short == "session_rate":
        return "Session arrival rate (sessions/s)"
    if short == "think_time_mean":
        return "Mean think time (s)"
    return short


# --- metric vs one swept key --------------------------------------------------------------------


def metric_panels(points: pd.DataFrame) -> list[tuple[str, str, float]]:
    """(metric, y label, scale) rows: token hit rate always, TTFT P95 when the timed engine ran."""
    panels = [("token_hit_rate", "Token hit rate (%)", 100.0)]
    if "ttft_p95" in points and points["ttft_p95"].notna().any():
        panels.append(("ttft_p95", "TTFT P95 (ms)", 1000.0))
    return panels


def facets(sweep: SweepResults, key: str) -> list[dict[str, object]]:
    """Combinations of the other swept keys (seeds excepted: they are averaged)."""
    others = [k for k in sweep.swept_keys if k not in (key, SEED_KEY)]
    values = [unique_in_order(sweep.points[k]) for k in others]
    return [dict(zip(others, combo, strict=True)) for combo in itertools.product(*values)]


def select(points: pd.DataFrame, fixed: dict[str, object]) -> pd.DataFrame:
    mask = np.ones(len(points), dtype=bool)
    for k, v in fixed.items():
        mask &= (points[k] == v).to_numpy()
    return points[mask]


def x_positions(xs: Sequence[object], key: str) -> tuple[dict[object, float], bool]:
    """Where each value of ``key`` goes on the x axis, and whether the axis is logarithmic:
    cache sizes (finite, positive, spanning more than 3x) at their values on a log axis, any
    other key as equally spaced categories (like the paper's Figs. 11-13)."""
    values = [float(v) for v in xs if isinstance(v, int | float | np.number)]
    if (
        key == CACHE_KEY
        and len(values) == len(xs) > 1
        and all(math.isfinite(v) and v > 0 for v in values)
        and max(values) / min(values) > 3
    ):
        return {v: float(v) for v in xs}, True  # type: ignore[arg-type]
    return {v: float(i) for i, v in enumerate(xs)}, False


def _mean_and_spread(rows: pd.DataFrame, key: str, name: str, scale: float) -> pd.DataFrame:
    """Per value of ``key``: the mean of ``name`` over seeds and its standard deviation (0
    for a single seed)."""
    grouped = rows.groupby(key, sort=False, dropna=False)[name]
    out = pd.DataFrame({"mean": grouped.mean() * scale, "sd": grouped.std(ddof=1) * scale})
    return out.fillna({"sd": 0.0})


def draw_vs_key(
    ax: Axes,
    points: pd.DataFrame,
    key: str,
    panel: tuple[str, str, float],
    policies: Sequence[str],
    style: Style,
) -> None:
    """One line per policy over the key's values (a log axis for cache sizes), averaged over
    swept seeds with a +-1 standard deviation band; the hit-rate bounds (infinite cache,
    clairvoyant) as grey lines; the relative gain of the diff pair's A over B above A's
    markers."""
    name, ylabel, scale = panel
    xs = unique_in_order(points[key]) if len(points) else []
    pos, log_x = x_positions(xs, key)
    numeric = all(isinstance(v, int | float | np.number) for v in xs)
    series: dict[str, dict[object, float]] = {}
    for policy in policies:
        rows = points[points["policy"] == policy]
        if rows.empty or name not in rows:
            continue
        stats = _mean_and_spread(rows, key, name, scale).sort_index(key=lambda i: i.map(pos))
        x = [pos[v] for v in stats.index]
        colour = style.colours[policy]
        ax.plot(
            x, stats["mean"], marker="o", ls="-" if numeric else "none", color=colour, label=policy
        )
        if (stats["sd"] > 0).any():
            lo, hi = stats["mean"] - stats["sd"], stats["mean"] + stats["sd"]
            ax.fill_between(x, lo, hi, color=colour, alpha=0.18, linewidth=0)
        series[policy] = dict(zip(stats.index, stats["mean"], strict=True))
        _mark_points(ax, rows, key, pos, series[policy], name == "token_hit_rate")
    if name == "token_hit_rate":
        _draw_bounds(ax, points, key, pos, scale)
    if style.diff and all(p in series for p in style.diff) and name == "token_hit_rate":
        _annotate_gain(ax, series[style.diff[0]], series[style.diff[1]], pos, style)
    if log_x:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks([pos[v] for v in xs], [fmt_value(v) for v in xs])
    if not log_x:
        ax.set_xlim(-0.4, max(len(xs) - 0.6, 0.4))
    ax.set_xlabel(key_axis_label(key) + (" (log scale)" if log_x else ""))
    ax.set_ylabel(ylabel)
    if name == "token_hit_rate":
        ax.yaxis.set_major_formatter(PercentFormatter())


def _mark_points(
    ax: Axes, rows: pd.DataFrame, key: str, pos: dict, means: dict, alphas: bool
) -> None:
    """A red ring on each point where a run of the policy was saturated (its latencies measure
    a backlog); with ``alphas``, each tuned point's final alpha (``*``: never tuned) beside it."""
    for value, group in rows.groupby(key, sort=False, dropna=False):
        x, y = pos[value], means.get(value)
        if y is None or not math.isfinite(y):
            continue
        if "saturated" in group and group["saturated"].fillna(False).astype(bool).any():
            ax.plot(x, y, "o", ms=11, mfc="none", mec="red", mew=1.3, label="_saturated")
        if alphas and "alpha" in group and group["alpha"].notna().any():
            alpha = json.loads(group["alpha"].dropna().iloc[0])
            mark = "" if alpha["tuned"] else "*"
            ax.annotate(
                f"alpha {alpha['final']:.3g}{mark}",
                (x, y),
                xytext=(4, -10),
                textcoords="offset points",
                fontsize=7,
            )


#: bound -> (line style, label)
BOUND_LINES = {"infinite": ("--", "infinite cache"), "clairvoyant": (":", "clairvoyant")}


def _draw_bounds(
    ax: Axes, points: pd.DataFrame, key: str, pos: dict[object, float], scale: float
) -> None:
    """Each point's bounds, recovered from a policy's ``hit_vs_<bound>`` ratio (the bound =
    token hit rate / ratio), as a grey line over the key's values."""
    for bound, (style, label) in BOUND_LINES.items():
        ratio = f"hit_vs_{bound}"
        if ratio not in points:
            continue
        rows = points[(points[ratio] > 0) & points["token_hit_rate"].notna()]
        if rows.empty:
            continue
        values = (rows["token_hit_rate"] / rows[ratio]).groupby(rows[key], sort=False).mean()
        values = values.sort_index(key=lambda i: i.map(pos))
        ax.plot(
            [pos[v] for v in values.index],
            values.to_numpy() * scale,
            ls=style,
            color="grey",
            lw=1.2,
            label=f"bound: {label}",
        )


def _annotate_gain(ax: Axes, a: dict, b: dict, pos: dict, style: Style) -> None:
    assert style.diff is not None
    for v, ya in a.items():
        yb = b.get(v)
        if yb is None or yb <= 0 or not math.isfinite(ya):
            continue
        ax.annotate(
            f"{round(100 * (ya / yb - 1)) or 0:+d}%",
            (pos[v], ya),
            xytext=(0, 10),
            textcoords="offset points",
            ha="center",
            fontsize=8.5,
            color=style.colours[style.diff[0]],
            fontweight="bold",
        )


def key_pages(sweep: SweepResults, key: str, style: Style) -> list[Figure]:
    """Metric vs ``key``: one panel per metric (rows) for each combination of the other swept
    keys (facets, up to :data:`FACETS_PER_PAGE` per page in rows of three)."""
    panels = metric_panels(sweep.points)
    gain = (
        f"labels: {style.diff[0]}'s relative\ngain over {style.diff[1]} (%)" if style.diff else None
    )
    pages = []
    for chunk in chunks(facets(sweep, key), FACETS_PER_PAGE // len(panels)):
        facet_rows, cols = grid_shape(len(chunk))
        fig, axes = new_page(key_title(key), style.caption, facet_rows * len(panels), cols)
        for i, fixed in enumerate(chunk):
            rows = select(sweep.points, fixed)
            for r, panel in enumerate(panels):
                ax = axes[(i // cols) * len(panels) + r, i % cols]
                if i:
                    ax.sharey(axes[r, 0])
                draw_vs_key(ax, rows, key, panel, sweep.policies, style)
                if r < len(panels) - 1:
                    ax.set_xlabel("")
                if fixed and r == 0:
                    ax.set_title(point_label(fixed, sep=", "))
        for r, (name, _, scale) in enumerate(panels):
            top = float(np.nanmax(sweep.points[name].to_numpy(dtype=float))) * scale
            if name == "token_hit_rate":  # shared by the page's facets: set once, after drawing
                top = max(top, _bounds_top(sweep.points) * scale)
                axes[r, 0].set_ylim(0, min(105.0, max(10.0, top * 1.18)))
            else:
                axes[r, 0].set_ylim(0, top * 1.12 if np.isfinite(top) and top > 0 else 1.0)
        for i in range(len(chunk), facet_rows * cols):
            for r in range(len(panels)):
                axes[(i // cols) * len(panels) + r, i % cols].set_visible(False)
        handles, _ = axes[0, cols - 1].get_legend_handles_labels()
        axes[0, cols - 1].legend(
            handles=handles + _marker_keys(sweep.points),
            loc="upper left",
            bbox_to_anchor=(1.02, 1),
            borderaxespad=0,
            title=gain,
            title_fontsize=9,
        )
        pages.append(fig)
    return pages


def _bounds_top(points: pd.DataFrame) -> float:
    """The highest hit-rate bound the page draws (:func:`_draw_bounds`), 0 without one."""
    tops = [
        float(np.nanmax((points["token_hit_rate"] / points[f"hit_vs_{b}"]).to_numpy(dtype=float)))
        for b in BOUND_LINES
        if f"hit_vs_{b}" in points and (points[f"hit_vs_{b}"] > 0).any()
    ]
    return max([t for t in tops if math.isfinite(t)], default=0.0)


def _marker_keys(points: pd.DataFrame) -> list[Line2D]:
    """Legend entries for :func:`_mark_points`' marks, where the sweep has them."""
    keys = []
    if "saturated" in points and points["saturated"].fillna(False).astype(bool).any():
        ring = Line2D([], [], marker="o", mfc="none", mec="red", ms=9, ls="none")
        ring.set_label("saturated run")
        keys.append(ring)
    if "alpha" in points and points["alpha"].notna().any():
        keys.append(Line2D([], [], ls="none", label="alpha a: tuned alpha (* never tuned)"))
    return keys


def contention_pages(sweep: SweepResults, style: Style) -> list[Figure]:
    if CACHE_KEY not in sweep.swept_keys:
        raise SkipPage(f"{CACHE_KEY} was not swept")
    return key_pages(sweep, CACHE_KEY, style)


def alpha_pages(sweep: SweepResults, style: Style) -> list[Figure]:
    keys = [k for k in sweep.swept_keys if is_alpha(k)]
    if not keys:
        raise SkipPage("no alpha key (e.g. policy.alpha) was swept")
    return [fig for k in keys for fig in key_pages(sweep, k, style)]


def other_key_pages(sweep: SweepResults, style: Style) -> list[Figure]:
    """A page per other swept key (fixed overrides and seeds have none)."""
    keys = [k for k in sweep.swept_keys if k not in (CACHE_KEY, SEED_KEY) and not is_alpha(k)]
    return [fig for k in keys for fig in key_pages(sweep, k, style)]


# --- per-point pages ------------------------------------------------------------------------------


def hit_boxes_pages(sweep: SweepResults, style: Style) -> list[Figure]:
    """Marconi Figs. 7-8 with sweep points in place of traces (boxes, for comparison with the
    paper), then the per-request CDF of every point, which shows the two modes a box hides."""
    pages = []
    groups = [(point_label(sweep.values(p)), sweep.run(p)) for p in sweep.point_ids]
    for chunk in chunks(groups, POINTS_PER_BOX_PAGE):
        fig, axes = new_page("Token hit rate per request, by sweep point and policy", style.caption)
        draw_hit_boxes(axes[0, 0], list(chunk), sweep.policies, style.colours)
        axes[0, 0].set_xlabel("Sweep point")
        axes[0, 0].set_title(BOX_NOTE + " (Marconi Figs. 7-8 style; CDFs follow)", fontsize=10)
        pages.append(fig)

    def draw(ax: Axes, run: RunResults) -> None:
        draw_hit_cdf(ax, run, style.colours, compact=True)

    title = "Token hit rate per request: CDF per policy and sweep point"
    return pages + small_multiples(
        sweep, title, style, draw, sweep.point_ids, legend=sweep.policies
    )


def small_multiples(
    sweep: SweepResults,
    title: str,
    style: Style,
    draw: Callable[[Axes, RunResults], None],
    points: Sequence[int],
    legend: Sequence[str] = (),
) -> list[Figure]:
    """``draw`` per point, :data:`PANELS_PER_PAGE` panels a page; ``legend`` policies on the
    right of the first row."""
    pages = []
    for chunk in chunks(list(points), PANELS_PER_PAGE):
        rows, cols = grid_shape(len(chunk))
        fig, axes = new_page(title, style.caption, rows, cols)
        for ax, point in zip(axes.flat, chunk, strict=False):
            draw(ax, sweep.run(point))
            label = f"point {point}: {point_label(sweep.values(point), sep=', ')}"
            ax.set_title("\n".join(textwrap.wrap(label, 42)), fontsize=9.5)
        hide_unused(axes, len(chunk))
        if legend:
            policy_legend(
                axes[0, -1],
                style.colours,
                legend,
                loc="upper left",
                bbox_to_anchor=(1.02, 1),
                borderaxespad=0,
            )
        pages.append(fig)
    return pages


def ttft_pages(sweep: SweepResults, style: Style) -> list[Figure]:
    timed = [p for p in sweep.point_ids if sweep.run(p).has_ttft]
    if not timed:
        raise SkipPage("records have no TTFT (the replay engine has no time; use the timed engine)")

    def draw(ax: Axes, run: RunResults) -> None:
        draw_ttft_cdf(ax, run, sweep.policies, style.colours, compact=True)

    title = "Time to first token: CDF per policy and sweep point (dotted: P5, P50, P95)"
    note = cost_model_note(sweep.base.config)  # point 0's; a swept calibration shows in the caption
    error = latency_error_note(sweep.base.summary["policies"])
    note = "\n".join(part for part in (note, error) if part)
    if note:  # in the caption's small print: a title of five bold lines overflows the page
        style = dataclasses.replace(style, caption=f"{note}\n{style.caption}")
    return small_multiples(sweep, title, style, draw, timed, legend=sweep.policies)


def hit_diff_pages(sweep: SweepResults, style: Style) -> list[Figure]:
    if style.diff is None:
        raise SkipPage("needs two policies to compare (default marconi vs sglang_plus; --diff A B)")
    pair = style.diff
    both = [p for p in sweep.point_ids if set(pair) <= set(sweep.run(p).policies)]
    if not both:
        raise SkipPage(f"no sweep point ran both {pair[0]} and {pair[1]}")

    def draw(ax: Axes, run: RunResults) -> None:
        draw_hit_diff(ax, run, pair, style.colours, compact=True)

    title = f"Hit-rate difference by input length: {pair[0]} - {pair[1]} (mean per request)"
    return small_multiples(sweep, title, style, draw, both, legend=pair)
