"""PDF reports built only from results files: pages, numbers, determinism, clear input errors."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from simlab.report import ReportInputError, build_report, render_report
from simlab.report.build import (
    ALPHA,
    BOXES,
    BREAKDOWN,
    CONTENTION,
    DIFF,
    GEOMETRY,
    OCCUPANCY,
    PROVENANCE,
    ROUTING_SWEEP,
    SUMMARY,
    TTFT,
)
from simlab.report.describe import cost_model_note
from simlab.report.load import load_results
from simlab.report.run_pages import hit_diff_by_length, length_bins, request_hit_rate
from simlab.report.style import palette
from simlab.report.tables import COLUMNS
from simlab.run.simulate import simulate
from tests.fixtures import ROOT, compose

BASE = ["trace=sharegpt", "trace.limit=6"]
SIZES = [0.25, 1.0]
ALPHAS = [0.0, 2.0]
ALPHA_KEY = "compare.marconi.alpha"
FIXED_ALPHA = "compare.marconi.tuning.enabled=false"  # Marconi is tuned by default


def run_sim(out: Path, overrides: list[str]) -> dict:
    summary = simulate(compose([*BASE, *overrides, f"output_dir={out}"]))
    return summary.to_dict()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A replay run: no time, so no TTFT."""
    out = tmp_path_factory.mktemp("report") / "run"
    run_sim(out, ["engine=replay", "cache.size_gb=0.5"])
    return out


@pytest.fixture(scope="module")
def timed_dir(tmp_path_factory) -> Path:
    """A timed-engine run: TTFT, throughput and occupancy.parquet over simulated time."""
    out = tmp_path_factory.mktemp("report") / "timed"
    run_sim(out, ["engine=timed", "cache.size_gb=0.5"])
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """A sweep (timed engine) over cache size x Marconi's alpha: one run directory per point +
    points.parquet."""
    out = tmp_path_factory.mktemp("report") / "sweep"
    rows = []
    grid = [(size, alpha) for size in SIZES for alpha in ALPHAS]
    for point, (size, alpha) in enumerate(grid):
        overrides = ["engine=timed", f"cache.size_gb={size}", f"{ALPHA_KEY}={alpha}", FIXED_ALPHA]
        summary = run_sim(out / str(point), overrides)
        for policy, metrics in summary["policies"].items():
            keys = {"point": point, "cache.size_gb": size, ALPHA_KEY: alpha, "policy": policy}
            rows.append(keys | metrics)
    pd.DataFrame(rows).to_parquet(out / "points.parquet", index=False)
    return out


def pdf_pages(path: Path) -> int:
    """Page objects in a PDF (matplotlib writes them uncompressed, outside object streams)."""
    return len(re.findall(rb"/Type\s*/Page\b(?!s)", path.read_bytes()))


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


# --- runs -------------------------------------------------------------------------------------------


def test_run_report_pages_and_table(run_dir, tmp_path):
    report = render_report(run_dir, tmp_path / "run.pdf")
    assert report.path.read_bytes().startswith(b"%PDF")
    assert report.kind == "run"
    assert report.pages[:6] == [SUMMARY, BREAKDOWN, BOXES, DIFF, OCCUPANCY, PROVENANCE]
    assert set(report.pages[6:]) <= {PROVENANCE}  # a long config continues on more pages
    assert set(report.skipped) == {TTFT, CONTENTION, ALPHA}
    assert "replay" in report.skipped[TTFT] and "sweep" in report.skipped[CONTENTION]
    assert pdf_pages(report.path) == len(report.pages)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(report.table.index) == ["vllm_plus", "sglang_plus", "marconi"]
    for policy, metrics in summary["policies"].items():
        for col in COLUMNS:
            value = report.table.at[policy, col.key]
            if col.text:  # the load verdict: a timed run's only
                assert value == metrics.get(col.key) is None
            else:
                assert same(value, float(metrics.get(col.key, math.nan)))


def test_timed_run_adds_ttft_pages_and_numbers(timed_dir, tmp_path):
    report = render_report(timed_dir, tmp_path / "timed.pdf")
    assert report.pages[:6] == [SUMMARY, BREAKDOWN, BOXES, TTFT, DIFF, OCCUPANCY]
    assert TTFT not in report.skipped
    assert pdf_pages(report.path) == len(report.pages)
    summary = json.loads((timed_dir / "summary.json").read_text())
    for policy, metrics in summary["policies"].items():
        for key in ("ttft_p5", "ttft_p50", "ttft_p95", "throughput_rps", "throughput_tps", "load"):
            assert report.table.at[policy, key] == metrics[key]
        assert metrics["load"] in ("ok", "queueing", "saturated")


def test_report_is_deterministic(run_dir, tmp_path):
    a = build_report(run_dir, tmp_path / "a.pdf")
    b = build_report(run_dir, tmp_path / "b.pdf")
    assert a.read_bytes() == b.read_bytes()
    assert b"CreationDate" not in a.read_bytes()


def test_default_output_is_under_reports(run_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = build_report(run_dir)
    assert path.parent == Path("reports") and path.suffix == ".pdf"
    assert path.name.startswith("sharegpt_") and (tmp_path / path).is_file()


def test_diff_pair_is_chosen_and_checked(run_dir, tmp_path):
    report = render_report(run_dir, tmp_path / "d.pdf", diff=("sglang_plus", "vllm_plus"))
    assert DIFF in report.pages
    with pytest.raises(ReportInputError, match="nosuch"):
        render_report(run_dir, tmp_path / "e.pdf", diff=("marconi", "nosuch"))


def test_hit_diff_bins_cover_every_paired_request(run_dir):
    from simlab.report.load import load_run

    run = load_run(run_dir)
    table = hit_diff_by_length(run, "marconi", "sglang_plus")
    assert table["requests"].sum() == len(run.policy_records("marconi"))
    assert (table["lo"].diff().dropna() > 0).all()
    edges = length_bins(np.array([10.0, 100, 1000, 5000]))
    assert edges[0] == 0 and edges[-1] > 5000 and np.all(np.diff(edges) > 0)
    rates = request_hit_rate(run.records)
    assert ((rates >= 0) & (rates <= 1)).all()


def test_policy_colours_are_fixed_and_distinct():
    standard = palette(["marconi", "vllm_plus", "sglang_plus"])
    assert standard == {k: palette([k])[k] for k in standard}  # the same whatever else ran
    many = palette(["marconi", "alpha_0", "alpha_1", "alpha_2", "lru_only"])
    assert len(set(many.values())) == len(many)


# --- sweeps -----------------------------------------------------------------------------------------


def test_sweep_report_pages_and_table(sweep_dir, tmp_path):
    report = render_report(sweep_dir, tmp_path / "sweep.pdf")
    assert report.kind == "sweep"
    for page in (SUMMARY, BOXES, TTFT, CONTENTION, DIFF, ALPHA, PROVENANCE):
        assert page in report.pages
    assert report.pages[0] == SUMMARY and report.pages[-1] == PROVENANCE
    assert set(report.skipped) == {OCCUPANCY, ROUTING_SWEEP, GEOMETRY}  # no engine geometry
    assert pdf_pages(report.path) == len(report.pages)
    points = pd.read_parquet(sweep_dir / "points.parquet")
    assert len(report.table) == len(points)
    merged = report.table.merge(points, on=["point", "policy"], suffixes=("", "_file"))
    assert len(merged) == len(points)
    for col in COLUMNS:
        if col.key in points:
            a, b = merged[col.key], merged[f"{col.key}_file"]
            assert a.equals(b) if col.text else np.array_equal(a, b, equal_nan=True)
        else:
            assert merged[col.key].isna().all()
    assert list(report.table.columns[:3]) == ["point", "cache.size_gb", ALPHA_KEY]


# --- bad input --------------------------------------------------------------------------------------


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def drop_key(path: Path) -> None:
    data = json.loads(path.read_text())
    del data["policies"]
    path.write_text(json.dumps(data))


RUN_DAMAGE = {
    "missing summary": ("summary.json", lambda p: p.unlink()),
    "invalid json": ("summary.json", lambda p: p.write_text('{"policies": {')),
    "summary lacks policies": ("summary.json", drop_key),
    "truncated records": ("records.parquet", truncate),
    "missing records": ("records.parquet", lambda p: p.unlink()),
    "corrupt occupancy": ("occupancy.parquet", lambda p: p.write_bytes(b"PAR1 not parquet")),
}


@pytest.mark.parametrize("damage", sorted(RUN_DAMAGE))
def test_damaged_run_names_the_file(timed_dir, tmp_path, damage):
    name, spoil = RUN_DAMAGE[damage]
    bad = shutil.copytree(timed_dir, tmp_path / "bad")
    spoil(bad / name)
    with pytest.raises(ReportInputError, match=re.escape(str(bad / name))):
        build_report(bad, tmp_path / "out.pdf")
    assert not (tmp_path / "out.pdf").exists()


SWEEP_DAMAGE = {
    "truncated points": ("points.parquet", truncate),
    "missing point dir": ("1/summary.json", lambda p: shutil.rmtree(p.parent)),
    "corrupt point records": ("2/records.parquet", truncate),
}


@pytest.mark.parametrize("damage", sorted(SWEEP_DAMAGE))
def test_damaged_sweep_names_the_file(sweep_dir, tmp_path, damage):
    name, spoil = SWEEP_DAMAGE[damage]
    bad = shutil.copytree(sweep_dir, tmp_path / "bad")
    spoil(bad / name)
    with pytest.raises(ReportInputError, match=re.escape(name.split("/")[-1])):
        build_report(bad, tmp_path / "out.pdf")


def test_not_a_results_dir(tmp_path):
    with pytest.raises(ReportInputError, match="neither a run directory"):
        build_report(tmp_path, tmp_path / "out.pdf")


def report_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "simlab.report", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_writes_report_and_reports_errors_in_one_line(run_dir, tmp_path):
    proc = report_cli(str(run_dir), "--out", str(tmp_path / "cli.pdf"))
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "cli.pdf") in proc.stdout and (tmp_path / "cli.pdf").is_file()
    bad = shutil.copytree(run_dir, tmp_path / "bad")
    (bad / "summary.json").write_text("{not json")
    proc = report_cli(str(bad))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "summary.json" in proc.stderr
    proc = report_cli(str(run_dir), "--out", "/proc/simlab/r.pdf")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("simlab.report: error: --out: cannot write /proc/simlab")


def test_page_one_shows_the_bounds_and_the_caption_the_gpu(timed_dir):
    """Issue 18: page 1's chart had no bounds, its caption no hardware."""
    from simlab.report.describe import run_caption
    from simlab.report.load import load_run
    from simlab.report.style import new_page
    from simlab.report.tables import draw_glance, run_table

    run = load_run(timed_dir)
    assert " | engine timed on a100_40gb | " in run_caption(run)
    _fig, axes = new_page("t", "c")
    bounds = run.summary["bounds"]
    draw_glance(axes[0, 0], run_table(run), palette(run.policies), bounds)
    labels = [t.get_text() for t in axes[0, 0].texts]
    assert any(t.startswith("infinite bound ") for t in labels)
    assert any(t.startswith("clairvoyant bound ") for t in labels)


def test_the_per_request_hit_rate_is_a_cdf_that_names_its_two_modes(run_dir):
    from simlab.report.load import load_run
    from simlab.report.run_pages import draw_hit_cdf
    from simlab.report.style import new_page

    run = load_run(run_dir)
    _fig, axes = new_page("t", "c")
    draw_hit_cdf(axes[0, 0], run, palette(run.policies))
    legend = [t.get_text() for t in axes[0, 0].get_legend().get_texts()]
    assert len(legend) == len(run.policies)
    assert all(re.search(r"\d+% of requests below 10%, \d+% at 90% or more", t) for t in legend)


def test_the_contention_curve_is_on_a_log_axis_with_seed_bands_and_bounds():
    """Issue 18: categorical cache sizes, no bounds, seeds as separate points."""
    from matplotlib.collections import PolyCollection

    from simlab.report.run_pages import Style
    from simlab.report.style import new_page
    from simlab.report.sweep_pages import draw_vs_key, x_positions

    assert x_positions([0.5, 1, 2, 5], "cache.size_gb") == (
        {0.5: 0.5, 1: 1.0, 2: 2.0, 5: 5.0},
        True,
    )
    assert x_positions([0.5, 1, 2, 5], "policy.alpha")[1] is False
    assert x_positions([1, 2], "cache.size_gb")[1] is False  # too narrow a span for a log axis
    rows = []
    for size, rate in ((0.5, 0.2), (2.0, 0.5), (8.0, 0.8)):
        for seed, noise in ((0, -0.02), (1, 0.02)):
            rows.append(
                {
                    "cache.size_gb": size,
                    "seed": seed,
                    "policy": "lru",
                    "token_hit_rate": rate + noise,
                    "hit_vs_infinite": (rate + noise) / 0.9,
                }
            )
    points = pd.DataFrame(rows)
    _fig, axes = new_page("t", "c")
    ax = axes[0, 0]
    style = Style(colours={"lru": "#000000"}, caption="c", diff=None)
    draw_vs_key(ax, points, "cache.size_gb", ("token_hit_rate", "%", 100.0), ["lru"], style)
    assert ax.get_xscale() == "log"
    mean = ax.get_lines()[0].get_ydata()
    assert np.allclose(mean, [20, 50, 80])  # the seeds' mean
    assert any(isinstance(c, PolyCollection) for c in ax.collections)  # +-1 sd band
    bound = [line for line in ax.get_lines() if line.get_label() == "bound: infinite cache"]
    assert np.allclose(bound[0].get_ydata(), [90, 90, 90])


def test_only_swept_keys_get_pages_and_fixed_ones_are_named_fixed(tmp_path):
    """Issue 18: fixed overrides (engine=replay, trace=...) made pages of their own."""
    from simlab.report.load import SweepResults

    points = pd.DataFrame(
        {
            "point": [0, 1],
            "cache.size_gb": [1.0, 2.0],
            "engine": ["replay", "replay"],
            "policy": ["lru", "lru"],
        }
    )
    sweep = SweepResults(tmp_path, points, ["cache.size_gb", "engine"], {})
    assert sweep.swept_keys == ["cache.size_gb"]
    assert sweep.fixed == {"engine": "replay"}


# --- what the TTFTs rest on ---------------------------------------------------------------------


def test_the_cost_model_note_names_the_calibration_and_its_error():
    timed = compose(["engine=timed", "hardware=a100_40gb"])
    config = OmegaConf.to_container(timed, resolve=True)
    note = cost_model_note(config)
    fitted = json.loads((ROOT / "gpu_validate/calibration/a100_40gb.json").read_text())
    gemm = fitted["held_back_error"]["gemm"]
    assert "a100_40gb.json" in note
    assert f"gemm {100 * gemm['median']:.0f}/{100 * gemm['p90']:.0f}%" in note
    measured = fitted["profiles"]["held_back_error"]["gemm"]
    assert "measured shape timed from the measurements (allreduce" in note
    assert "% of a 4,096-token prefill" in note  # the default model: marconi_7b's attention
    assert f"gemm {100 * measured['median']:.0f}/{100 * measured['p90']:.0f}%)" in note
    config["engine"]["profiles"] = False
    assert "measured shape" not in cost_model_note(config)
    config["engine"]["calibration"] = None
    assert "default efficiencies" in cost_model_note(config)
    assert "not validated" in cost_model_note(config)
    replay = OmegaConf.to_container(compose(["engine=replay"]), resolve=True)
    assert cost_model_note(replay) == ""


def test_a_key_swept_over_null_and_values_gets_its_pages(sweep_dir, tmp_path):
    # policy.prefix_match_unit=null,16 (the geometry sweep): null is a value of the key, not NaN
    # that no x position matches
    copy = tmp_path / "sweep"
    shutil.copytree(sweep_dir, copy)
    points = pd.read_parquet(copy / "points.parquet")
    points[ALPHA_KEY] = points[ALPHA_KEY].where(points[ALPHA_KEY] != ALPHAS[0])
    points.to_parquet(copy / "points.parquet", index=False)
    assert (
        load_results(copy).points[ALPHA_KEY].tolist().count("null")
        == points[ALPHA_KEY].isna().sum()
    )
    report = render_report(copy, tmp_path / "sweep.pdf")
    assert ALPHA in report.pages and pdf_pages(report.path) == len(report.pages)
