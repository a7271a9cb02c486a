"""simlab.validate silicon's replay: a crashed run resumes without simulating its finished points
again, another code's results are not overwritten silently, and N processes give what one
does."""

from __future__ import annotations

import json

import pytest

import simlab.experiments.silicon_run as run
from simlab.config import ConfigError
from simlab.cost.measured import tables

pytestmark = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)

#: the cheapest point of each of four models (concurrency 4, 1,024 / 1,024 tokens)
CHEAP = {
    "qwen3_5_b300_sglang_bf16_agg_1024x1024_c4_cfg738",
    "dsr1_h200_sglang_fp8_agg_1024x1024_c4_cfg81",
    "2026_03_25_deepseek_r1_b200_sxm_sglang_fp8_agg_1024x1024_c4_tp8_0_ep1_0_265",
    "2026_04_06_llama_3_1_70b_b200_sxm_vllm_fp8_agg_1024x1024_c4_tp8_ep1_581",
}


@pytest.fixture
def four(monkeypatch):
    """validate() on the four cheap points."""
    real = run.points

    def cheap_only(csv):
        pts, skipped = real(csv)
        return [p for p in pts if p.id in CHEAP], skipped

    monkeypatch.setattr(run, "points", cheap_only)


@pytest.fixture
def cheap(monkeypatch, four):
    """validate() on the four cheap points, counting the points simulated (in this process)."""
    real = run.both
    simulated: list[str] = []

    def counted(point):
        simulated.append(point.id)
        return real(point)

    monkeypatch.setattr(run, "both", counted)
    return simulated


def test_a_crashed_replay_resumes_without_simulating_its_points_again(tmp_path, cheap):
    first = run.validate(tmp_path)
    assert sorted(cheap) == sorted(CHEAP) and first["groups"]
    store = tmp_path / run.POINTS
    lines = store.read_text().splitlines()
    assert json.loads(lines[0]) == run.producer() and len(lines) == 5
    # a crash after three points, in the middle of writing the fourth's line
    store.write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])
    (tmp_path / run.VALIDATION).unlink()
    cheap.clear()
    again = run.validate(tmp_path)
    assert cheap == [json.loads(lines[4])["id"]]  # only the point whose line was cut
    assert again == first
    assert store.read_text().splitlines() == [*lines[:4], lines[4]]  # the cut line replaced
    cheap.clear()
    assert run.validate(tmp_path) == first and cheap == []  # all done: nothing simulated


def test_another_codes_results_are_not_overwritten_silently(tmp_path, cheap):
    store = tmp_path / run.POINTS
    store.write_text(json.dumps({"code_version": "0123abc", "aiconfigurator_core": "0"}) + "\n")
    with pytest.raises(
        ConfigError,
        match=r"points simulated by other code \(0123abc, aiconfigurator-core 0\).*--overwrite",
    ):
        run.validate(tmp_path)
    assert cheap == [] and not (tmp_path / run.VALIDATION).exists()
    store.unlink()
    (tmp_path / run.VALIDATION).write_text("{}")
    with pytest.raises(ConfigError, match=r"validation\.json without its points\.jsonl"):
        run.validate(tmp_path)
    assert run.validate(tmp_path, overwrite=True)["groups"] and len(cheap) == 4


def test_parallel_processes_give_what_one_does(tmp_path, four):
    serial = run.validate(tmp_path / "one")
    parallel = run.validate(tmp_path / "two", jobs=2)
    assert parallel == serial
    stored = [(tmp_path / d / run.POINTS).read_text().splitlines() for d in ("one", "two")]
    assert sorted(stored[0]) == sorted(stored[1])  # the same lines, in the order they finished


def test_the_command_line_rejects_a_bad_job_count_and_names_it(capsys):
    with pytest.raises(SystemExit):
        run.main(["silicon", "--out", "x", "--jobs", "0"])
    assert "--jobs must be >= 1" in capsys.readouterr().err
