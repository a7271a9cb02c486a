"""``python -m simlab.paper``: the published numbers, the direction of each claim, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from simlab.experiments.paper import jobs as paper_jobs
from simlab.experiments.paper.claims import published
from simlab.experiments.paper.cli import main
from simlab.experiments.paper.comparison import comparison, markdown_table
from simlab.experiments.paper.errors import PaperError, StudyFailed
from simlab.experiments.paper.layout import experiment_file
from simlab.experiments.paper.modes import MODES, Features
from simlab.experiments.paper.plan import TWO, Plan, Study, full_plan, quick_plan
from simlab.experiments.paper.results import ModeResults
from simlab.experiments.paper.runner import run_paper
from simlab.util.provenance import code_version
from traces.paths import resolve_data_dir
from traces.swebench import TAR_RELATIVE

SWE = "SWE-bench, 80 GB, 10 sessions/s, 7.5 s"
#: Every number of the paper's text the table must carry: (figure, quantity's start, setting,
#: published value), in the table's order.
EXPECTED = [
    ("Fig. 7", "Marconi / vLLM+", "LMSys", 4.5),
    ("Fig. 8", "P95", "LMSys", 45.6),
    ("Fig. 7", "Marconi / vLLM+", "ShareGPT", 7.3),
    ("Fig. 8", "P95", "ShareGPT", 19.0),
    ("Fig. 7", "Marconi / vLLM+", "SWE-bench", 34.4),
    ("Fig. 8", "P95", "SWE-bench", 219.7),
    ("Fig. 10", "SGLang+", SWE, 16.4),
    ("Fig. 10", "Marconi", SWE, 32.7),
    ("Fig. 10", "Marconi's FLOPs", SWE, 90.3),
    ("Fig. 10a", "Marconi - SGLang+", SWE, -3.0),
    ("Fig. 10a", "Marconi - SGLang+", SWE, 25.5),
    *[
        ("Fig. 11", policy, f"SWE-bench, {gb} GB", value)
        for policy, values in (
            ("Marconi", (9.59, 22.74, 43.03, 47.92, 48.21)),
            ("SGLang+", (7.72, 15.01, 25.57, 36.90, 43.89)),
        )
        for gb, value in zip((60, 80, 100, 120, 140), values, strict=True)
    ],
    *[
        ("Fig. 12a", policy, f"Attn:SSM {ratio}", value)
        for policy, values in (
            ("Marconi", (18.06, 12.3, 8.35, 5.69, 5.05)),
            ("SGLang+", (11.31, 8.51, 6.62, 5.38, 5.04)),
        )
        for ratio, value in zip(("1:8", "1:6", "1:4", "1:2", "1:0"), values, strict=True)
    ],
    ("Fig. 12a", "vLLM+", "all ratios", 5.0),
    *[
        ("Fig. 12b", policy, f"state dim {dim}", value)
        for policy, values in (
            ("Marconi", (31.55, 29.88, 30.19, 29.36)),
            ("SGLang+", (16.39, 17.39, 18.00, 18.37)),
            ("vLLM+", (0.89, 1.5, 3.14, 5.17)),
        )
        for dim, value in zip((128, 64, 32, 16), values, strict=True)
    ],
    *[
        ("Fig. 13a", policy, sps, value)
        for policy, values in (
            ("Marconi", (48.70, 44.92, 43.02)),
            ("SGLang+", (35.18, 29.27, 26.36)),
        )
        for sps, value in zip(
            ("0.5 sessions/s", "1 session/s", "2 sessions/s"), values, strict=True
        )
    ],
    *[
        ("Fig. 13b", policy, f"response time {art} s", value)
        for policy, values in (
            ("Marconi", (25.90, 24.25, 24.08)),
            ("SGLang+", (18.83, 16.60, 15.49)),
        )
        for art, value in zip(("5", "7.5", "10"), values, strict=True)
    ],
]


# ---------------------------------------------------------------------------------- the table
def test_the_table_has_a_row_for_every_published_number():
    rows = published()
    assert len(rows) == len(EXPECTED) == 56
    for row, (figure, quantity, setting, value) in zip(rows, EXPECTED, strict=True):
        assert (row.figure, row.setting, row.paper) == (figure, setting, value)
        assert row.quantity.startswith(quantity), (row.quantity, quantity)


@pytest.mark.parametrize("plan", [full_plan(), quick_plan()], ids=["full", "quick"])
def test_both_plans_run_every_figure_the_rows_read(plan):
    """Every study a row reads is in the plan, with as many x values as the paper's series
    (the quick plan is smaller in grids and traces, not in figures)."""
    names = {s.name for s in plan.studies}
    assert names == {"fig7_8_lmsys", "fig7_8_sharegpt", "fig7_8_swebench"} | {
        "fig10", "fig11", "fig12a", "fig12b", "fig13a", "fig13b"
    }  # fmt: skip
    lengths = {"fig11": 5, "fig12a": 5, "fig12b": 4, "fig13a": 3, "fig13b": 3}
    for name, length in lengths.items():
        assert len(plan.study(name).x_values) == length
    for study in plan.studies:
        assert experiment_file(study.experiment).is_file()


def test_the_comparison_of_an_empty_run_says_not_run():
    empty = [ModeResults(mode, quick_plan()) for mode in MODES]
    table = comparison(empty)
    assert len(table) == 56 and table["holds_paper"].isna().all()
    lines = markdown_table(table)
    assert len(lines) == 2 + 56 and all("not run" in line for line in lines[2:])


# ---------------------------------------------------------------------------------- claims
def _frame(points: dict[int, dict[str, float]], x: str | None = None, xs=()) -> pd.DataFrame:
    """A collect()-style table: ``points[point][policy] = token hit rate`` (fraction)."""
    rows = []
    for point, rates in points.items():
        for policy, rate in rates.items():
            row = {"point": point, "run_dir": str(point), "policy": policy}
            row |= {"token_hit_rate": rate, "flops_saved": 1e15 * rate}
            if x is not None:
                row[x] = xs[point]
            rows.append(row)
    return pd.DataFrame(rows)


def _results(frames: dict[str, pd.DataFrame], dirs: dict[str, Path] | None = None) -> ModeResults:
    res = ModeResults(MODES[0], full_plan())
    res.frames, res.dirs = frames, dirs or {}
    return res


def _row(figure: str, setting: str, quantity: str = ""):
    return next(
        r
        for r in published()
        if r.figure == figure and r.setting == setting and r.quantity.startswith(quantity)
    )


def test_ratio_and_p95_win_over_the_configs():
    """Fig. 7: mean of per-config ratios (a config where vLLM+ hits nothing left out);
    Fig. 8: P95 of per-config wins."""
    points = {
        0: {"vllm_plus": 0.1, "sglang_plus": 0.4, "marconi": 0.5},
        1: {"vllm_plus": 0.2, "sglang_plus": 0.5, "marconi": 0.4},
        2: {"vllm_plus": 0.0, "sglang_plus": 0.5, "marconi": 0.5},
    }
    res = _results({"fig7_8_lmsys": _frame(points)})
    ratio, win = _row("Fig. 7", "LMSys"), _row("Fig. 8", "LMSys")
    assert ratio.value(res) == pytest.approx((5 + 2) / 2)
    assert ratio.holds(res) is True
    wins = pd.Series([25.0, -20.0, 0.0])
    assert win.value(res) == pytest.approx(wins.quantile(0.95))
    assert win.holds(res) is True
    losing = {p: {"vllm_plus": 0.5, "sglang_plus": 0.5, "marconi": 0.2} for p in range(3)}
    res = _results({"fig7_8_lmsys": _frame(losing)})
    assert ratio.holds(res) is False and win.holds(res) is False


def test_above_and_trend_claims_read_the_points_by_the_papers_order():
    """Fig. 11: Marconi rows hold where Marconi beats SGLang+ at that size; SGLang+ rows hold
    where SGLang+ moves to the next size the way the paper's does (it rises). The rows name the
    paper's sizes; the plan's (scaled) sizes are read in the same order."""
    xs = full_plan().study("fig11").x_values
    assert len(xs) == 5 and xs[0] < 60
    sglang = (0.10, 0.20, 0.15, 0.30, 0.40)  # falls from 80 to 100 GB
    marconi = (0.20, 0.10, 0.30, 0.40, 0.40)  # below at 80 GB, tied at 140 GB
    points = {
        i: {"sglang_plus": s, "marconi": m}
        for i, (s, m) in enumerate(zip(sglang, marconi, strict=True))
    }
    res = _results({"fig11": _frame(points, "cache.size_gb", xs)})
    rows = [r for r in published() if r.figure == "Fig. 11"]
    assert [r.holds(res) for r in rows[:5]] == [True, False, True, True, False]
    assert [r.holds(res) for r in rows[5:]] == [True, False, True, True, True]
    assert rows[5].claim == "SGLang+ rises from SWE-bench, 60 GB to SWE-bench, 80 GB"
    assert rows[0].value(res) == pytest.approx(20.0)
    missing = _results({"fig11": _frame({0: points[0]}, "cache.size_gb", xs)})
    assert rows[1].value(missing) is None and rows[1].holds(missing) is None


def test_falling_trends_and_the_pure_transformer_point():
    """Fig. 12a: SGLang+ falls towards the pure Transformer; there the three are within 1 pp;
    vLLM+ below Marconi at every hybrid ratio. Layer splits are matched as text."""
    names = ("1to8", "1to6", "1to4", "1to2", "1to0")
    rates = [(0.3, 0.2, 0.1), (0.25, 0.15, 0.1), (0.2, 0.12, 0.1), (0.15, 0.11, 0.1)]
    rates.append((0.105, 0.1, 0.1))
    points = {
        i: {"marconi": m, "sglang_plus": s, "vllm_plus": v} for i, (m, s, v) in enumerate(rates)
    }
    res = _results({"fig12a": _frame(points, "paper/layers", names)})
    rows = [r for r in published() if r.figure == "Fig. 12a"]
    assert all(r.holds(res) for r in rows)
    points[4]["vllm_plus"] = 0.05  # 5.5 pp apart: not "the same performance"
    points[1]["sglang_plus"] = 0.3  # rises from 1:8 to 1:6
    res = _results({"fig12a": _frame(points, "paper/layers", names)})
    assert [r.holds(res) for r in rows if r.setting == "Attn:SSM 1:0"] == [False, True]
    assert _row("Fig. 12a", "Attn:SSM 1:8", "SGLang+").holds(res) is False


def test_fig10_flops_and_the_7k_split(tmp_path):
    """Fig. 10: FLOPs saved relative to SGLang+; the worst 1K-token bin under 7K and the best
    one above, of Marconi's minus SGLang+'s mean per-request hit rate."""
    (tmp_path / "0").mkdir()
    inputs = [1500, 1500, 6500, 8000, 12000]
    records = pd.DataFrame(
        {
            "policy": ["sglang_plus"] * 5 + ["marconi"] * 5,
            "input_tokens": inputs * 2,
            "hit_tokens": [*(750, 750, 3250, 0, 0), *(750, 750, 2600, 4000, 3000)],
        }
    )
    records.to_parquet(tmp_path / "0" / "records.parquet")
    frame = _frame({0: {"sglang_plus": 0.2, "marconi": 0.3}})
    res = _results({"fig10": frame}, {"fig10": tmp_path})
    below, above = (
        _row("Fig. 10a", SWE, "Marconi - SGLang+ mean hit rate, worst"),
        _row("Fig. 10a", SWE, "Marconi - SGLang+ mean hit rate, best"),
    )
    assert below.value(res) == pytest.approx(-10.0)  # 6-7K bin: 40% vs 50%
    assert above.value(res) == pytest.approx(50.0)  # 8-9K bin: 50% vs 0%
    assert below.holds(res) is True and above.holds(res) is True
    flops = _row("Fig. 10", SWE, "Marconi's FLOPs")
    assert flops.value(res) == pytest.approx(50.0) and flops.holds(res) is True
    assert all(r.holds(res) for r in published() if r.figure == "Fig. 10")


# ---------------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--data-dir", "/nonexistent/simlab-data"], "no such directory"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("simlab.experiments.paper: error: ") and message in err
    assert err.strip().count("\n") == 0


def test_an_out_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "file")])
    assert "not a directory" in capsys.readouterr().err


def test_another_runs_results_are_not_overwritten(tmp_path, capsys):
    """An output directory holding another run's manifest is refused before anything runs."""
    (tmp_path / "paper.json").write_text(json.dumps({"plan": {"name": "other"}}))
    (tmp_path / "paper.md").write_text("another run")
    assert main(["--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simlab.experiments.paper: error: --out") and "--overwrite" in err
    assert (tmp_path / "paper.md").read_text() == "another run"


def test_a_failing_study_does_not_stop_the_others(tmp_path, monkeypatch):
    """Every study is attempted; the failures are named together and no paper.md is written."""
    ran = []

    def run_job(job, jobs, overwrite, logs):
        ran.append(job.label)
        if job.mode.name == "paper":
            raise StudyFailed(f"{job.label} failed")

    monkeypatch.setattr(paper_jobs, "run_job", run_job)
    with pytest.raises(StudyFailed, match=r"1 of 2 studies failed .*: fig11 \[paper mode\]"):
        run_paper(tiny_plan(), tmp_path, features=Features())
    assert ran == ["fig11 [paper mode]", "fig11 [default semantics]"]
    assert not (tmp_path / "paper.md").exists()


# ---------------------------------------------------------------------------------- end to end
SWE_TAR = resolve_data_dir(None) / TAR_RELATIVE


def tiny_plan(limit: int = 4) -> Plan:
    """Fig. 11 only: SGLang+ and Marconi on the first ``limit`` SWE-bench sessions, at the
    paper's first two cache sizes scaled down to a few GB (two points per mode)."""
    gb = ("cache.size_gb", (2, 4))
    study = Study("fig11", "marconi_fig11_contention", TWO, (gb,), gb[0], (f"trace.limit={limit}",))
    return Plan("tiny", (study,), "A test plan: Fig. 11 at 2 and 4 GB on 4 sessions.")


def _summaries(out: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in sorted(out.glob("sweeps/*/*/*/summary.json"))}


@pytest.mark.skipif(not SWE_TAR.is_file(), reason=f"real data not at {SWE_TAR}")
def test_a_tiny_run_writes_paper_md_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "paper"
    md = run_paper(tiny_plan(), out, jobs=2)
    text = md.read_text()
    assert md == out / "paper.md" and (out / "paper.pdf").stat().st_size > 0
    assert "The traces are not the authors'" in text and "trace.limit=4" in text
    table = [line for line in text.splitlines() if line.startswith("| Fig. ")]
    assert len(table) == 56
    run_rows = [
        line for line in table if "| SWE-bench, 60 GB |" in line or "| SWE-bench, 80 GB |" in line
    ]
    assert len(run_rows) == 4 and not any("not run" in line for line in run_rows)
    assert sum("not run" in line for line in table) == 52
    done = _summaries(out)
    assert len(done) == 4  # 2 points x 2 modes

    def no_launch(*args, **kwargs):
        raise AssertionError("a finished study was launched again")

    with monkeypatch.context() as patched:  # a rerun launches nothing and writes the same bytes
        patched.setattr(paper_jobs, "subprocess_for", no_launch)
        pdf = (out / "paper.pdf").read_bytes()
        assert run_paper(tiny_plan(), out, jobs=2).read_text() == text
        assert (out / "paper.pdf").read_bytes() == pdf
    assert _summaries(out) == done

    sweep = out / "sweeps" / "paper" / "fig11"  # a crash after the first point
    stored = json.loads((sweep / "0" / "summary.json").read_text())["provenance"]["code_version"]
    if code_version.__wrapped__() != stored:  # a resume must refuse another code version's points
        pytest.skip("the checkout changed during the test: resuming it is refused, by design")
    (sweep / "paper_done.json").unlink()
    (sweep / "1" / "summary.json").unlink()
    assert run_paper(tiny_plan(), out, jobs=2).read_text() == text
    after = _summaries(out)
    assert after.keys() == done.keys()
    changed = [p for p in done if after[p] != done[p]]
    assert changed == [sweep / "1" / "summary.json"]

    with pytest.raises(PaperError, match="holds another run"):
        run_paper(tiny_plan(limit=5), out, jobs=2, features=Features())
