"""Bad input fails before any work, as one line naming the key (issue 18, item 1)."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from simlab.config import ConfigError, MetricSettings, run_settings
from simlab.engines.records import summarize
from simlab.run.cli import reported_as_one_line
from simlab.run.simulate import plan_run, simulate
from tests.fixtures import ROOT, compose


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["arrivals.session_rate=fast"], "arrivals.session_rate: must be a number (got 'fast')"),
        (["arrivals.think_time_mean=abc"], "arrivals.think_time_mean: must be a number"),
        (["arrivals.time_scale=0"], "arrivals.time_scale: must be > 0 (got 0)"),
        (["arrivals.time_scale=abc"], "arrivals.time_scale: must be a number"),
        (["arrivals.azure=foo"], "arrivals.azure: must be one of"),
        (["cache.size_gb=true"], "cache.size_gb"),
        (["+policy=marconi", "policy.alpha=abc"], "policy.alpha must be a finite number"),
        # one 7B-hybrid checkpoint is 26.8 MB: a 1 MB cache could never admit anything
        (["cache.size_gb=0.001"], "cache.size_gb: smaller than one KV page plus one SSM"),
        # llama3_8b: 128 KiB of KV per token, so a 16-token page is 2.1 MB
        (["model=llama3_8b", "cache.page_size=16", "cache.size_gb=0.002"], "one KV page of"),
        (["output_dir=/proc/simlab-x"], "output_dir: cannot write to /proc/simlab-x"),
    ],
)
def test_bad_values_fail_before_work_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        plan_run(compose(overrides))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_smallest_useful_cache_is_accepted():
    plan_run(compose(["cache.size_gb=0.0269"]))  # one checkpoint + one token of KV


def test_user_errors_and_ctrl_c_are_one_line_with_their_exit_status(capsys):
    with pytest.raises(SystemExit) as stop, reported_as_one_line():
        raise ConfigError("cache.size_gb: must be > 0 (got -1)")
    assert stop.value.code == 2
    assert capsys.readouterr().err == "simlab: error: cache.size_gb: must be > 0 (got -1)\n"
    with pytest.raises(SystemExit) as stop, reported_as_one_line():
        raise KeyboardInterrupt
    assert stop.value.code == 130 and capsys.readouterr().err == "simlab: interrupted\n"


def test_the_result_table_has_total_peak_and_no_simulator_speed_column():
    from simlab.run.summary import Summary

    policy = {
        "token_hit_rate": 0.5, "request_hit_rate": 0.9, "flops_saved_ratio": 0.4,
        "peak_kv_gb": 1.5, "peak_ssm_gb": 0.9, "peak_gb": 2.0, "requests_per_s": 12345.6,
    }  # fmt: skip
    lines = Summary(policies={"lru": policy}, trace={}, config={}).table().splitlines()
    assert "peak total GB" in lines[0] and "req/s" not in lines[0]
    assert "2.0000" in lines[1] and "12345" not in lines[1]
    assert lines[-1] == "simulator speed: lru 12,346 req/s"


def test_results_of_other_code_are_neither_resumed_nor_overwritten(tmp_path):
    """Issue 18: resume compared the config only; results of another code version count as
    another run, and a run never writes over them without overwrite=true."""
    import json

    from simlab.run.simulate import saved_config, simulate
    from simlab.run.sweep import finished_summary
    from simlab.util.provenance import code_version

    out = tmp_path / "run"
    cfg = compose(["+policy=sglang_plus", "engine=replay", "trace=chat", "trace.n_sessions=3",
                   "bounds.enabled=false", f"output_dir={out}"])  # fmt: skip
    simulate(cfg)
    assert finished_summary(out, saved_config(cfg), code_version()) is not None
    summary = json.loads((out / "summary.json").read_text())
    summary["provenance"]["code_version"] = "0123abc"
    (out / "summary.json").write_text(json.dumps(summary))
    assert finished_summary(out, saved_config(cfg), code_version()) is None
    with pytest.raises(ConfigError, match=r"another code version \(0123abc -> "):
        simulate(cfg)
    cfg.overwrite = True
    simulate(cfg)
    assert json.loads((out / "summary.json").read_text())["provenance"]["code_version"] != "0123abc"


def test_a_request_hit_needs_the_threshold():
    """A 3-token chat-template prefix is no request hit: the default counts >= 16 tokens."""
    frame = pd.DataFrame(
        {
            "session_id": [0, 0, 1, 2],
            "input_tokens": [100, 100, 100, 1000],
            "hit_tokens": [0, 3, 16, 90],
            "matched_tokens": [0, 3, 16, 90],
            "prefill_flops": [1.0] * 4,
            "flops_saved": [0.0] * 4,
            "kv_bytes_admitted": [0] * 4,
            "ssm_bytes_admitted": [0] * 4,
            "ckpts_admitted": [0] * 4,
            "bytes_evicted": [0] * 4,
            "nodes_evicted": [0] * 4,
            "admission_truncated": [False] * 4,
            "cache_kv_bytes": [0] * 4,
            "cache_ssm_bytes": [0] * 4,
        }
    )
    assert summarize(frame)["request_hit_rate"] == 0.75  # any hit
    assert summarize(frame, 16)["request_hit_rate"] == 0.5
    assert summarize(frame, 16, 0.1)["request_hit_rate"] == 0.25
    assert MetricSettings(16, 0.1).rule == ">= 16 tokens and >= 10% of the input"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("metrics.request_hit_min_tokens=0", "metrics.request_hit_min_tokens"),
        ("metrics.request_hit_min_share=2", "metrics.request_hit_min_share"),
        ("metrics.request_hit_min_share=abc", "metrics.request_hit_min_share"),
    ],
)
def test_bad_metric_settings_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        run_settings(compose([override]))


def test_a_cache_beyond_the_gpus_memory_is_refused_unless_asked_for():
    """60 GB of cache + 16 GB for running sequences + 13 GB of marconi_7b weights > 40 GB."""
    with pytest.raises(
        ConfigError, match=r"cache.size_gb: 60 GB .* exceed 40 GB \(a100_40gb x tp 1\)"
    ):
        plan_run(compose(["cache.size_gb=60"]))
    plan_run(compose(["cache.size_gb=60", "engine.memory_check=false"]))
    plan_run(compose(["cache.size_gb=60", "engine.tp=4"]))
    plan_run(compose(["cache.size_gb=60", "engine=replay"]))  # no GPU in a replay


def test_arrival_errors_name_their_key(tmp_path):
    with pytest.raises(ConfigError, match=r"arrivals\.mode=timestamps: .*ref_timestamp"):
        simulate(compose(["arrivals.mode=timestamps", f"output_dir={tmp_path}", "report=false"]))
    with pytest.raises(
        FileNotFoundError, match=r"arrivals\.azure_path=/nonexistent\.csv was given"
    ):
        simulate(
            compose(
                [
                    "arrivals.mode=azure",
                    "arrivals.azure_path=/nonexistent.csv",
                    f"output_dir={tmp_path}",
                    "report=false",
                ]
            )
        )
    assert not any(tmp_path.iterdir())  # nothing written


def test_traces_describe_reports_an_unknown_trace_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "traces", "describe", "nosuch"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "traces: error: In 'config': Could not find 'trace/nosuch'"
