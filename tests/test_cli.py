"""The command line as users type it, and clear errors on bad input before any work."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from tests.fixtures import ROOT

POLICIES = sorted(p.stem for p in (ROOT / "configs" / "policy").glob("*.yaml"))


def simlab(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    run_dir = tmp_path / "run"
    report = [] if any(a.startswith("report=") for a in args) else ["report=false"]
    cmd = [sys.executable, "-m", "simlab", *args, *report, f"hydra.run.dir={run_dir}"]
    full_env = os.environ | {"HYDRA_FULL_ERROR": "0"} | (env or {})
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=full_env, timeout=600)


def test_one_policy_on_swebench(tmp_path):
    proc = simlab(
        tmp_path,
        "+policy=marconi",
        "trace=swebench",
        "cache.size_gb=60",
        "hardware=h200",
        "trace.limit=3",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert list(summary["policies"]) == ["marconi"]
    assert "compare" not in summary["config"] and summary["provenance"]["simlab_version"]
    assert summary["trace"]["sessions"] == 3
    assert "ref_cached_share" in summary["trace"]
    records = pd.read_parquet(tmp_path / "run" / "records.parquet")
    assert len(records) == summary["trace"]["requests"]
    assert "marconi" in proc.stdout


def test_no_config_sets_hydra_mode_so_python_m_simlab_composes_once():
    """``python -m simlab`` skips Hydra's first compose, which only reads ``hydra.mode``
    (``simlab.run.cli.compose_once``): right while no config of simlab's sets the mode."""
    import yaml

    configs = ROOT / "configs"
    files = sorted(configs.rglob("*.yaml"))
    assert any(p.parts[-3:-1] == ("hydra", "launcher") for p in files)  # the check sees them
    for path in files:
        data = yaml.safe_load(path.read_text()) or {}
        under_hydra = path.relative_to(configs).parts[0] == "hydra"
        mode = data.get("mode") if under_hydra else (data.get("hydra") or {}).get("mode")
        assert mode is None, f"{path} sets hydra.mode"


def test_no_policy_compares_the_standard_set(tmp_path):
    proc = simlab(tmp_path, "trace=sharegpt", "cache.size_gb=2", "trace.limit=8", "report=true")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "report.pdf").stat().st_size > 10_000
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["policies"]) == {"vllm_plus", "sglang_plus", "marconi"}
    records = pd.read_parquet(tmp_path / "run" / "records.parquet")
    assert set(records["policy"]) == set(summary["policies"])
    for line in ("vllm_plus", "sglang_plus", "marconi"):
        assert line in proc.stdout


def test_plain_policy_override_is_rejected_with_a_hint(tmp_path):
    proc = simlab(tmp_path, "policy=marconi")
    assert proc.returncode != 0
    assert "+policy=marconi" in proc.stderr


def _malformed_tar(data_dir: Path) -> None:
    path = data_dir / "swe_agent" / "mini_swe_agent_gemini3pro_trajs.tar.gz"
    path.parent.mkdir(parents=True)
    payload = b'{"messages": [{"role": "system", "content": "x"'  # truncated JSON
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("trajs/bad__inst-1/bad__inst-1.traj.json")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["+policy=nope"], "policy: no config 'nope' (available: "),
        (["trace=nope"], "trace: no config 'nope' (available: "),
        (["cache.size_gb=0"], "cache.size_gb must be a positive"),
        (["cache.size_gb=-5"], "cache.size_gb must be a positive"),
        (["+policy=marconi", "policy.alpha=-1"], "policy.alpha must be"),
        (["arrivals.session_rate=0"], "arrivals.session_rate"),
        (["trace=swebench", "data_dir=/nonexistent/simlab-data"], "mini-swe-agent"),
    ],
)
def test_bad_input_fails_clearly_before_work(tmp_path, args, message):
    proc = simlab(tmp_path, *args)
    assert proc.returncode == 2 and proc.stderr.startswith("simlab: error: ")
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "summary.json").exists()
    assert "Traceback" not in proc.stderr


def test_malformed_trajectory_names_the_file(tmp_path):
    _malformed_tar(tmp_path / "data")
    proc = simlab(
        tmp_path,
        "trace=swebench",
        f"data_dir={tmp_path / 'data'}",
        env={"SIMLAB_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode != 0
    assert "bad__inst-1.traj.json" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_same_config_and_seed_give_identical_records(tmp_path):
    args = ("trace=sharegpt", "cache.size_gb=1", "trace.limit=6", "seed=7")
    a = simlab(tmp_path / "a", *args)
    b = simlab(tmp_path / "b", *args)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    bytes_a = (tmp_path / "a" / "run" / "records.parquet").read_bytes()
    bytes_b = (tmp_path / "b" / "run" / "records.parquet").read_bytes()
    assert bytes_a == bytes_b
    c = simlab(tmp_path / "c", *args[:-1], "seed=8")
    frame_a = pd.read_parquet(tmp_path / "a" / "run" / "records.parquet")
    frame_c = pd.read_parquet(tmp_path / "c" / "run" / "records.parquet")
    assert not frame_a["arrival"].equals(frame_c["arrival"]), c.stderr


def _strict(text: str) -> dict:
    """JSON as RFC 8259 defines it: NaN and Infinity are not numbers there."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not valid JSON")

    return json.loads(text, parse_constant=refuse)


def test_summary_is_strict_json_for_an_infinite_cache_and_a_zero_bound(tmp_path):
    # every request its own blocks: nothing is shared, every bound is 0, so hit_vs_* has no
    # value (was NaN) and the cache size is infinite (was Infinity); both invalid JSON
    trace = tmp_path / "unshared.jsonl"
    lines = [
        json.dumps({"timestamp": i, "input_length": 40, "output_length": 2, "hash_ids": [i]})
        for i in range(6)
    ]
    trace.write_text("\n".join(lines) + "\n")
    proc = simlab(
        tmp_path, "trace=mooncake", f"trace.path={trace}", "cache.size_gb=inf", "+policy=vllm"
    )
    assert proc.returncode == 0, proc.stderr
    summary = _strict((tmp_path / "run" / "summary.json").read_text())
    assert summary["bounds"] == {"infinite": 0.0, "clairvoyant": 0.0}
    assert summary["policies"]["vllm"]["hit_vs_infinite"] is None
    assert float(summary["config"]["cache"]["size_gb"]) == float("inf")
    assert "n/a" in proc.stdout


def test_output_dir_holds_every_file_and_nothing_goes_to_outputs(tmp_path):
    """``output_dir=`` is where Hydra's own files go too: nothing appears in ``./outputs``."""
    work, out = tmp_path / "work", tmp_path / "results"
    work.mkdir()
    cmd = [sys.executable, "-m", "simlab", "+policy=marconi", "trace=swebench", "trace.limit=2"]
    cmd += ["cache.size_gb=60", "hardware=h200", "report=false", f"output_dir={out}"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert list(work.iterdir()) == []
    assert {".hydra", "summary.json", "records.parquet"} <= {p.name for p in out.iterdir()}


def test_compare_picks_the_policy_set(tmp_path):
    proc = simlab(
        tmp_path,
        "compare=[vllm,marconi,sglang]",
        "trace=swebench",
        "trace.limit=2",
        "cache.size_gb=60",
        "hardware=h200",
        "engine=replay",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert sorted(summary["policies"]) == ["marconi", "sglang", "vllm"]


def test_compare_with_an_unknown_policy_is_one_line(tmp_path):
    proc = simlab(tmp_path, "compare=[vllm,nope]")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"simlab: error: policy: no config 'nope' (available: {', '.join(POLICIES)})"
    ]
