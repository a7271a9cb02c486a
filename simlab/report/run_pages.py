"""Figures drawn from one run's records: hit-rate boxes, TTFT CDFs, hit-rate difference by input
length, cache occupancy. Each ``draw_*`` draws onto given axes, so sweep pages reuse them as
small multiples; each ``*_page`` makes a run page or raises :class:`SkipPage`."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, PercentFormatter

from simlab.report.describe import (
    cost_model_note,
    engine_label,
    latency_error_note,
    time_sources_note,
)
from simlab.report.load import RunResults, metric
from simlab.report.style import (
    KV_LABEL,
    SSM_LABEL,
    fmt_tokens,
    grid_shape,
    hide_unused,
    new_page,
)

MAX_OCCUPANCY_POINTS = 4000  # per policy; longer series are thinned evenly
LENGTH_BINS = 8
BOX_NOTE = "Box: P25-P75, black line: median, whiskers: P5 and P95"


class SkipPage(Exception):
    """A page whose data is absent; the message says why (shown on the summary page)."""


@dataclass(frozen=True)
class Style:
    """What every page needs besides its data."""

    caption: str
    colours: dict[str, str]
    diff: tuple[str, str] | None  # (A, B) for the hit-rate difference pages


def request_hit_rate(records: pd.DataFrame) -> pd.Series:
    """Per-request token hit rate = hit_tokens / input_tokens (0 for an empty input)."""
    inputs = records["input_tokens"].astype(float)
    return (records["hit_tokens"] / inputs.where(inputs > 0)).fillna(0.0)


# --- token hit rate distributions (Marconi Figs. 7-8) -------------------------------------------


def draw_hit_boxes(
    ax: Axes,
    groups: Sequence[tuple[str, RunResults]],
    policies: Sequence[str],
    colours: dict[str, str],
) -> None:
    """Per group (a run), one box per policy: P25-P75 box, median line, P5/P95 whiskers, and a
    diamond at the run's token hit rate (all tokens pooled)."""
    width = 0.8 / max(len(policies), 1)
    for g, (_, run) in enumerate(groups):
        for i, policy in enumerate(policies):
            if policy not in run.summary["policies"]:
                continue
            pos = box_position(g, i, len(policies))
            rates = 100 * request_hit_rate(run.policy_records(policy)).to_numpy()
            box = ax.boxplot(
                [rates],
                positions=[pos],
                widths=width * 0.8,
                whis=(5, 95),
                showfliers=False,
                patch_artist=True,
                manage_ticks=False,
            )
            _colour_box(box, colours[policy])
            overall = 100 * metric(run.summary["policies"][policy], "token_hit_rate")
            ax.plot(pos, overall, marker="D", color="black", markersize=5, zorder=5)
    ax.set_xticks(range(len(groups)), [label for label, _ in groups])
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(-2, 102)
    ax.yaxis.set_major_formatter(PercentFormatter())
    ax.set_ylabel("Per-request token hit rate (%)")
    ax.grid(axis="x", visible=False)
    handles: list[Patch | Line2D] = [Patch(facecolor=colours[p], label=p) for p in policies]
    handles.append(
        Line2D([], [], marker="D", color="black", ls="", label="token hit rate (all tokens)")
    )
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)


def box_position(group: int, index: int, n_policies: int) -> float:
    """x of policy ``index``'s box within ``group`` (groups at 0, 1, 2, ...)."""
    return group + (index - (n_policies - 1) / 2) * 0.8 / max(n_policies, 1)


def _colour_box(box: dict, colour: str) -> None:
    for patch in box["boxes"]:
        patch.set(facecolor=colour, edgecolor="black", linewidth=0.8, alpha=0.9)
    for key in ("whiskers", "caps"):
        for line in box[key]:
            line.set(color="black", linewidth=0.9)
    for line in box["medians"]:
        line.set(color="black", linewidth=2.2)


def draw_hit_cdf(ax: Axes, run: RunResults, colours: dict[str, str], compact: bool = False) -> None:
    """Empirical CDF of the per-request token hit rate per policy. The distribution is usually
    bimodal (a request reuses almost nothing or almost everything), which a box plot hides; the
    legend gives the share of requests at the two ends and the pooled token hit rate
    (``compact``, for small multiples: no legend, the page has one)."""
    for policy in run.policies:
        rates = np.sort(100 * request_hit_rate(run.policy_records(policy)).to_numpy(dtype=float))
        if rates.size == 0:
            continue
        frac = 100 * np.arange(1, rates.size + 1) / rates.size
        low, high = (rates < 10).mean(), (rates >= 90).mean()
        overall = 100 * metric(run.summary["policies"][policy], "token_hit_rate")
        ax.step(
            np.concatenate(([0.0], rates)),
            np.concatenate(([0.0], frac)),
            where="post",
            color=colours[policy],
            label=f"{policy}: {100 * low:.0f}% of requests below 10%, {100 * high:.0f}% at 90% "
            f"or more; token hit rate {overall:.1f}%",
        )
    for q in (25, 50, 75):
        ax.axhline(q, color="grey", ls=":", lw=0.9)
    ax.set_xlim(-1, 101)
    ax.set_ylim(0, 101)
    ax.xaxis.set_major_formatter(PercentFormatter())
    ax.yaxis.set_major_formatter(PercentFormatter())
    ax.set_xlabel(
        "Per-request token hit rate"
        if compact
        else "Per-request token hit rate (hit tokens / input tokens)"
    )
    ax.set_ylabel("Requests with a hit rate <= x (%)")
    if not compact:
        ax.legend(loc="upper left", fontsize=8.5)


def hit_cdf_page(run: RunResults, style: Style) -> Figure:
    fig, axes = new_page("Token hit rate per request: CDF per policy", style.caption)
    draw_hit_cdf(axes[0, 0], run, style.colours)
    n = len(run.policy_records(run.policies[0])) if run.policies else 0
    axes[0, 0].set_title(f"{n} requests per policy; dotted lines: P25, P50, P75", fontsize=10)
    return fig


# --- TTFT CDFs ------------------------------------------------------------------------------------


def draw_ttft_cdf(
    ax: Axes,
    run: RunResults,
    policies: Sequence[str],
    colours: dict[str, str],
    compact: bool = False,
) -> None:
    """Empirical CDF of TTFT (ms) per policy, log x when it spans more than two decades, each
    policy named with its token hit rate and load verdict; ``compact`` (small multiples) leaves
    the legend to the page and writes the hit rates and verdicts in the panel."""
    lows, highs, verdicts = [], [], []
    for policy in policies:
        if policy not in run.summary["policies"]:
            continue
        verdict = load_words(run.summary["policies"][policy])
        ttft = 1000 * run.policy_records(policy)["ttft"].dropna().to_numpy(dtype=float)
        if ttft.size == 0:
            continue
        ttft.sort()
        p50, p95 = np.percentile(ttft, [50, 95])
        frac = np.arange(1, ttft.size + 1) / ttft.size
        ax.step(
            ttft,
            100 * frac,
            where="post",
            color=colours[policy],
            label=policy
            if compact
            else f"{policy} (P50 {p50:,.0f} ms, P95 {p95:,.0f} ms; {verdict})",
        )
        verdicts.append((policy, verdict))
        lows.append(ttft[ttft > 0].min() if (ttft > 0).any() else 1.0)
        highs.append(ttft.max())
    if highs and max(highs) / max(min(lows), 1e-9) > 100:
        ax.set_xscale("log")
    for q in (5, 50, 95):
        ax.axhline(q, color="grey", ls=":", lw=0.9)
    ax.set_ylim(0, 101)
    ax.yaxis.set_major_formatter(PercentFormatter())
    ax.set_xlabel("Time to first token (ms)")
    ax.set_ylabel("Requests with TTFT <= x (%)")
    if not compact:
        ax.legend(loc="lower right")
        return
    for i, (policy, verdict) in enumerate(verdicts):
        ax.annotate(
            verdict,
            (0.98, 0.04 + 0.075 * i),
            xycoords="axes fraction",
            ha="right",
            fontsize=7,
            color=colours[policy],
        )


def load_words(metrics: dict[str, Any]) -> str:
    """A timed policy's token hit rate and load verdict (``summary.json``'s ``load``: ok,
    queueing, saturated), e.g. ``hit 51.2%, saturated``."""
    hit = metrics.get("token_hit_rate")
    words = [f"hit {100 * hit:.1f}%"] if isinstance(hit, int | float) else []
    return ", ".join([*words, str(metrics.get("load", "load n/a"))])


def ttft_page(run: RunResults, style: Style) -> Figure:
    if not run.has_ttft:
        raise SkipPage("records have no TTFT (the replay engine has no time; use the timed engine)")
    fig, axes = new_page("Time to first token: CDF per policy", style.caption)
    draw_ttft_cdf(axes[0, 0], run, run.policies, style.colours)
    text = cost_model_note(run.config)
    sources = time_sources_note(run.config, run.summary["policies"])
    error = latency_error_note(run.summary["policies"])
    note = "\n".join(
        textwrap.wrap(text, 120) + textwrap.wrap(sources, 120) + textwrap.wrap(error, 120)
    )
    axes[0, 0].set_title(f"Dotted lines: P5, P50, P95\n{note}", fontsize=9)
    return fig


# --- hit-rate difference by input length (Marconi Fig. 10a) ---------------------------------------


def length_bins(lengths: np.ndarray, n: int = LENGTH_BINS) -> np.ndarray:
    """Bin edges at input-length quantiles, rounded to two significant digits, deduplicated."""
    qs = np.quantile(lengths, np.linspace(0, 1, n + 1)[1:-1]) if lengths.size else np.array([])
    inner = [_round2(q) for q in qs]
    top = max(float(lengths.max()) + 1 if lengths.size else 1.0, 1.0)
    edges = sorted({0.0, *[e for e in inner if 0 < e < top], top})
    return np.array(edges)


def _round2(x: float) -> float:
    if x <= 0:
        return 0.0
    digits = int(np.floor(np.log10(x))) - 1
    return float(round(x, -digits))


def hit_diff_by_length(run: RunResults, a: str, b: str) -> pd.DataFrame:
    """Mean per-request hit rate of A minus B (percentage points) per input-length bin."""
    cols = ["request_id", "input_tokens"]
    fa = run.policy_records(a)[cols].assign(hr_a=request_hit_rate(run.policy_records(a)))
    fb = run.policy_records(b)[["request_id"]].assign(hr_b=request_hit_rate(run.policy_records(b)))
    pairs = fa.merge(fb, on="request_id", how="inner")
    edges = length_bins(pairs["input_tokens"].to_numpy(dtype=float))
    pairs["bin"] = pd.cut(pairs["input_tokens"], edges, right=False, labels=False)
    grouped = pairs.groupby("bin", observed=True)
    out = pd.DataFrame(
        {
            "lo": edges[:-1],
            "hi": edges[1:],
        }
    )
    out["requests"] = grouped.size().reindex(out.index, fill_value=0).to_numpy()
    out["diff_pp"] = (
        (100 * (grouped["hr_a"].mean() - grouped["hr_b"].mean())).reindex(out.index).to_numpy()
    )
    return out[out["requests"] > 0].reset_index(drop=True)


def draw_hit_diff(
    ax: Axes,
    run: RunResults,
    pair: tuple[str, str],
    colours: dict[str, str],
    compact: bool = False,
) -> None:
    """Bars of mean per-request hit rate A - B per input-length bin; ``compact`` (small
    multiples) drops the per-bin request counts and shortens the labels."""
    a, b = pair
    table = hit_diff_by_length(run, a, b)
    x = np.arange(len(table))
    diffs = table["diff_pp"].to_numpy()
    ax.bar(
        x,
        diffs,
        color=[colours[a] if d >= 0 else colours[b] for d in diffs],
        edgecolor="black",
        linewidth=0.6,
    )
    ax.axhline(0, color="black", lw=0.8)
    labels = [
        f"{fmt_tokens(lo)}-{fmt_tokens(hi)}"
        for lo, hi in zip(table["lo"], table["hi"], strict=True)
    ]
    ax.set_xticks(x, labels, rotation=30, ha="right")
    span = max(float(np.nanmax(np.abs(diffs))) if diffs.size else 1.0, 1.0)
    ax.set_ylim(-1.25 * span, 1.25 * span)
    for xi, d, n in zip(x, diffs, table["requests"], strict=True):
        if compact:
            break
        ax.annotate(
            f"n={n}",
            (xi, d),
            xytext=(0, 3 if d >= 0 else -3),
            textcoords="offset points",
            ha="center",
            va="bottom" if d >= 0 else "top",
            fontsize=8,
        )
    if compact:
        ax.set_xlabel("Input length (tokens)")
        ax.set_ylabel(f"{a} - {b} (pp)")
    else:
        ax.set_xlabel("Input length (tokens), bins at quantiles")
        ax.set_ylabel(f"Mean hit rate {a} - {b}\n(percentage points)")
    ax.grid(axis="x", visible=False)


def hit_diff_page(run: RunResults, style: Style) -> Figure:
    pair = check_pair(style.diff, run.policies)
    fig, axes = new_page(
        f"Hit-rate difference by input length: {pair[0]} - {pair[1]}", style.caption
    )
    draw_hit_diff(axes[0, 0], run, pair, style.colours)
    axes[0, 0].set_title(
        f"Bars above 0 ({pair[0]} colour): {pair[0]} hits more; below 0 ({pair[1]} colour): "
        f"{pair[1]} hits more; n = requests per bin (Marconi Fig. 10a style)",
        fontsize=10,
    )
    return fig


def check_pair(pair: tuple[str, str] | None, policies: Sequence[str]) -> tuple[str, str]:
    if pair is None:
        raise SkipPage("needs two policies to compare (default marconi vs sglang_plus; --diff A B)")
    missing = [p for p in pair if p not in policies]
    if missing:
        raise SkipPage(f"policy {', '.join(missing)} not in these results")
    return pair


# --- cache occupancy --------------------------------------------------------------------------------


def draw_occupancy(ax: Axes, occ: pd.DataFrame, colour: str, capacity_gb: float | None) -> None:
    occ = occ.sort_values("time", kind="stable")
    if len(occ) > MAX_OCCUPANCY_POINTS:
        occ = occ.iloc[np.linspace(0, len(occ) - 1, MAX_OCCUPANCY_POINTS).astype(int)]
    t = occ["time"].to_numpy(dtype=float)
    kv = occ["kv_bytes"].to_numpy(dtype=float) / 1e9
    total = kv + occ["ssm_bytes"].to_numpy(dtype=float) / 1e9
    ax.fill_between(t, 0, kv, step="post", color=colour, alpha=0.95, lw=0)
    ax.fill_between(
        t, kv, total, step="post", facecolor="white", edgecolor=colour, hatch="///", lw=0
    )
    ax.step(t, total, where="post", color="black", lw=0.8)
    if capacity_gb is not None:
        ax.axhline(capacity_gb, color="black", ls="--", lw=1.0)


def occupancy_page(run: RunResults, style: Style) -> Figure:
    occ = run.occupancy
    if occ.empty:
        raise SkipPage("no occupancy.parquet and no cache_kv_bytes/cache_ssm_bytes in records")
    capacity = capacity_gb(run.config)
    engine = engine_label(run.config)
    from_records = run.occupancy_source != "occupancy.parquet" or engine == "replay"
    title = "Cache occupancy over time: KV and SSM bytes"
    if from_records:
        title += " (after each request's admission)"
    rows, cols = grid_shape(len(run.policies))
    fig, axes = new_page(title, style.caption, rows, cols, sharex=True, sharey=True)
    for ax, policy in zip(axes.flat, run.policies, strict=False):
        draw_occupancy(ax, occ[occ["policy"] == policy], style.colours[policy], capacity)
        ax.set_title(policy, color=style.colours[policy], fontweight="bold")
        ax.set_ylim(bottom=0)
    hide_unused(axes, len(run.policies))
    xlabel = "Request arrival time (s)" if from_records else "Time (s)"
    for ax in axes[-1, :]:
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel("Cache contents (GB, 1e9 bytes)")
    handles: list[Artist] = [
        Patch(facecolor="#555555", label=KV_LABEL),
        Patch(facecolor="white", edgecolor="#555555", hatch="///", label=SSM_LABEL),
    ]
    if capacity is not None:
        handles.append(Line2D([], [], color="black", ls="--", label=f"capacity {capacity:g} GB"))
    axes[0, -1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0)
    axes[0, 0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    return fig


def capacity_gb(config: dict) -> float | None:
    """The configured cache size in GB; None when infinite or not a number."""
    try:
        size = float((config.get("cache") or {}).get("size_gb", "nan"))
    except (TypeError, ValueError):
        return None
    return size if np.isfinite(size) else None
