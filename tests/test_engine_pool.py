"""``cache.size_gb=engine``: a timed run's KV pool sized as the modelled engine sizes it on its
GPUs (:mod:`simlab.engines.timed.pool_sizing`), shared by running requests and the prefix cache,
and recorded in ``summary.json``."""

from __future__ import annotations

import pytest

from simlab.config import ConfigError
from simlab.cost.measured import tables
from simlab.engines.timed.pool_sizing import (
    GIB,
    MIB,
    aic_model,
    gpu_memory,
    sglang_fraction,
    weights_per_gpu,
)
from simlab.report.describe import cost_model_note
from simlab.run.plan import plan_run
from tests.fixtures import compose

pytestmark = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)

QWEN = ["engine=timed", "model=qwen3_32b", "+policy=vllm", "cache.size_gb=engine", "report=false"]


@pytest.mark.parametrize(
    ("gib", "chunk", "tp", "reserved_mib"),
    [
        # 512 + 1.5 x 8,192 + 2 x 256 (cuda_graph_max_bs below TP 4 on 60-90 GiB) + 128 x TP
        (80, 8192, 1, 512 + 12288 + 512 + 128),
        # from TP 4 the graphs go to 512 requests
        (80, 8192, 4, 512 + 12288 + 1024 + 512),
        # above 160 GiB: 512 requests at any TP
        (180, 16384, 8, 512 + 24576 + 1024 + 1024),
        # a 24 GiB GPU: 24 requests, the chunk floored at 2,048, no 10 GiB floor
        (24, 1024, 1, 512 + 3072 + 48 + 128),
        # above 60 GiB the reserve is 10 GiB at least
        (96, 2048, 1, 10 * 1024),
    ],
)
def test_sglangs_default_fraction_is_its_code_s(gib, chunk, tp, reserved_mib):
    """``ServerArgs._handle_gpu_memory_settings``, worked by hand."""
    mib = gib * 1024
    assert sglang_fraction(gib * GIB, chunk, tp) == round((mib - reserved_mib) / mib, 3)
    assert sglang_fraction(gib * GIB, chunk, tp) == pytest.approx(1 - reserved_mib / mib, abs=5e-4)
    assert MIB * 1024 == GIB


def _memory(plan, backend, version, tp, budget):
    model = plan.model
    return gpu_memory(
        aic_model(model.name), plan.engine.hardware.system, backend, version, tp, budget,
        (None, None, None),
    )  # fmt: skip


def test_vllm_s_pool_is_its_utilization_of_the_gpu_less_all_else_and_is_shared():
    """vLLM on an RTX PRO 6000: 0.9 of the GPU less the weights (simlab's count), the profiled
    activations at its 8,192-token budget and the runtime buffers; running requests and the
    prefix cache share it; ``summary.json`` keeps the pool and the report's note says it."""
    plan = plan_run(compose([*QWEN, "hardware=rtx_pro_6000_server", "engine.backend=vllm"]))
    assert plan.engine.token_budget == 8192
    aic = _memory(plan, "vllm", "0.24.0", 1, 8192)
    assert aic is not None
    pool = plan.config["engine_pool"]
    weights = weights_per_gpu(plan.model, 1)
    kv = 0.9 * aic["capacity"] - weights - aic["activations"] - aic["runtime"]
    kv -= aic["communication"]
    assert plan.settings.cache.size_gb == pytest.approx(kv / 1e9, rel=1e-6)
    assert plan.config["cache"]["size_gb"] == plan.settings.cache.size_gb
    assert pool["kv_pool_tokens"] == int(kv // plan.model.kv_bytes_per_token)
    assert 60 < pool["per_gpu_gib"]["weights"] < 62  # Qwen3-32B's 32.8 billion at BF16
    assert plan.config["engine"]["kv_pool"] == "shared"
    assert plan.config["engine"]["running_memory_gb"] == 0
    assert plan.engine.running_gb(reserve=True) == 0
    assert "caveat" not in pool  # vLLM's 0.9 is its documented default
    note = cost_model_note(plan.config)
    assert f"KV pool {pool['kv_pool_gb']:g} GB as vllm sizes it" in note


def test_sglang_s_pool_is_its_static_fraction_less_the_weights_across_tp():
    """SGLang on two H100s: its own fraction (:func:`sglang_fraction` at its 8,192-token chunk),
    less the weights and communication buffers, on each GPU; the pool is both GPUs'."""
    run = [*QWEN, "hardware=h100_sxm", "engine.backend=sglang", "engine.tp=2"]
    plan = plan_run(compose(run))
    version = plan.engine.backend_version or tables.versions("h100_sxm", "sglang")[-1]
    aic = _memory(plan, "sglang", version, 2, plan.engine.token_budget)
    assert aic is not None
    pool = plan.config["engine_pool"]
    fraction = sglang_fraction(aic["capacity"], plan.engine.token_budget, 2)
    assert pool["memory_fraction"] == fraction
    weights = weights_per_gpu(plan.model, 2)
    kv = fraction * aic["capacity"] - weights - aic["communication"]
    assert plan.settings.cache.size_gb == pytest.approx(2 * kv / 1e9, rel=1e-6)
    assert 29 < pool["per_gpu_gib"]["weights"] < 32  # half of Qwen3-32B
    assert "its 0.5 releases' heuristic" in pool["caveat"]  # an estimate of SGLang's, said so
    given = plan_run(compose([*run, "engine.memory_fraction=0.85"])).config["engine_pool"]
    assert "caveat" not in given and given["memory_fraction"] == 0.85


def test_a_pool_that_cannot_be_sized_is_a_one_line_error_naming_the_key():
    """A model aiconfigurator-core has no config of (simlab's Marconi 7B), a model that leaves
    nothing for the KV cache, and an engine without a GPU all say so before any work."""
    for run in (
        ["engine=timed", "model=marconi_7b", "cache.size_gb=engine"],
        [*QWEN, "hardware=a100_40gb"],  # 65 GB of weights on 40 GB
        ["engine=replay", "cache.size_gb=engine"],
    ):
        with pytest.raises(ConfigError, match=r"cache\.size_gb=engine: ") as err:
            plan_run(compose(run))
        assert "\n" not in str(err.value)


def test_a_number_leaves_the_pool_as_set():
    plan = plan_run(compose(["engine=timed", "model=qwen3_32b", "hardware=h200"]))
    assert "engine_pool" not in plan.config and plan.settings.cache.size_gb == 2.0
    assert plan.config["engine"]["kv_pool"] == "separate"


def test_each_replica_of_a_cluster_has_the_single_engine_s_pool():
    run = [*QWEN, "hardware=h200", "engine.backend=trtllm"]
    one = plan_run(compose(run)).config["engine_pool"]
    assert plan_run(compose([*run, "cluster.replicas=2"])).config["engine_pool"] == one
    assert one["memory_fraction"] == 0.9  # TensorRT-LLM's free_gpu_memory_fraction


def test_a_server_s_memory_fraction_sizes_its_pool_and_nothing_else():
    """``engine.memory_fraction`` is the server's flag (here vLLM's
    ``--gpu-memory-utilization 0.95``): 0.05 of the GPU more for the KV cache; without
    ``cache.size_gb=engine`` it would size nothing, so it is an error."""
    run = [*QWEN, "hardware=rtx_pro_6000_server", "engine.backend=vllm"]
    base = plan_run(compose(run)).config["engine_pool"]
    more = plan_run(compose([*run, "engine.memory_fraction=0.95"])).config["engine_pool"]
    assert more["memory_fraction"] == 0.95
    gained = more["per_gpu_gib"]["kv"] - base["per_gpu_gib"]["kv"]
    assert gained == pytest.approx(0.05 * base["per_gpu_gib"]["capacity"], abs=2e-3)
    for bad in (
        ["engine=timed", "engine.memory_fraction=0.9"],
        [*run, "engine.memory_fraction=1.5"],
    ):
        with pytest.raises(ConfigError, match=r"engine\.memory_fraction"):
            plan_run(compose(bad))


def test_a_capacity_list_takes_numbers_only():
    from simlab.run.capacities import capacity_list

    assert capacity_list(compose(["cache.size_gb=[1,2]"])) == [1, 2]
    with pytest.raises(ConfigError, match=r"cache\.size_gb: 'engine' is the engine's one pool"):
        capacity_list(compose(["engine=timed", "cache.size_gb=[engine,2]"]))


def test_a_llama_31_named_as_aiconfigurator_names_it_is_sized_too():
    """``model=llama3_1_8b`` is ``meta-llama/Meta-Llama-3.1-8B``, the name aiconfigurator-core
    ships its config under: it was renamed a second time (``Meta-Meta-``) and found no memory
    model, so ``cache.size_gb=engine`` failed on every GPU."""
    assert aic_model("meta-llama/Llama-3.1-70B") == "meta-llama/Meta-Llama-3.1-70B"
    assert aic_model("meta-llama/Meta-Llama-3.1-8B") == "meta-llama/Meta-Llama-3.1-8B"
    assert aic_model("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Meta-Llama-3.1-8B"
    plan = plan_run(compose(["engine=timed", "model=llama3_1_8b", "+policy=vllm",
                             "hardware=rtx_pro_6000_server", "cache.size_gb=engine",
                             "report=false"]))  # fmt: skip
    assert 60 < plan.settings.cache.size_gb < 96  # 96 GB, 16 GB of weights, vLLM's 0.9
