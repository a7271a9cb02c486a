"""The memory check charges what the chosen pool reserves, and a setting that disables reuse
says so (issue 78, cases 4 and 5).

An H100 (80 GB) holds nemotron_h_8b's 16.2 GB of weights: on vLLM's own block pool running
sequences take their blocks from the cache, so 55 GB of cache fits; on the prefix tree the
16 GB ``engine.running_memory_gb`` reserve comes on top and 55 GB does not."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from simlab.config import ConfigError
from simlab.engines.base import MemoryChecked
from simlab.run.plan import plan_run
from simlab.run.simulate import run_plan
from tests.fixtures import compose

H100_VLLM = ["+policy=vllm", "model=nemotron_h_8b", "hardware=h100_sxm", "trace.limit=3"]
BIG = "cache.size_gb=55"


@pytest.mark.parametrize("engine", ["engine=timed", "engine=replay"])
def test_vllm_pool_on_a_hybrid_is_charged_the_pool_only(engine):
    overrides = [*H100_VLLM, engine, BIG]
    if engine == "engine=timed":
        overrides.append("engine.running_memory_gb=16")
    plan = plan_run(compose(overrides))
    assert plan.settings.cache.size_gb == 55


def test_no_running_reserve_is_valid_on_vllms_pool():
    plan = plan_run(compose([*H100_VLLM, BIG, "engine.running_memory_gb=0"]))
    assert plan.engine.running_memory_gb == 0  # type: ignore[attr-defined]


def test_the_prefix_tree_is_still_charged_its_reserve():
    """``block_pool=false``: vLLM's rules on the prefix tree, which keeps the reserve."""
    tree = [*H100_VLLM, "policy.admission.block_pool=false"]
    with pytest.raises(ConfigError, match=r"55 GB of cache \+ 16 GB for running sequences"):
        plan_run(compose([*tree, BIG]))
    with pytest.raises(ConfigError, match=r"engine\.running_memory_gb must be > 0, got 0"):
        plan_run(compose([*tree, "cache.size_gb=1", "engine.running_memory_gb=0"]))
    plan_run(compose([*tree, "cache.size_gb=40"]))  # 40 + 16 + 16.2 fit


def test_a_compare_set_with_a_tree_policy_is_charged_the_reserve():
    with pytest.raises(ConfigError, match="16 GB for running sequences"):
        plan_run(
            compose(["model=nemotron_h_8b", "hardware=h100_sxm", BIG, "+policy@compare.vllm=vllm"])
        )


def test_a_hybrid_on_a_hash_id_trace_runs_on_the_tree_and_is_charged_its_reserve():
    """vLLM's pool runs a hybrid on a token trace only (:func:`simlab.run.routes.pool_refusal`);
    the plan asks the route table with the trace's block size before loading it."""
    with pytest.raises(ConfigError, match="16 GB for running sequences"):
        plan_run(compose([*H100_VLLM, BIG, "trace=mooncake"]))


def test_a_shared_pool_is_charged_cache_and_running_memory():
    shared = [*H100_VLLM, "engine.kv_pool=shared"]
    with pytest.raises(ConfigError, match="16 GB for running sequences"):
        plan_run(compose([*shared, BIG]))
    plan_run(compose([*shared, BIG, "engine.running_memory_gb=0"]))


def test_the_vllm_pool_check_still_refuses_too_much_cache():
    with pytest.raises(ConfigError, match=r"cache\.size_gb: 70 GB of cache \+ 16\.2 GB"):
        plan_run(compose([*H100_VLLM, "cache.size_gb=70"]))


def test_mamba_cache_mode_none_warns_once_and_records_a_caveat(tmp_path, caplog):
    none = ["policy.mamba_cache_mode=none", "bounds.enabled=false"]
    cfg = compose(["+policy=vllm", "engine=replay", "trace.limit=3", "report=false", *none])
    with caplog.at_level(logging.WARNING):
        plan = plan_run(cfg)
    lines = [r.getMessage() for r in caplog.records if "mamba_cache_mode" in r.getMessage()]
    assert len(lines) == 1 and "policy.mamba_cache_mode=none disables" in lines[0]
    run_plan(dataclasses.replace(plan, out_dir=tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    caveats = summary["policies"]["vllm"]["caveats"]
    assert caveats == [lines[0].removeprefix("vllm: ")]


def test_align_mode_has_no_caveat(tmp_path):
    plan = plan_run(compose(["+policy=vllm", "engine=replay", "trace.limit=3", "report=false"]))
    run_plan(dataclasses.replace(plan, out_dir=tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "caveats" not in summary["policies"]["vllm"]


def test_a_clusters_replicas_are_charged_as_one_engine():
    plan = plan_run(compose([*H100_VLLM, BIG, "cluster.replicas=2"]))
    assert isinstance(plan.engine, MemoryChecked) and plan.engine.name == "timed"


def test_the_engines_caveats_are_kept_beside_the_plug_ins(tmp_path):
    """A timed burst's steady-state caveat and the admission's caveat both reach summary.json
    (the plug-ins' list used to replace the engine's)."""
    none = ["policy.mamba_cache_mode=none", "bounds.enabled=false"]
    cfg = compose(["+policy=vllm", "engine=timed", "trace.limit=3", "report=false", *none])
    run_plan(dataclasses.replace(plan_run(cfg), out_dir=tmp_path))
    caveats = json.loads((tmp_path / "summary.json").read_text())["policies"]["vllm"]["caveats"]
    assert any(c.startswith("no steady state") for c in caveats)
    assert any("policy.mamba_cache_mode=none disables" in c for c in caveats)
