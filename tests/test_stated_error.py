"""The stated error of a timed run's latencies (``simlab/engines/timed/stated.py``): what the
silicon validation measured per engine, written by ``python -m simlab.validate state DIR``,
recorded in each timed run's ``summary.json`` and printed with its results."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from simlab.config import ConfigError
from simlab.engines.timed import stated
from simlab.experiments import silicon_run
from simlab.experiments.silicon_fit import by_engine
from simlab.report import run_pages
from simlab.report.describe import NOT_VALIDATED
from simlab.report.load import load_run
from simlab.report.style import palette
from simlab.run.simulate import simulate
from tests.fixtures import compose

DOCS = Path(__file__).resolve().parents[1] / "docs" / "validation" / "silicon.md"
QWEN, LLAMA = "Qwen/Qwen3.5-397B-A17B", "meta-llama/Llama-3.1-70B"


def row(backend: str, model: str, system: str, measured: float, held: float, inside: float):
    """A ``validation.json`` row: TTFT and TPOT measured, held out and in sample (ms)."""
    return {
        "backend": backend,
        "model": model,
        "system": system,
        "ttft_ms": measured,
        "tpot_ms": measured / 10,
        "ttft_ms_held_out": held,
        "tpot_ms_held_out": held / 10,
        "ttft_ms_in_sample": inside,
        "tpot_ms_in_sample": inside / 10,
    }


ROWS = [
    row("sglang", QWEN, "b200_sxm", 100.0, 150.0, 110.0),
    row("sglang", LLAMA, "h200_sxm", 200.0, 100.0, 220.0),
    row("sglang", LLAMA, "b200_sxm", 100.0, 100.0, 100.0),
    row("vllm", LLAMA, "h100_sxm", 50.0, 40.0, 50.0),
]
OVERHEADS = {"sglang": {"in_sample": [0.001, 0.17]}, "vllm": {"in_sample": [0.0005, 0.03]}}


def test_each_engine_states_its_points_errors_and_what_they_cover():
    """sglang: |errors| 0.5, 0.5, 0 held out (mean 1/3, median 0.5), 0.1, 0.1, 0 in sample; the
    hybrid among its models; the overheads fitted on all its points."""
    found = by_engine(ROWS, OVERHEADS)
    sglang = found["sglang"]
    assert sglang["points"] == 3
    assert sglang["ttft_mape_held_out"] == pytest.approx(1 / 3)
    assert sglang["ttft_median_held_out"] == pytest.approx(0.5)
    assert sglang["tpot_mape_held_out"] == pytest.approx(1 / 3)
    assert sglang["ttft_mape_in_sample"] == pytest.approx(0.2 / 3)
    assert sglang["models"] == [QWEN, LLAMA]
    assert sglang["hybrid_models"] == [QWEN]
    assert sglang["gpus"] == ["b200_sxm", "h200_sxm"]
    assert sglang["overheads_s"] == {"iteration": 0.001, "request": 0.17}
    assert found["vllm"]["ttft_mape_held_out"] == pytest.approx(0.2)


def test_state_writes_a_silicon_runs_errors_and_the_code_that_simulated_them(tmp_path):
    header = {"code_version": "abc", "aiconfigurator_core": "0.12.0"}
    (tmp_path / "points.jsonl").write_text(json.dumps(header) + "\n")
    group = {"points": 1, "ttft_mape_held_out": 0.5, "tpot_mape_held_out": 0.5, "other": 0}
    result = {"ttft_mape_held_out": 0.3, "tpot_mape_held_out": 0.2, "rows": ROWS}
    result["groups"] = {f"{QWEN} x b200_sxm x sglang": group}
    (tmp_path / "validation.json").write_text(json.dumps(result | {"overheads_s": OVERHEADS}))
    to = tmp_path / "stated.json"
    assert silicon_run.main(["state", str(tmp_path), "--to", str(to)]) == 0
    table = json.loads(to.read_text())
    assert table["code_version"] == "abc" and table["points"] == 4
    assert table["engines"] == by_engine(ROWS, OVERHEADS)
    kept = {"points": 1, "ttft_mape_held_out": 0.5, "tpot_mape_held_out": 0.5}
    assert table["groups"] == {f"{QWEN} x b200_sxm x sglang": kept}
    assert silicon_run.main(["state", str(tmp_path / "missing"), "--to", str(to)]) == 2


def test_the_shipped_errors_are_the_validation_pages():
    """``stated_error.json`` and docs/validation/silicon.md give the same overall and per-engine
    held-out errors (one is not rerun without the other)."""
    table = stated.table()
    assert table is not None
    text = DOCS.read_text()
    overall = re.search(
        r"\| \*\*overall\*\* \| (\d+) \| \*\*([\d.]+)%\*\*.*?\| \*\*([\d.]+)%\*\*", text
    )
    assert overall is not None
    assert int(overall[1]) == table["points"]
    assert float(overall[2]) == round(100 * table["ttft_mape_held_out"], 1)
    assert float(overall[3]) == round(100 * table["tpot_mape_held_out"], 1)
    by = re.search(
        r"By engine, held out: vLLM ([\d.]+)% \((\d+) points\), SGLang ([\d.]+)% \((\d+)\), "
        r"TensorRT-LLM\s+([\d.]+)% \((\d+)\); TPOT ([\d.]+)%, ([\d.]+)% and ([\d.]+)%",
        text,
    )
    assert by is not None
    for i, engine in enumerate(("vllm", "sglang", "trtllm")):
        e = table["engines"][engine]
        assert float(by[1 + 2 * i]) == round(100 * e["ttft_mape_held_out"], 1)
        assert int(by[2 + 2 * i]) == e["points"]
        assert float(by[7 + i]) == round(100 * e["tpot_mape_held_out"], 1)


def test_a_run_of_a_validated_model_and_gpu_at_the_fitted_overheads_says_so():
    fitted = stated.table()["engines"]["sglang"]["overheads_s"]  # type: ignore[index]
    overheads = (fitted["iteration"], fitted["request"])
    error = stated.stated_error("sglang", QWEN, "b200_sxm", overheads, kernels=True, hybrid=True)
    assert error["model_among_them"] and error["gpu_among_them"] and error["overheads_as_fitted"]
    assert error["hybrid_among_them"]
    line = stated.line(error)
    sglang = stated.table()["engines"]["sglang"]  # type: ignore[index]
    held_out = f"{100 * sglang['ttft_mape_held_out']:.0f}%"  # the shipped figure, rounded
    assert line.startswith(f"stated latency error (sglang): TTFT {held_out} MAPE held out")
    assert "not among" not in line and "not this run's" not in line
    group = stated.table()["groups"][f"{QWEN} x b200_sxm x sglang"]  # type: ignore[index]
    assert error["this_model_and_gpu"] == group
    assert f"on this model and GPU, {100 * group['ttft_mape_held_out']:.0f}%" in line
    other = stated.line(stated.stated_error("sglang", LLAMA, "a100_sxm", (0, 0), kernels=True))
    assert "this run's model and GPU not among them;" in other  # not a hybrid: nothing more
    assert f"{overheads[1]:g} s a request, not this run's (engine.overheads=fitted" in other


def test_a_timed_run_records_and_prints_its_stated_error(tmp_path):
    """On measured kernels: vLLM's figures, the model and GPU (Marconi's 7B hybrid on A100)
    outside them; on the roofline alone: none stated."""
    base = ["+policy=vllm", "engine=timed", "trace.limit=40", "bounds.enabled=false"]
    base += ["report=false", "reuse_breakdown=false"]
    for kernels in ("measured", "roofline"):
        out = tmp_path / kernels
        summary = simulate(compose([*base, f"engine.kernels={kernels}", f"output_dir={out}"]))
        error = json.loads((out / "summary.json").read_text())["policies"]["vllm"]["latency_error"]
        if kernels == "measured":
            assert error["validated"] and error["engine"] == "vllm"
            assert not error["model_among_them"] and not error["gpu_among_them"]
            assert not error["hybrid_among_them"]  # vLLM's points are Llama-3.1-70B's alone
            shipped = stated.table()["engines"]["vllm"]  # type: ignore[index]
            ttft = f"TTFT {100 * shipped['ttft_mape_held_out']:.0f}% MAPE"
            assert f"stated latency error (vllm): {ttft}" in summary.table()
            assert "not among them, nor any hybrid model" in summary.table()
            run = load_run(out)  # the report's TTFT page says it, not that nothing was validated
            page = run_pages.ttft_page(run, run_pages.Style("", palette(run.policies), None))
            title = page.axes[0].get_title()
            assert "stated latency error (vllm)" in title.replace("\n", " ")
            assert NOT_VALIDATED.strip("; ") not in title.replace("\n", " ")
        else:
            assert not error["validated"]
            assert "latency error not stated: engine.kernels=roofline" in summary.table()


def test_fitted_overheads_run_at_the_values_their_error_was_stated_with(tmp_path):
    """``engine.overheads=fitted``: the engine's fitted seconds an iteration and a request
    time the run, are recorded as resolved in its config, and its stated error says they are
    the fitted ones; the same run at the defaults takes longer to nothing less than those
    seconds on every TTFT."""
    base = ["+policy=sglang", "engine=timed", "engine.backend=sglang", "trace.limit=40"]
    base += ["bounds.enabled=false", "report=false", "reuse_breakdown=false"]
    fitted = stated.table()["engines"]["sglang"]["overheads_s"]  # type: ignore[index]
    runs = {}
    for overheads in ("none", "fitted"):
        out = tmp_path / overheads
        simulate(compose([*base, f"engine.overheads={overheads}", f"output_dir={out}"]))
        runs[overheads] = json.loads((out / "summary.json").read_text())
    config, error = runs["fitted"]["config"], runs["fitted"]["policies"]["sglang"]["latency_error"]
    assert config["engine"]["request_overhead_s"] == fitted["request"] > 0
    assert config["engine"]["costs"]["iteration_overhead_s"] == fitted["iteration"] > 0
    assert config["engine_resolved"]["request_overhead_s"].startswith("engine.overheads=fitted")
    assert "engine_overheads" not in config  # the zero-overhead caveat is gone
    assert (
        error["overheads_as_fitted"]
        and not runs["none"]["policies"]["sglang"]["latency_error"]["overheads_as_fitted"]
    )
    assert "engine_overheads" in runs["none"]["config"]
    slower = (
        runs["fitted"]["policies"]["sglang"]["ttft_p50"]
        - runs["none"]["policies"]["sglang"]["ttft_p50"]
    )
    assert slower >= fitted["request"]


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("engine.kernels=roofline", "engine.kernels=roofline"),
        ("engine.request_overhead_s=0.1", "engine.request_overhead_s"),
        ("engine.costs.iteration_overhead_s=0.002", "engine.costs.iteration_overhead_s"),
    ],
)
def test_fitted_overheads_refuse_a_run_they_would_not_describe(tmp_path, override, names):
    cfg = compose(["engine=timed", "engine.overheads=fitted", override, f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=re.escape(names)):
        simulate(cfg)
    bad = compose(["engine=timed", "engine.overheads=yes", f"output_dir={tmp_path}"])
    with pytest.raises(
        ConfigError, match=re.escape("engine.overheads must be none | fitted, got 'yes'")
    ):
        simulate(bad)
