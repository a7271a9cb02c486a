"""``python -m simlab.predict measured.path=FILE``: the prediction checked against a table of
measured prefill times, row by row (:mod:`simlab.experiments.measured`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from gpu_validate.cases import FULL, load_hardware, load_model
from gpu_validate.fit import run_fit
from gpu_validate.report import build_report
from gpu_validate.synth import synthetic_records, write_synthetic
from simlab.config import ConfigError
from simlab.experiments.measured import BANDS
from simlab.experiments.predict import predict
from tests.fixtures import CONFIGS, ROOT


def config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="predict", overrides=overrides)


def write(path: Path, rows: dict[str, list]) -> Path:
    frame = pd.DataFrame(rows)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True, double_precision=15)
    else:
        frame.to_parquet(path)
    return path


def predicted_ms(overrides: list[str]) -> list[float]:
    return predict(config(overrides))["prefill_ms"]


def test_rows_predicted_as_prefill_would_predict_them(tmp_path):
    """Each row is predicted exactly as ``prefill=[tokens - prefix] prefix=... engine.tp=...``
    predicts it: measured times equal to those predictions have no error, at several prefixes
    and tensor-parallel degrees in one table."""
    base = ["model=nemotron_h_8b", "hardware=h100_sxm"]
    cases = [(1, 0, [300, 5000]), (2, 0, [300, 20000]), (2, 4000, [500])]
    tokens, prefixes, tps, times = [], [], [], []
    for tp, prefix, news in cases:
        ms = predicted_ms([*base, f"engine.tp={tp}", f"prefix={prefix}", f"prefill={news}"])
        tokens += [prefix + n for n in news]
        prefixes += [prefix] * len(news)
        tps += [tp] * len(news)
        times += ms
    table = write(
        tmp_path / "ttft.csv",
        {"prompt_tokens": tokens, "cached": prefixes, "gpus": tps, "ttft_ms": times},
    )
    out = predict(
        config([*base, f"measured.path={table}", "measured.prefix=cached", "measured.tp=gpus"])
    )["measured"]
    assert out["predicted_ms"] == times  # bit for bit
    assert out["measured_ms"] == pytest.approx(times, rel=1e-14)  # through the CSV's text
    assert out["error"]["mape"] < 1e-14 and out["error"]["median_ratio"] == pytest.approx(1.0)
    assert out["tp"] == tps and out["prefix_tokens"] == prefixes and out["rows"] == 5
    # the same rows at the configured prefix and degree are other predictions
    plain = predict(config([*base, f"measured.path={table}"]))["measured"]
    assert plain["error"]["mape"] > 0.01


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_the_error_is_predicted_over_measured_per_length_band(tmp_path, suffix):
    """Measured twice the prediction: every ratio 0.5, MAPE 50%, a signed error of -50%; a
    band's edge is inclusive (64 and 65 tokens fall in two bands)."""
    lengths = [64, 65, 3000, 40000]
    ms = predicted_ms([f"prefill={lengths}"])
    table = write(tmp_path / f"ttft{suffix}", {"n": lengths, "secs": [2 * t / 1000 for t in ms]})
    out = predict(
        config(
            [
                f"prefill={lengths}",
                f"measured.path={table}",
                "measured.tokens=n",
                "measured.time=secs",
                "measured.unit=s",
            ]
        )
    )["measured"]
    assert out["error"]["median_ratio"] == pytest.approx(0.5, rel=1e-12)
    assert out["error"]["mape"] == pytest.approx(0.5, rel=1e-12)
    assert out["error"]["mean_signed"] == pytest.approx(-0.5, rel=1e-12)
    assert out["measured_ms"] == pytest.approx([2 * t for t in ms], rel=1e-12)
    bands = {b["prompt_tokens"]: b["rows"] for b in out["by_length"]}
    assert bands == {"1-64": 1, "65-512": 1, "2,049-8,192": 1, f"> {BANDS[-1]:,}": 1}


def test_errors_of_mixed_rows(tmp_path):
    """Ratios 0.8, 1.0 and 1.5: MAPE (0.2 + 0 + 0.5) / 3, median |error| 0.2, median ratio 1."""
    lengths = [1000, 2000, 4000]
    ms = predicted_ms([f"prefill={lengths}"])
    measured = [ms[0] / 0.8, ms[1], ms[2] / 1.5]
    table = write(tmp_path / "t.csv", {"prompt_tokens": lengths, "ttft_ms": measured})
    error = predict(config([f"measured.path={table}"]))["measured"]["error"]
    assert error["mape"] == pytest.approx(0.7 / 3)
    assert error["median_abs"] == pytest.approx(0.2)
    assert error["median_ratio"] == pytest.approx(1.0)
    assert error["p90_abs"] == pytest.approx(0.2 + 0.8 * 0.3)  # linear between 0.2 and 0.5


@pytest.mark.parametrize(
    ("rows", "overrides", "message"),
    [
        (None, [], "measured.path: no such file"),
        ({"prompt_tokens": [100], "ttft_ms": [1.0]}, ["measured.unit=us"], "measured.unit"),
        ({"tokens": [100], "ttft_ms": [1.0]}, [], "measured.tokens: column 'prompt_tokens'"),
        ({"prompt_tokens": [100], "ms": [1.0]}, [], "measured.time: column 'ttft_ms'"),
        ({"prompt_tokens": [100, 200], "ttft_ms": [1.0, 0.0]}, [], "measured.time: row 2"),
        ({"prompt_tokens": [100, 200], "ttft_ms": [1.0, None]}, [], "measured.time: row 2"),
        ({"prompt_tokens": [100.5], "ttft_ms": [1.0]}, [], "measured.tokens: row 1"),
        ({"prompt_tokens": [0], "ttft_ms": [1.0]}, [], "measured.tokens: row 1"),
        (
            {"prompt_tokens": [100, 200], "p": [10, 200], "ttft_ms": [1.0, 2.0]},
            ["measured.prefix=p"],
            "measured.prefix: row 2 of .* caches 200 of its 200",
        ),
        ({"prompt_tokens": [100], "ttft_ms": [1.0]}, ["measured.prefix=p"], "measured.prefix"),
        (
            {"prompt_tokens": [100, 200], "tp": [1, 3], "ttft_ms": [1.0, 2.0]},
            ["measured.tp=tp"],
            "measured.tp: row 2 of .*: engine.tp: 3 does not divide",
        ),
        ({"prompt_tokens": [100], "ttft_ms": [1.0]}, ["+measured.ttft=x"], "measured.ttft"),
        ({"prompt_tokens": [], "ttft_ms": []}, [], "has no rows"),
    ],
)
def test_bad_tables_are_one_line_errors_naming_the_key_and_file(tmp_path, rows, overrides, message):
    path = tmp_path / "ttft.csv"
    if rows is not None:
        write(path, rows)
    with pytest.raises(ConfigError, match=message) as err:
        predict(config([f"measured.path={path}", *overrides]))
    assert "\n" not in str(err.value)


def test_unknown_formats_and_unreadable_files_are_named(tmp_path):
    other = tmp_path / "ttft.xlsx"
    other.write_text("x")
    with pytest.raises(ConfigError, match="unknown table format"):
        predict(config([f"measured.path={other}"]))
    broken = tmp_path / "ttft.parquet"
    broken.write_bytes(b"PAR1 not parquet")
    with pytest.raises(ConfigError, match=f"measured.path: {broken} cannot be read as parquet"):
        predict(config([f"measured.path={broken}"]))


def test_the_command_prints_the_comparison_and_writes_it(tmp_path):
    ms = predicted_ms(["prefill=[1000,8000]"])
    table = write(
        tmp_path / "ttft.csv", {"prompt_tokens": [1000, 8000], "ttft_ms": [2 * t for t in ms]}
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "simlab.predict",  # the documented command (the shim of simlab.experiments.predict)
            "prefill=[1000]",
            f"measured.path={table}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"measured: {table}, 2 rows (prompts of 1,000-8,000 tokens): MAPE 50.0%" in proc.stdout
    saved = json.loads((tmp_path / "run" / "prediction.json").read_text())
    assert saved["measured"]["rows"] == 2 and saved["prefill_tokens"] == [1000]
    assert predict(config([]))["measured"] is None


def test_gpu_validates_stack_table_is_predicted_as_the_report_predicts_it(tmp_path):
    """``gpu_validate report``'s ``stack_prefill.csv`` (the composed stack's measured prefills,
    here synthetic records), checked with the run's model, GPU and calibration, one iteration
    per prompt: every row predicted bit for bit as the report predicts its record (two paths to
    one cost model: the ops the record carries, and the batch simlab.experiments.predict builds), so the
    error is the report's. (Not in ``test_gpu_validate.py``: that one runs on the GPU image,
    which has no Hydra.)"""
    runs = tmp_path / "run"
    records = synthetic_records(
        load_model("nemotron_h_8b"), load_hardware("h100_sxm"), "h100_sxm", noise=0.03, seed=1
    )
    write_synthetic(runs, records)
    calibration = tmp_path / "calibration.json"
    run_fit([runs], calibration)
    build_report([runs], calibration, tmp_path / "report")
    table = tmp_path / "report" / "stack_prefill.csv"
    rows = pd.read_csv(table)
    assert list(zip(rows.prompt_tokens, rows.prefix_tokens, strict=True)) == [
        (n, round(n * hit)) for n in FULL.stack_len for hit in FULL.stack_hits
    ]
    report = pd.read_csv(tmp_path / "report" / "predictions.csv")
    stack = report[report.label.str.startswith("stack_prefill")]
    out = predict(
        config(
            [
                "model=nemotron_h_8b",
                "hardware=h100_sxm",
                f"engine.calibration={calibration}",
                "engine.kernels=roofline",  # gpu_validate's report predicts on the calibration
                f"engine.token_budget={max(FULL.stack_len)}",
                f"measured.path={table}",
                "measured.prefix=prefix_tokens",
            ]
        )
    )["measured"]
    assert out["predicted_ms"] == (1000 * stack.cal_s).tolist()
    assert out["measured_ms"] == pytest.approx((1000 * stack.measured_s).tolist())
    assert out["error"]["median_abs"] == pytest.approx(np.median(np.abs(stack.cal_err)))


@pytest.mark.parametrize(
    "overrides",
    [
        ["engine.token_budget=2048"],  # the last chunk attends to a cached prefix: modelled
        ["engine.token_budget=2048", "engine.max_prefill_tokens=1024",
         "engine.request_admission=sglang", "engine.kv_pool=shared"],
        ["model=nemotron_h_8b", "hardware=h100_sxm"],  # the SSD scan: bounded
    ],
)  # fmt: skip
def test_the_range_with_the_unmeasured_ops_at_their_bounds_holds_the_prediction(overrides):
    """Each iteration moves only the ops unmeasured in it: an op measured in one chunk (equal
    chunks, no prefix) and modelled in another used to move in all, and the range of three
    3,000-token prompts at a 2,048-token budget missed the prediction (535.5-553.8 ms around
    562.1)."""
    out = predict(config(["model=llama3_8b", "prefill=[3000]", "batch=3", *overrides]))
    ((low, high),) = out["unmeasured"]["prefill_ms"]
    assert low <= out["prefill_ms"][0] <= high and low < high
