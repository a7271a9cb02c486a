"""The routing page of a run with replicas (``cluster.replicas > 1``): load balance, hit rate and
TTFT per replica, and what routing left on the table (regret), from the records' routing columns
(:data:`simlab.engines.cluster.engine.ROUTE_COLUMNS`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from simlab.report.load import RunResults
from simlab.report.run_pages import SkipPage, Style
from simlab.report.style import new_page

ROUTING = "Routing"
ROUTING_SWEEP = "Routers and replica counts"


def has_replicas(run: RunResults) -> bool:
    """Whether the run's records carry the cluster's routing columns."""
    return "replica" in run.records.columns and run.records["replica"].notna().any()


def replica_table(run: RunResults) -> pd.DataFrame:
    """Per (policy, replica): requests, input tokens, token hit rate, TTFT P50 / P95."""
    rows = []
    for policy in run.policies:
        frame = run.policy_records(policy)
        for replica, group in frame.groupby("replica", sort=True):
            inputs = float(group["input_tokens"].sum())
            ttft = group["ttft"].dropna() if "ttft" in group else pd.Series(dtype=float)
            rows.append(
                {
                    "policy": policy,
                    "replica": int(replica),
                    "requests": len(group),
                    "input_tokens": inputs,
                    "token_hit_rate": float(group["hit_tokens"].sum()) / inputs if inputs else 0.0,
                    "ttft_p50": float(ttft.quantile(0.5)) if len(ttft) else np.nan,
                    "ttft_p95": float(ttft.quantile(0.95)) if len(ttft) else np.nan,
                }
            )
    return pd.DataFrame(rows)


def routing_rates(run: RunResults) -> pd.DataFrame:
    """Per policy: achieved token hit rate, the best overlap any replica offered and the
    routing regret, each over input tokens."""
    rows = []
    for policy in run.policies:
        frame = run.policy_records(policy)
        inputs = float(frame["input_tokens"].sum()) or 1.0
        rows.append(
            {
                "policy": policy,
                "token_hit_rate": float(frame["hit_tokens"].sum()) / inputs,
                "best_overlap_rate": float(frame["best_overlap"].sum()) / inputs,
                "routing_regret_rate": float(frame["routing_regret"].sum()) / inputs,
            }
        )
    return pd.DataFrame(rows).set_index("policy")


def _grouped_bars(
    ax: Axes, table: pd.DataFrame, column: str, policies: list[str], colours: dict[str, str]
) -> None:
    replicas = sorted(table["replica"].unique())
    width = 0.8 / max(len(policies), 1)
    for i, policy in enumerate(policies):
        rows = table[table["policy"] == policy].set_index("replica").reindex(replicas)
        x = np.arange(len(replicas)) + (i - (len(policies) - 1) / 2) * width
        ax.bar(x, rows[column].to_numpy(dtype=float), width, color=colours[policy], label=policy)
    ax.set_xticks(np.arange(len(replicas)), [str(r) for r in replicas])
    ax.set_xlabel("replica")


def routing_page(run: RunResults, style: Style) -> Figure:
    """Load balance, hit rate and TTFT per replica, and routing regret per policy."""
    if not has_replicas(run):
        raise SkipPage("a single replica (cluster.replicas=1)")
    table = replica_table(run)
    policies = run.policies
    cluster = run.config.get("cluster") or {}
    title = (
        f"Routing: {cluster.get('replicas', table['replica'].nunique())} replicas, "
        f"router {cluster.get('router', '?')}"
    )
    fig, axes = new_page(title, style.caption, 2, 2)
    load, hits, ttft, regret = axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]

    _grouped_bars(load, table, "requests", policies, style.colours)
    load.set_ylabel("requests")
    share = table.groupby("policy")["input_tokens"].transform(lambda s: s / s.sum())
    imbalance = table.groupby("policy")["requests"].agg(lambda s: s.max() / s.mean())
    load.set_title("Load per replica (bars: requests, dots: input-token share)", fontsize=10)
    load.set_xlabel(
        "replica (max/mean requests: "
        + ", ".join(f"{p} {v:.2f}" for p, v in imbalance.items())
        + ")",
        fontsize=8,
    )
    twin = load.twinx()
    for policy in policies:
        rows = table[table["policy"] == policy]
        twin.plot(
            rows["replica"].to_numpy(),
            share[rows.index].to_numpy(),
            "o",
            color=style.colours[policy],
            markeredgecolor="black",
        )
    twin.set_ylabel("input-token share (dots)")
    twin.yaxis.set_major_formatter(PercentFormatter(1.0))

    _grouped_bars(hits, table, "token_hit_rate", policies, style.colours)
    hits.set_ylabel("token hit rate")
    hits.yaxis.set_major_formatter(PercentFormatter(1.0))
    hits.set_title("Token hit rate per replica", fontsize=10)

    if table["ttft_p50"].notna().any():
        _grouped_bars(ttft, table, "ttft_p50", policies, style.colours)
        replicas = sorted(table["replica"].unique())
        width = 0.8 / max(len(policies), 1)
        for i, policy in enumerate(policies):
            rows = table[table["policy"] == policy].set_index("replica").reindex(replicas)
            x = np.arange(len(replicas)) + (i - (len(policies) - 1) / 2) * width
            ttft.plot(x, rows["ttft_p95"], "v", color="black", markersize=5)
        ttft.set_ylabel("TTFT (s)")
        verdicts = ", ".join(
            f"{p} {run.summary['policies'][p].get('load', 'n/a')}" for p in policies
        )
        ttft.set_title(
            f"TTFT per replica (bars: P50, triangles: P95)\nload: {verdicts}", fontsize=10
        )
    else:
        ttft.set_axis_off()

    rates = routing_rates(run)
    names = ["token hit", "best overlap", "regret"]
    width = 0.8 / max(len(policies), 1)
    for i, policy in enumerate(policies):
        values = rates.loc[policy, ["token_hit_rate", "best_overlap_rate", "routing_regret_rate"]]
        x = np.arange(len(names)) + (i - (len(policies) - 1) / 2) * width
        regret.bar(
            x, values.to_numpy(dtype=float), width, color=style.colours[policy], label=policy
        )
    regret.set_xticks(np.arange(len(names)), names)
    regret.yaxis.set_major_formatter(PercentFormatter(1.0))
    regret.set_title("Share of input tokens: hit, best offered, regret", fontsize=10)
    regret.legend(fontsize=8)
    return fig


# --- a sweep over routers and replica counts ------------------------------------------------------

REPLICAS_KEY = "cluster.replicas"
ROUTER_KEY = "cluster.router"
#: (points.parquet column, panel title, y scale): what each router / replica count bought
SWEEP_PANELS = (
    ("token_hit_rate", "Token hit rate (%)", 100.0),
    ("ttft_p50", "TTFT P50 (ms)", 1000.0),
    ("ttft_p95", "TTFT P95 (ms)", 1000.0),
    ("load_imbalance", "Load imbalance (max / mean requests)", 1.0),
)


def routing_axes(swept: list[str]) -> tuple[str, str | None]:
    """The x key and the line key of the routing sweep page: replica counts on x with one
    line per router when both are swept, else the one swept key on x; SkipPage when neither."""
    replicas, router = REPLICAS_KEY in swept, ROUTER_KEY in swept
    if not (replicas or router):
        raise SkipPage(f"neither {REPLICAS_KEY} nor {ROUTER_KEY} was swept")
    if replicas:
        return REPLICAS_KEY, ROUTER_KEY if router else None
    return ROUTER_KEY, None


def routing_sweep_table(points: pd.DataFrame, x_key: str, line_key: str | None) -> pd.DataFrame:
    """Per (policy, line, x): the mean over any other swept keys (seeds, ...) of each panel's
    metric (a single replica's load imbalance is 1; its summary has none)."""
    frame = points.copy()
    if "load_imbalance" not in frame:
        frame["load_imbalance"] = np.nan
    if REPLICAS_KEY in frame:
        frame.loc[frame[REPLICAS_KEY] == 1, "load_imbalance"] = 1.0
    keys = ["policy", *([line_key] if line_key else []), x_key]
    metrics = [m for m, _, _ in SWEEP_PANELS if m in frame]
    return frame.groupby(keys, sort=False, dropna=False)[metrics].mean().reset_index()


def routing_sweep_pages(points: pd.DataFrame, swept: list[str], style: Style) -> list[Figure]:
    """One page per policy: token hit rate, TTFT P50 / P95 and load imbalance against the
    replica count (one line per router) or against the router (bars)."""
    x_key, line_key = routing_axes(swept)
    table = routing_sweep_table(points, x_key, line_key)
    pages = []
    for policy in table["policy"].unique():
        rows = table[table["policy"] == policy]
        xs = list(dict.fromkeys(rows[x_key]))
        fig, axes = new_page(f"Routing sweep: {policy}", style.caption, 2, 2)
        for ax, (metric, label, scale) in zip(axes.flat, SWEEP_PANELS, strict=True):
            if metric not in rows or rows[metric].isna().all():
                ax.set_axis_off()
                continue
            if line_key is None:
                values = rows.set_index(x_key).reindex(xs)[metric].to_numpy(dtype=float)
                ax.bar(np.arange(len(xs)), values * scale, color=style.colours[policy])
            else:
                for line in dict.fromkeys(rows[line_key]):
                    sub = rows[rows[line_key] == line].set_index(x_key).reindex(xs)
                    ax.plot(np.arange(len(xs)), sub[metric] * scale, "o-", label=str(line))
                ax.legend(title=line_key.rsplit(".", 1)[-1], fontsize=8)
            ax.set_xticks(np.arange(len(xs)), [str(x) for x in xs])
            ax.set_xlabel(x_key.rsplit(".", 1)[-1])
            ax.set_title(label, fontsize=10)
            ax.set_ylim(bottom=0)
        pages.append(fig)
    return pages
