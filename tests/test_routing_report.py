"""The routing page of the PDF report for a run with replicas."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simlab.report import render_report
from simlab.report.build import PROVENANCE, ROUTING, ROUTING_SWEEP
from simlab.report.load import load_results
from simlab.report.routing_pages import (
    replica_table,
    routing_axes,
    routing_rates,
    routing_sweep_table,
)
from simlab.report.run_pages import SkipPage
from simlab.run.simulate import simulate
from tests.fixtures import compose
from tests.test_report import pdf_pages

BASE = [
    "engine.calibration=null",
    "bounds.enabled=false",
    "report=false",
    "trace=chat",
    "trace.n_sessions=16",
]


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("routing") / "cluster"
    overrides = ["cluster.replicas=3", "cluster.router=prefix_aware", f"output_dir={out}"]
    simulate(compose([*BASE, *overrides]))
    return out


def test_a_cluster_run_gets_a_routing_page(cluster_dir, tmp_path):
    report = render_report(cluster_dir, tmp_path / "cluster.pdf")
    assert ROUTING in report.pages and ROUTING not in report.skipped
    assert report.pages.index(ROUTING) < report.pages.index(PROVENANCE)
    assert pdf_pages(report.path) == len(report.pages)


def test_the_routing_numbers_match_the_summary(cluster_dir):
    run = load_results(cluster_dir)
    summary = json.loads((cluster_dir / "summary.json").read_text())["policies"]
    table = replica_table(run)
    rates = routing_rates(run)
    for policy, metrics in summary.items():
        rows = table[table["policy"] == policy].sort_values("replica")
        assert rows["requests"].tolist() == metrics["replica_requests"]
        assert rows["token_hit_rate"].to_numpy() == pytest.approx(metrics["replica_token_hit_rate"])
        assert rates.at[policy, "routing_regret_rate"] == pytest.approx(
            metrics["routing_regret_rate"]
        )
        assert rates.at[policy, "best_overlap_rate"] == pytest.approx(metrics["best_overlap_rate"])


def test_a_single_replica_run_has_no_routing_page(tmp_path):
    out = tmp_path / "one"
    simulate(compose([*BASE, "+policy=sglang_plus", f"output_dir={out}"]))
    report = render_report(out, tmp_path / "one.pdf")
    assert ROUTING not in report.pages and ROUTING not in report.skipped


# --- a sweep over routers and replica counts ---------------------------------------------------


@pytest.fixture(scope="module")
def routing_sweep_dir(tmp_path_factory):
    """A sweep over replicas x router (timed, every compared policy): run dirs + points.parquet
    (lists as JSON strings, as :func:`simlab.run.sweep.aggregate` writes them)."""
    out = tmp_path_factory.mktemp("routing") / "sweep"
    rows = []
    grid = [(n, router) for n in (1, 3) for router in ("round_robin", "prefix_aware")]
    for point, (n, router) in enumerate(grid):
        overrides = [f"cluster.replicas={n}", f"cluster.router={router}"]
        simulate(compose([*BASE, *overrides, f"output_dir={out / str(point)}"]))
        summary = json.loads((out / str(point) / "summary.json").read_text())
        for policy, metrics in summary["policies"].items():
            keys = {"cluster.replicas": n, "cluster.router": router}
            scalars = {
                k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in metrics.items()
            }
            rows.append({"point": point, **keys, "policy": policy} | scalars)
    pd.DataFrame(rows).to_parquet(out / "points.parquet", index=False)
    return out


def test_metrics_only_some_points_have_are_not_swept_keys(routing_sweep_dir):
    """The single-replica points have no routing metrics; they stay metrics, not keys."""
    sweep = load_results(routing_sweep_dir)
    assert sweep.swept_keys == ["cluster.replicas", "cluster.router"]


def test_a_routing_sweep_gets_its_page_per_policy(routing_sweep_dir, tmp_path):
    report = render_report(routing_sweep_dir, tmp_path / "sweep.pdf")
    policies = pd.read_parquet(routing_sweep_dir / "points.parquet")["policy"].unique()
    assert report.pages.count(ROUTING_SWEEP) == len(policies) > 1
    assert ROUTING_SWEEP not in report.skipped
    assert pdf_pages(report.path) == len(report.pages)


def test_the_routing_sweep_table_is_the_points(routing_sweep_dir):
    points = pd.read_parquet(routing_sweep_dir / "points.parquet")
    x_key, line_key = routing_axes(["cluster.replicas", "cluster.router"])
    assert (x_key, line_key) == ("cluster.replicas", "cluster.router")
    table = routing_sweep_table(points, x_key, line_key)
    assert len(table) == len(points)
    merged = table.merge(points, on=["policy", x_key, line_key], suffixes=("", "_point"))
    for metric in ("token_hit_rate", "ttft_p50", "ttft_p95"):
        assert merged[metric].to_numpy() == pytest.approx(merged[f"{metric}_point"].to_numpy())
    many = merged[merged[x_key] > 1]
    assert many["load_imbalance"].to_numpy() == pytest.approx(
        many["load_imbalance_point"].to_numpy()
    )
    assert (merged.loc[merged[x_key] == 1, "load_imbalance"] == 1.0).all()


def test_routing_sweep_axes():
    assert routing_axes(["cluster.router", "seed"]) == ("cluster.router", None)
    assert routing_axes(["cluster.replicas"]) == ("cluster.replicas", None)
    with pytest.raises(SkipPage, match="neither"):
        routing_axes(["cache.size_gb"])
