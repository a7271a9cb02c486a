"""Tuning that says what it did (issue 78): a run whose alpha was never tuned (or tuned fewer than
``policy.tuning.min_tunings`` times) warns, records it in summary.json, and the table, report and
capacity tables name the alpha; ``policy.tuning.first_window`` makes a short trace tune."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from simlab.config import ConfigError
from simlab.engines.tuning.settings import TuningSettings
from simlab.report.build import alpha_notes
from simlab.report.describe import run_caption
from simlab.report.load import load_run
from simlab.run.capacities import run_capacities
from simlab.run.simulate import simulate
from simlab.run.summary import alpha_label
from tests.fixtures import compose
from tests.test_tuning import ONCE, conversations_trace, run, tuned

#: a chat trace whose cache fills early, with a first window (multiplier 100) past its end
SHORT = [
    "+policy=marconi",
    "policy.tuning.enabled=true",
    "policy.tuning.bootstrap_multiplier=100",
    "policy.tuning.workers=1",
    "engine=replay",
    "trace=chat",
    "trace.n_sessions=20",
    "bounds.enabled=false",
    "report=false",
]


def test_a_first_window_past_the_trace_warns_and_records_untuned(caplog):
    policy, tuner = tuned(bootstrap_multiplier=100, **ONCE)
    with caplog.at_level(logging.WARNING):
        run(conversations_trace(), policy, 1.2e9, tuner)
        summary = tuner.summary()
    n, seen = tuner.bootstrap_requests, tuner.seen
    assert n is not None and 100 * n > seen  # the cache filled, the window did not
    assert summary["alpha"] == {"final": 0.0, "min": 0.0, "max": 0.0, "tunings": 0, "tuned": False}
    [caveat] = summary["caveats"]
    assert caveat.startswith("alpha never tuned: the first tuning window")
    assert f"[{n}, {101 * n})" in caveat and f"{seen:,} requests" in caveat
    assert "policy.tuning.first_window" in caveat
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [f"marconi: {caveat}"]


def test_a_cache_that_never_fills_warns_why():
    policy, tuner = tuned(**ONCE)
    run(conversations_trace(), policy, 1e12, tuner)
    [caveat] = tuner.summary()["caveats"]
    assert "never tuned" in caveat and "the cache never filled" in caveat


def test_first_window_sets_the_first_tuning_and_it_tunes():
    policy, tuner = tuned(bootstrap_multiplier=100, first_window=10, **ONCE)
    run(conversations_trace(), policy, 1.2e9, tuner)
    summary = tuner.summary()
    n = summary["bootstrap_requests"]
    assert summary["alpha_history"][1]["window"] == [n, n + 10]
    assert summary["alpha"]["tuned"] and summary["alpha"]["tunings"] == 1
    assert summary["alpha"]["final"] == summary["alpha_history"][1]["alpha"]
    assert summary["caveats"] == []


def test_first_window_under_the_paper_protocol_counts_from_the_trace_start():
    policy, tuner = tuned(
        protocol="paper", grid=(0.0, 1.0), bootstrap_multiplier=100, first_window=40
    )
    run(conversations_trace(), policy, 1.2e9, tuner)
    n = tuner.bootstrap_requests
    assert n is not None and n < 40
    assert [h.get("window") for h in tuner.history[1:]] == [[0, 40]]


def test_fewer_tunings_than_min_tunings_is_a_caveat():
    policy, tuner = tuned(bootstrap_multiplier=2, min_tunings=3, **ONCE)
    run(conversations_trace(), policy, 1.2e9, tuner)
    [caveat] = tuner.summary()["caveats"]
    first = tuner.first_tune
    assert caveat.startswith(
        "alpha tuned 1 time(s), fewer than policy.tuning.min_tunings 3: first tuning at "
        f"request {first} of the "
        "run's 100, then every 1000000; alpha "
    )


def test_min_tunings_is_validated_and_defaults_to_one():
    assert compose(["+policy=marconi"]).policy.tuning.min_tunings == 1
    assert TuningSettings.resolve(enabled=True).min_tunings == 1
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="min_tunings must be an integer >= 0"):
            TuningSettings.resolve(enabled=True, min_tunings=bad)
    with pytest.raises(ConfigError, match="min_tunings"):
        tuned(min_tunings=-1)


def test_alpha_label_says_untuned_or_how_often_and_over_what():
    untuned = {"final": 0.0, "min": 0.0, "max": 0.0, "tunings": 0, "tuned": False}
    assert alpha_label(untuned) == "0.0 (untuned)"
    once = {"final": 0.3, "min": 0.3, "max": 0.3, "tunings": 1, "tuned": True}
    assert alpha_label(once) == "0.3 (1 tuning)"
    many = {"final": 1.5, "min": 0.5, "max": 1.5, "tunings": 3, "tuned": True}
    assert alpha_label(many) == "1.5 (3 tunings, 0.5-1.5)"


def test_an_untuned_run_says_so_in_summary_table_and_report(tmp_path: Path, caplog):
    with caplog.at_level(logging.WARNING):
        summary = simulate(compose([*SHORT, "cache.size_gb=0.3", f"output_dir={tmp_path}"]))
    entry = json.loads((tmp_path / "summary.json").read_text())["policies"]["marconi"]
    assert entry["alpha"]["tuned"] is False and entry["alpha"]["tunings"] == 0
    [caveat] = entry["caveats"]
    assert "alpha never tuned" in caveat and f"marconi: {caveat}" in caplog.text
    table = summary.table()
    assert "alpha" in table.splitlines()[0] and "0.0 (untuned)" in table
    assert f"warning: marconi: {caveat}" in table
    run_results = load_run(tmp_path)
    assert "marconi (alpha 0.0 (untuned))" in run_caption(run_results)
    notes = alpha_notes(run_results.summary["policies"])
    assert notes == ["Alpha (tuned): marconi (alpha 0.0 (untuned)).", f"Caveat: marconi: {caveat}"]


def test_first_window_makes_the_short_run_tune(tmp_path: Path):
    summary = simulate(
        compose(
            [*SHORT, "cache.size_gb=0.3", "policy.tuning.first_window=20", f"output_dir={tmp_path}"]
        )
    )
    entry = summary.policies["marconi"]
    assert entry["alpha"]["tuned"] and "caveats" not in entry
    assert "untuned" not in summary.table() and "tuning" in summary.table()


def test_a_capacity_list_shows_the_alpha_per_point(tmp_path: Path):
    out = tmp_path / "sizes"
    sizes = run_capacities(compose([*SHORT, "cache.size_gb=[0.3,100]", f"output_dir='{out}'"]))
    lines = sizes.table_text().splitlines()
    assert "alpha" in lines[0].split()
    marconi = [line for line in lines if " marconi " in line]
    assert len(marconi) == 2 and all("(untuned)" in line for line in marconi)
    assert sizes.table.column("alpha").to_pylist() == ["0.0 (untuned)"] * 2
