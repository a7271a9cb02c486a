"""The routing page of the PDF report for a run with replicas."""

from __future__ import annotations

import json

import pytest

from simlab.report import render_report
from simlab.report.build import PROVENANCE, ROUTING
from simlab.report.load import load_results
from simlab.report.routing_pages import replica_table, routing_rates
from simlab.simulate import simulate
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
