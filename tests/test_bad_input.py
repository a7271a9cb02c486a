"""The bad-input table: every config key, each trace loader and the CLIs.

Each bad value must stop the run before any work with one line naming the key (or the file),
and nothing under the output directory may be created. The loaders' malformed-file cases
(truncated, binary, wrong types, empty) are in ``tests/test_workloads.py``; the report CLI's in
``tests/test_report.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from simlab.run.cli import USER_ERRORS
from simlab.run.simulate import simulate
from tests.fixtures import ROOT, compose

#: (overrides, what the one-line error must say)
BAD_CONFIG = [
    (["seed=-1"], "seed must be a non-negative integer"),
    (["seed=abc"], "seed must be a non-negative integer"),
    (["cache.size_gb=-1"], "cache.size_gb must be a positive number"),
    (["cache.size_gb=abc"], "cache.size_gb must be a positive number"),
    (["cache.size_gb=0.0000001"], "cache.size_gb: smaller than one KV page plus one SSM"),
    (  # a Mooncake id is a 512-token block: 0.06 GB holds no Llama-3-8B page (0.067 GB)
        ["trace=mooncake", "model=llama3_8b", "cache.size_gb=0.06"],
        "cache.size_gb: smaller than one KV page of llama3_8b (0.06711 GB)",
    ),
    (["cache.page_size=0"], "cache.page_size must be an integer >= 1"),
    (["cache.page_size=1.5"], "cache.page_size must be an integer >= 1"),
    (["cache.ssm_gb=-1"], "cache.ssm_gb: the SSM pool must be more than 0"),
    (["cache.size_gb=60"], "cache.size_gb: 60 GB of cache"),
    (["arrivals.mode=foo"], "arrivals.mode must be one of"),
    (["arrivals.session_rate=0"], "arrivals.session_rate must be > 0"),
    (["arrivals.session_rate=fast"], "arrivals.session_rate: must be a number"),
    (["arrivals.think_time_mean=abc"], "arrivals.think_time_mean: must be a number"),
    (["arrivals.azure=foo"], "arrivals.azure: must be one of"),
    (["arrivals.time_scale=0"], "arrivals.time_scale: must be > 0"),
    (["metrics.request_hit_min_tokens=-3"], "metrics.request_hit_min_tokens"),
    (["metrics.request_hit_min_share=2"], "metrics.request_hit_min_share"),
    (["bounds.enabled=maybe"], "bounds.enabled: must be true or false"),
    (["report=maybe"], "report: must be true or false"),
    (["overwrite=maybe"], "overwrite: must be true or false"),
    (["engine.token_budget=0"], "engine.token_budget must be an integer >= 1"),
    (["engine.max_prefill_tokens=1024"], "engine.max_prefill_tokens is SGLang's"),
    (["engine.token_budget=null"], "engine.token_budget=null (chunked prefill off"),
    (["engine.max_running=abc"], "engine.max_running must be an integer >= 1"),
    (["engine.running_memory_gb=-1"], "engine.running_memory_gb must be > 0"),
    (["engine.tp=0"], "engine.tp must be an integer >= 1"),
    (["model=llama3_8b", "engine.tp=3"], "engine.tp: 3 does not divide llama3_8b's 32 attention"),
    (
        ["model=llama3_8b", "model.n_heads=48", "engine.tp=12", "cache.size_gb=inf"],
        "engine.tp: 12 neither divides llama3_8b's 8 KV heads nor is a multiple",
    ),
    (["engine.ssm_chunk=0"], "engine.ssm_chunk must be an integer >= 1"),
    (["engine.typing_wpm=-5"], "engine.typing_wpm must be > 0 or null"),
    (["engine.calibration=/nonexistent.json"], "engine.calibration: calibration file"),
    (["engine.memory_check=maybe"], "engine.memory_check must be true or false"),
    (["engine.costs.state_load_s=inf"], "engine.costs.state_load_s must be finite, got inf"),
    (["engine.costs.iteration_overhead_s=-1"], "engine.costs.iteration_overhead_s must be >= 0"),
    (["+engine.costs.launch_gap_s=1"], "engine.costs.launch_gap_s: unknown key (known: "),
    (["engine.radix_mlp=1"], "engine.radix_mlp must be true or false"),
    (["hardware.peak_tflops=-1"], "hardware.peak_tflops must be a number > 0"),
    (["hardware.mem_gb=abc"], "hardware.mem_gb must be a number > 0"),
    (["model.d_model=-1"], "model.d_model must be > 0"),
    (["model.n_attn_layers=abc"], "model.n_attn_layers must be an integer"),
    (["model.ssm_kind=mamba3"], "model.ssm_kind must be one of"),
    (["+policy=marconi", "policy.alpha=-1"], "policy.alpha must be a finite number >= 0"),
    (["+policy=marconi", "policy.alpha=abc"], "policy.alpha must be a finite number >= 0"),
    (["+policy=sglang_plus", "policy.admission.chunk_size=0"], "admission.chunk_size"),
    (["+policy=sglang_plus", "policy.admission.alignment=foo"], "admission.alignment must be"),
    (["+policy=vllm_plus", "policy.admission.block_size=0"], "admission.block_size must be >= 1"),
    (["+policy=vllm", "policy.block_size=0"], "policy.block_size must be a positive integer"),
    (["+policy=vllm", "policy.mamba_cache_mode=all"], "policy.mamba_cache_mode"),
    (["+policy=sglang", "policy.mamba=ring"], "policy.mamba must be one of"),
    (["+policy=sglang", "policy.admission.tracking_slots=3"], "admission.tracking_slots must"),
    (["trace.limit=-1"], "limit must be >= 1 or null"),
    (["trace.limit=abc"], "trace.limit: must be int"),
    (["trace.min_messages=1.5"], "trace.min_messages: must be int"),
    (["trace=swebench", "trace.truncate_history=maybe"], "trace.truncate_history: must be bool"),
    (["trace=swebench", "trace.path=/nonexistent.tar.gz"], "not found at /nonexistent.tar.gz"),
    (["trace=mooncake", "trace.path=/nonexistent.jsonl"], "not found at /nonexistent.jsonl"),
    (["trace=lmsys", "trace.path=/nonexistent.jsonl"], "not found at /nonexistent.jsonl"),
    (["trace=azure_conv", "trace.path=/nonexistent.csv"], "not found at /nonexistent.csv"),
    (["arrivals.mode=timestamps"], "arrivals.mode=timestamps: "),
    (["output_dir=/proc/simlab"], "output_dir: cannot write to /proc/simlab"),
    (["+cache.bogus=1"], "cache.bogus: unknown key"),
    (["+arrivals.bogus=1"], "arrivals.bogus: unknown key"),
    (["+metrics.bogus=1"], "metrics.bogus: unknown key"),
    (
        ["+policy=marconi", "policy.compat=reference", "model=nemotron_h_8b", "cache.ssm_gb=0.3"],
        "cache.ssm_gb: a separate SSM pool is not supported with the Marconi reference",
    ),
    (
        ["+policy=sglang_plus", "trace.limit=5", "cache.size_gb=inf", "engine.kv_pool=shared"],
        "engine.kv_pool=shared: the pool (cache.size_gb + engine.running_memory_gb) must be",
    ),
    (["+trace.limt=5"], "trace.limt: unknown key for traces.sharegpt"),
    (["engine=offline", "engine.prefix_share=1.5"], "engine.prefix_share must be a number in"),
    (["engine=offline", "engine.prefix_share=-0.1"], "engine.prefix_share must be a number in"),
    (
        ["policy@bounds.clairvoyant=clairvoyant_blocks", "+policy=marconi"],
        "bounds.clairvoyant: 'clairvoyant_blocks' is a bound for Transformers only",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_CONFIG, ids=lambda v: str(v)[:60])
def test_bad_config_is_one_line_naming_the_key_and_writes_nothing(tmp_path, overrides, message):
    out = tmp_path / "out"
    own_out = any(o.startswith("output_dir=") for o in overrides)
    cfg = compose(["report=false", *overrides, *([] if own_out else [f"output_dir={out}"])])
    with pytest.raises(USER_ERRORS) as caught:
        simulate(cfg)
    text = str(caught.value)
    assert message in text and "\n" not in text
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["+policy=nosuch"], "simlab: error: policy: no config 'nosuch' (available: "),
        (["trace=nosuch"], "simlab: error: trace: no config 'nosuch'"),
        (["model=nosuch"], "simlab: error: model: no config 'nosuch'"),
        (["engine=nosuch"], "simlab: error: engine: no config 'nosuch'"),
        (["hardware=nosuch"], "simlab: error: hardware: no config 'nosuch'"),
        (["cache.size_gb=abc"], "simlab: error: cache.size_gb must be a positive number"),
    ],
)
def test_the_command_line_reports_bad_input_in_one_line_with_status_2(tmp_path, args, message):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "simlab", *args, "report=false", f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in proc.stderr
    assert not Path(run_dir, "summary.json").exists()


def test_a_launcher_this_machine_cannot_run_is_refused_in_one_line(tmp_path):
    if shutil.which("srun") is not None:
        pytest.skip("srun exists here: the SLURM launcher can run")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "simlab",
            "-m",
            "hydra/launcher=slurm",
            "cache.size_gb=1,2",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "simlab: error: hydra/launcher=slurm: needs srun (a SLURM cluster), not found here; "
        "the default launcher (joblib) runs a sweep on this machine"
    )
    assert not (tmp_path / "sweep").exists()
