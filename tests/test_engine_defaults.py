"""The engines' own scheduling defaults on a GPU (:mod:`simlab.engines.timed.defaults`): a timed
run whose settings differ from ``engine.backend``'s says so once and records it."""

from __future__ import annotations

from unittest.mock import ANY

import numpy as np
import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from simlab.engines.timed.defaults import caveat, defaults
from simlab.engines.timed.settings import TimedSettings
from simlab.experiments.predict import predict
from simlab.report.describe import cost_model_note
from simlab.run.plan import plan_run
from simlab.run.policy import run_policy
from tests.fixtures import CONFIGS, compose
from traces.format import Request


@pytest.mark.parametrize(
    ("gpu", "mem_gb", "budget", "running"),
    [
        ("a100_40gb", 40, (2048, 8192), (256,)),
        ("a100_80gb", 80, (2048, 8192), (256,)),  # vLLM keeps A100s on the small defaults
        ("l40s", 48, (2048, 8192), (256,)),
        ("h100_sxm", 80, (8192, 16384), (1024,)),
        ("rtx_pro_6000_server", 96, (8192, 16384), (1024,)),
    ],
)
def test_vllm_sizes_its_batch_by_the_gpus_memory_and_name(gpu, mem_gb, budget, running):
    got = defaults("vllm", gpu, mem_gb)
    assert got["token_budget"] == budget and got["max_running"] == running
    assert got["batching"] == ("mixed",)


@pytest.mark.parametrize(
    ("mem_gb", "chunk"), [(24, 2048), (40, 4096), (48, 4096), (80, 8192), (141, 8192), (180, 16384)]
)
def test_sglang_chunks_by_the_gpus_memory_and_prefills_first(mem_gb, chunk):
    got = defaults("sglang", "gpu", mem_gb)
    assert got == {"token_budget": (chunk,), "batching": ("prefill_first",)}


def test_trtllm_keeps_one_budget_everywhere():
    for mem_gb in (40, 80, 180):
        assert defaults("trtllm", "gpu", mem_gb) == {
            "token_budget": (8192,),
            "max_running": (2048,),
            "batching": ("mixed",),
        }


def test_the_caveat_names_each_key_that_differs_and_nothing_when_they_agree():
    simlab = TimedSettings(max_running=256)  # 8192 tokens, 256 running, mixed
    assert caveat(simlab, "vllm", "a100_40gb", 40) is None  # vLLM's LLM class on an A100
    line = caveat(simlab, "vllm", "h100_sxm", 80)
    assert line is not None and "engine.max_running=256 (vllm: 1024)" in line
    assert "token_budget" not in line and "batching" not in line
    line = caveat(simlab, "sglang", "b200_sxm", 180)
    assert line is not None
    assert "engine.token_budget=8192 (sglang: 16384)" in line
    assert "engine.batching=mixed (sglang: prefill_first)" in line
    as_sglang = TimedSettings(token_budget=16384, batching="prefill_first", max_running=256)
    assert caveat(as_sglang, "sglang", "b200_sxm", 180) is None


def test_a_run_off_its_engines_defaults_says_so_once_and_records_it(caplog):
    run = ["+policy=fifo", "engine=timed", "hardware=h100_sxm"]
    with caplog.at_level("WARNING"):
        plan = plan_run(compose([*run, "engine.max_running=256"]))
    line = plan.config["engine_defaults"]
    assert "engine.max_running=256 (vllm: 1024)" in line
    assert [r.getMessage() for r in caplog.records].count(line) == 1
    assert line in cost_model_note(plan.config)
    assert "engine_defaults" not in plan_run(compose(run)).config


@pytest.mark.parametrize(
    ("hardware", "backend", "cap"),
    [
        ("h100_sxm", "vllm", 1024),
        ("a100_40gb", "vllm", 256),
        ("a100_80gb", "vllm", 256),
        ("h100_sxm", "sglang", 2048),
        ("b200_sxm", "trtllm", 2048),
    ],
)
def test_a_null_running_cap_is_the_engines_own_and_is_recorded(hardware, backend, cap):
    overrides = ["+policy=fifo", "engine=timed", f"hardware={hardware}"]
    plan = plan_run(compose([*overrides, f"engine.backend={backend}"]))
    assert plan.engine.max_running == cap
    assert plan.config["engine"]["max_running"] == cap  # summary.json: the value the run used
    assert plan.config["engine_resolved"] == {"max_running": f"{backend}'s default on {hardware}"}
    explicit = plan_run(compose([*overrides, f"engine.backend={backend}", "engine.max_running=64"]))
    assert explicit.engine.max_running == 64 and "engine_resolved" not in explicit.config


def test_a_prediction_names_the_chunk_size_its_engine_would_use(caplog):
    """``simlab.predict`` compares the settings a prefill depends on (the token budget and the
    batching), not the running-request cap: on an H100 vLLM's server chunks at 8,192 as simlab
    does, SGLang's scheduler prefills first, and both are said where they differ."""

    def config(overrides: list[str]):
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            return hydra_compose(config_name="predict", overrides=overrides)

    base = ["model=llama3_8b", "hardware=h100_sxm", "prefill=[1000]"]
    assert predict(config(base))["engine_defaults"] is None  # max_running is not compared
    with caplog.at_level("WARNING"):
        line = predict(config([*base, "engine.backend=sglang", "engine.token_budget=4096"]))[
            "engine_defaults"
        ]
    assert "engine.token_budget=4096 (sglang: 8192)" in line
    assert "engine.batching=mixed (sglang: prefill_first)" in line
    assert [r.getMessage() for r in caplog.records].count(line) == 1


def replayed_hits(*extra: str) -> tuple[list[int], dict]:
    """A hybrid's hits under ``policy=vllm`` on the replay engine: a 2,500-token system prompt
    and 1,500-token questions, states kept every 1,040 tokens where a step ends there."""
    system = np.arange(1, 2501, dtype=np.int32)
    requests = [
        Request(
            i, i, 0, 100.0 * i,
            np.concatenate((system, np.arange(1500, dtype=np.int32) + 20_000 + 2000 * i)),
            np.arange(10_000 + 50 * i, 10_008 + 50 * i, dtype=np.int32), 8,
        )
        for i in range(4)
    ]  # fmt: skip
    run = ["+policy=vllm", "model=nemotron_h_8b", "engine=replay", "cache.size_gb=5"]
    retention = "policy.prefix_cache_retention_interval=1040"
    plan = plan_run(compose([*run, retention, "report=false", "bounds.enabled=false", *extra]))
    ((_, spec),) = plan.policies.items()
    done = run_policy(spec, requests, plan.model, plan.settings, plan.engine, 1)
    return [int(h) for h in done.records["hit_tokens"]], plan.config


def test_the_replay_engines_pool_prefills_at_vllm_serves_budget_on_the_gpu():
    """``engine.token_budget=null`` on the replay engine is what ``vllm serve`` takes on the
    run's GPU: 8,192 tokens a step on an H100, where the first prompt is one step and leaves
    no state at 2,080 for the second to hit; 2,048 on an A100 and where set, where a step ends
    at 2,048 and keeps it. The budget it took is recorded with whose it is."""
    h100, config = replayed_hits("hardware=h100_sxm")
    assert h100 == [0, 0, 2080, 2080]
    assert config["engine"]["token_budget"] == 8192
    assert config["engine_resolved"] == {
        "token_budget": "vllm serve's default on h100_sxm (80 GiB)"
    }
    a100, config = replayed_hits("hardware=a100_80gb")
    assert a100 == [0, 2080, 2080, 2080] and config["engine"]["token_budget"] == 2048
    assert replayed_hits("hardware=h100_sxm", "engine.token_budget=2048") == (a100, ANY)
    # a preset that leaves its memory to aiconfigurator-core's systems file (180 GiB)
    b200 = ["+policy=vllm", "model=nemotron_h_8b", "engine=replay", "hardware=b200_sxm"]
    assert plan_run(compose([*b200, "report=false"])).config["engine"]["token_budget"] == 8192


def test_a_replay_off_vllms_pool_records_no_budget():
    run = ["+policy=sglang_plus", "engine=replay", "hardware=h100_sxm", "report=false"]
    config = plan_run(compose(run)).config
    assert "engine_resolved" not in config and config["engine"]["token_budget"] is None
