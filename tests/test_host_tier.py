"""The host-memory tier (``cache.host_gb``, ``cache.host_bw_gbps``; :mod:`simlab.cache.host_tier`):
oracles against one cache of another size, the tiers' invariants during whole runs, the load
time of the timed engine, clusters, and bad input. Real trace slices (ShareGPT)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from simlab.config import ConfigError
from simlab.engines.records import HOST_COLUMNS, RECORD_COLUMNS
from simlab.run.breakdown import COLUMNS as PART_COLUMNS
from simlab.run.simulate import load_trace, plan_run, policy_step, simulate
from tests.fixtures import compose

FREE_HOST = ["cache.host_gb=inf", "cache.host_bw_gbps=inf"]


def records(*overrides: str):
    return simulate(compose(["bounds.enabled=false", "report=false", *overrides])).records


def replay(*overrides: str):
    return records("engine=replay", *overrides)


SHAREGPT = ["trace=sharegpt", "trace.limit=40"]


# ------------------------------------------------------------------ oracles
@pytest.mark.parametrize(
    "setting",
    [
        # Transformer: SGLang+'s LRU, SGLang's radix cache, vLLM's block pool
        ["model=llama3_8b", "+policy=sglang_plus", "cache.size_gb=0.3"],
        ["model=llama3_8b", "+policy=sglang", "cache.size_gb=0.3"],
        ["model=llama3_8b", "+policy=vllm", "cache.size_gb=0.3"],
        # hybrid: states go to the host with their nodes
        ["model=nemotron_h_8b", "+policy=sglang_plus", "cache.size_gb=5"],
        # (a BF16 state: at SGLang's FP32 default one admission no longer fits the 5 GB GPU)
        [
            "model=nemotron_h_8b",
            "+policy=sglang",
            "policy.mamba_ssm_dtype=bfloat16",
            "cache.size_gb=5",
        ],
        # Belady's written-back nodes keep their host children (scored as GPU leaves); not a
        # hybrid's Belady, whose merges drop the checkpoints it judges no hit lands on
        ["model=llama3_8b", "+policy=clairvoyant", "cache.size_gb=0.3"],
    ],
    ids=[
        "llama-sglang_plus",
        "llama-sglang",
        "llama-vllm",
        "nemotron-sglang_plus",
        "nemotron-sglang",
        "llama-clairvoyant",
    ],
)
def test_an_infinite_free_host_tier_hits_as_an_infinite_cache(setting):
    """Nothing leaves an infinite host, so every request hits what an infinite cache gives it,
    part from the GPU and part loaded back. Holds while every admission (the request's whole
    path, KV and states) that a later request reuses fits the GPU: an admission the GPU cannot
    hold is truncated, which an infinite cache never does."""
    ideal = replay(*SHAREGPT, *setting, "cache.size_gb=inf")
    tiered = replay(*SHAREGPT, *setting, *FREE_HOST)
    assert tiered["host_hit_tokens"].sum() > 0  # the host tier served hits
    assert (tiered["host_hit_tokens"] <= tiered["hit_tokens"]).all()
    np.testing.assert_array_equal(tiered["hit_tokens"], ideal["hit_tokens"])


def test_a_block_lru_with_an_exclusive_host_tier_is_one_lru_of_both_sizes():
    """vLLM's block pool (equal blocks, leaf LRU, a hit refreshes its path): GPU evictions go
    to the host's LRU tail, hits come back: exactly one LRU cache of GPU + host bytes."""
    block = ["model=llama3_8b", "+policy=vllm", "policy.block_size=16", "trace.limit=60"]
    one = replay("trace=sharegpt", *block, "cache.size_gb=0.8")
    two = replay(
        "trace=sharegpt", *block, "cache.size_gb=0.3", "cache.host_gb=0.5", "cache.host_bw_gbps=25"
    )
    assert two["host_hit_tokens"].sum() > 0
    np.testing.assert_array_equal(two["hit_tokens"], one["hit_tokens"])


# ------------------------------------------------------------------ invariants
@pytest.mark.parametrize(
    "setting",
    [
        ["model=llama3_8b", "+policy=sglang", "cache.size_gb=0.2", "cache.host_gb=0.3"],
        ["model=llama3_8b", "+policy=vllm", "cache.size_gb=0.2", "cache.host_gb=0.3"],
        ["model=nemotron_h_8b", "+policy=marconi", "cache.size_gb=1", "cache.host_gb=1"],
        ["model=nemotron_h_8b", "+policy=sglang_plus", "cache.size_gb=1", "cache.host_gb=0.5"],
        ["model=nemotron_h_8b", "+policy=clairvoyant", "cache.size_gb=1", "cache.host_gb=0.5"],
        ["model=llama3_8b", "+policy=clairvoyant", "cache.size_gb=0.2", "cache.host_gb=0.3"],
    ],
    ids=[
        "llama-sglang",
        "llama-vllm",
        "nemotron-marconi",
        "nemotron-sglang_plus",
        "nemotron-clairvoyant",
        "llama-clairvoyant",
    ],
)
def test_tier_bytes_stay_within_capacity_through_a_run(setting):
    """After every request: the tree's invariants (GPU residency closed upwards, GPU-child
    counts, bytes of each tier equal to their nodes'), GPU bytes <= cache.size_gb and host
    bytes <= cache.host_gb; the host is small enough that it drops entries."""
    cfg = compose([*SHAREGPT, "engine=replay", "cache.host_bw_gbps=25", *setting])
    plan = plan_run(cfg)
    trace = load_trace(plan.trace, plan.settings)
    reqs = list(trace.requests())
    (spec,) = plan.policies.values()
    step = policy_step(spec, plan.model, plan.settings)
    step.prepare(reqs)
    cache, host = step.cache, step.cache.host
    assert host is not None
    loaded = 0
    for req in reqs:
        record = step.serve(req)
        cache.check_invariants()
        assert cache.used_bytes <= plan.settings.cache.capacity_bytes
        assert host.used_bytes <= plan.settings.cache.host_bytes
        loaded += record.host_loaded_bytes or 0
    assert host.dropped_bytes > 0 and host.written_bytes > 0 and host.loaded_bytes > 0
    assert loaded == host.loaded_bytes  # the records' bytes are the tier's


def test_a_hybrid_host_hit_loads_its_state_at_its_true_size():
    """A hybrid's host hit brings back whole nodes: KV bytes plus SSM states, so the loaded
    bytes exceed the KV of the host-hit tokens by whole states."""
    frame = replay(
        *SHAREGPT, "model=nemotron_h_8b", "+policy=sglang_plus", "cache.size_gb=1", *FREE_HOST
    )
    spec = plan_run(compose(["model=nemotron_h_8b"])).model
    hits = frame[frame["host_hit_tokens"] > 0]
    assert len(hits) > 0
    extra = hits["host_loaded_bytes"] - hits["host_hit_tokens"] * spec.kv_bytes_per_token
    assert (extra >= spec.ssm_state_bytes).all()
    assert (extra % spec.ssm_state_bytes == 0).all()


# ------------------------------------------------------------------ timed engine
def alone(frame: pd.DataFrame) -> np.ndarray:
    """Per request: no other request in flight between its arrival and its first token."""
    arrival, first, done = (frame[k].to_numpy() for k in ("arrival", "first_token", "finished"))
    busy = (arrival[None, :] < first[:, None]) & (done[None, :] > arrival[:, None])
    np.fill_diagonal(busy, False)
    return ~busy.any(axis=1)


def test_a_finite_bandwidth_delays_the_first_token_of_host_hits():
    """At low load both runs take the same cache decisions; a request with a host hit then
    waits its load (bytes / bandwidth) before its prefill, so its TTFT is no less than with free
    loads, and one that finds the engine idle in both runs (no other request in flight from its
    arrival to its first token) takes exactly its load longer. (Sessions still overlap at this
    rate: a load overlaps another request's iterations, which a free load waits for too.)"""
    low = [
        *SHAREGPT,
        "trace.limit=20",
        "model=llama3_8b",
        "+policy=sglang",
        "arrivals.session_rate=0.01",
    ]
    tier = ["cache.size_gb=0.3", "cache.host_gb=inf"]
    free = records(*low, *tier, "cache.host_bw_gbps=inf")
    slow = records(*low, *tier, "cache.host_bw_gbps=5")
    np.testing.assert_array_equal(free["hit_tokens"], slow["hit_tokens"])
    np.testing.assert_array_equal(free["host_hit_tokens"], slow["host_hit_tokens"])
    hit = (slow["host_hit_tokens"] > 0).to_numpy()
    assert hit.sum() > 0
    assert (slow["ttft"].to_numpy()[hit] >= free["ttft"].to_numpy()[hit]).all()
    expected = slow["host_loaded_bytes"].to_numpy()[hit] / 5e9
    np.testing.assert_allclose(slow["host_load_s"].to_numpy()[hit], expected, rtol=1e-6, atol=1e-9)
    idle = hit & alone(free) & alone(slow)
    assert idle.sum() >= hit.sum() // 2  # 21 of 27
    delay = slow["ttft"].to_numpy()[idle] - free["ttft"].to_numpy()[idle]
    loaded = slow["host_loaded_bytes"].to_numpy()[idle] / 5e9
    np.testing.assert_allclose(delay, loaded, rtol=1e-9, atol=1e-9)
    assert (free["host_load_s"] == 0).all()
    assert (slow["host_load_s"].to_numpy()[~hit] == 0).all()


def test_each_replica_of_a_cluster_has_its_own_host_tier():
    frame = records(
        *SHAREGPT,
        "model=llama3_8b",
        "+policy=sglang",
        "cache.size_gb=0.2",
        "cache.host_gb=1",
        "cache.host_bw_gbps=25",
        "cluster.replicas=2",
        "cluster.router=prefix_aware",
    )
    assert {"replica", *HOST_COLUMNS} <= set(frame.columns)
    assert frame["host_hit_tokens"].sum() > 0
    assert frame.groupby("replica")["host_hit_tokens"].sum().gt(0).all()


def test_the_clairvoyant_bound_runs_under_a_host_tier():
    """The default hybrid with its bounds on, a small GPU and a host tier: Belady writes back
    GPU nodes whose children are all on the host, and may drop them with their host subtree
    when the host is full (a crash until stop 31). The bound stays below the infinite one."""
    summary = simulate(
        compose(
            [
                *SHAREGPT,
                "trace.limit=200",
                "+policy=sglang_plus",
                "engine=replay",
                "report=false",
                "cache.size_gb=0.5",
                "cache.host_gb=1",
                "cache.host_bw_gbps=25",
            ]
        )
    )
    policy = summary.policies["sglang_plus"]["token_hit_rate"]
    assert policy <= summary.bounds["clairvoyant"] <= summary.bounds["infinite"]


# ------------------------------------------------------------------ no host tier
def test_without_a_host_tier_records_and_summaries_have_no_host_items():
    summary = simulate(
        compose(
            [*SHAREGPT, "trace.limit=5", "+policy=sglang_plus", "engine=replay", "report=false"]
        )
    )
    parts = list(PART_COLUMNS.values())  # the reuse breakdown's (simlab.run.breakdown)
    assert list(summary.records.columns) == [*RECORD_COLUMNS, *parts]
    assert not any("host" in key for key in summary.policies["sglang_plus"])


def test_summary_splits_the_hit_rate_into_gpu_and_host_parts():
    summary = simulate(
        compose(
            [
                *SHAREGPT,
                "+policy=sglang_plus",
                "engine=replay",
                "report=false",
                "bounds.enabled=false",
                "cache.size_gb=0.2",
                "cache.host_gb=1",
                "cache.host_bw_gbps=25",
            ]
        )
    )
    items = summary.policies["sglang_plus"]
    assert items["host_token_hit_rate"] > 0
    assert math.isclose(
        items["gpu_token_hit_rate"] + items["host_token_hit_rate"], items["token_hit_rate"]
    )
    assert items["host_loaded_gb"] > 0 and items["peak_host_gb"] <= 1.0


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["cache.host_gb=10"], "cache.host_bw_gbps"),
        (["cache.host_gb=-1", "cache.host_bw_gbps=25"], "cache.host_gb"),
        (["cache.host_gb=0", "cache.host_bw_gbps=25"], "cache.host_gb"),
        (["cache.host_gb=10", "cache.host_bw_gbps=0"], "cache.host_bw_gbps"),
        (["cache.host_gb=10", "cache.host_bw_gbps=-3"], "cache.host_bw_gbps"),
        (["cache.host_gb=10", "cache.host_bw_gbps=fast"], "cache.host_bw_gbps"),
        (["cache.host_bw_gbps=25"], "cache.host_bw_gbps"),
        (
            ["model=nemotron_h_8b", "cache.ssm_gb=1", "cache.host_gb=10", "cache.host_bw_gbps=25"],
            "cache.host_gb",
        ),
        (
            [
                "+policy=marconi",
                "policy.compat=reference",
                "cache.host_gb=10",
                "cache.host_bw_gbps=25",
            ],
            "cache.host_gb",
        ),
    ],
)
def test_bad_host_tier_settings_name_their_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        plan_run(compose(overrides))


def test_a_host_tier_with_a_shared_kv_pool_is_an_error():
    with pytest.raises(ConfigError, match=r"engine\.kv_pool=shared.*cache\.host_gb"):
        records(
            *SHAREGPT,
            "trace.limit=3",
            "+policy=sglang",
            "engine.kv_pool=shared",
            "cache.host_gb=1",
            "cache.host_bw_gbps=25",
        )


def test_the_gpu_memory_check_ignores_the_host_tier():
    """A host tier far larger than the GPU passes the memory check (it lives in host DRAM)."""
    plan_run(compose(["cache.size_gb=2", "cache.host_gb=5000", "cache.host_bw_gbps=25"]))


def test_tuned_records_do_not_depend_on_where_the_grid_search_runs():
    """The alpha tuner replays its window on copies of a snapshot, here (``workers=1``) or in
    worker processes: each copy has its own host tier, so the live cache's is untouched and
    the records are the same either way."""
    from simlab.engines.tuning.search import worker_pool

    setting = ["model=nemotron_h_8b", "+policy=marconi", "cache.size_gb=1", "cache.host_gb=1"]
    setting += ["cache.host_bw_gbps=25", "engine=replay", "bounds.enabled=false", "report=false"]
    runs = {}
    for workers in (1, 2):
        worker_pool(workers - 1, wait=True)  # started: the grid search uses them from the first
        cfg = compose([*SHAREGPT, *setting])
        cfg.policy.tuning.workers = workers
        runs[workers] = simulate(cfg)
    assert runs[1].policies["marconi"]["alpha_tunings"] > 0
    pd.testing.assert_frame_equal(runs[1].records, runs[2].records)
