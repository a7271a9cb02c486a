"""A request's decode steps in vLLM's hybrid pool, run alone (``HybridPool.serve``): the steps
that cannot change the pool are skipped (``HybridPool.next_change``).

The oracle is the pool stepping every decode token: over real traces, hybrids and the pool's
options (finite pools that evict, finer match units, retention intervals, prompts only), each
request's record and the run's peaks must be equal."""

from __future__ import annotations

import dataclasses

import pytest

from simlab.engines.block_pool import HybridPool, pool_records
from simlab.engines.block_pool.replay import pool_shape, step_pool
from simlab.run.simulate import plan_run, policy_step, trace_requests
from tests.fixtures import compose

QUIET = ["bounds.enabled=false", "report=false", "engine=replay", "+policy=vllm"]
CASES = {
    "sharegpt, Marconi 7B, 1 GB": ["trace=sharegpt", "trace.limit=250", "cache.size_gb=1"],
    "sharegpt, Nemotron-H-8B, infinite": [
        "trace=sharegpt",
        "trace.limit=250",
        "model=nemotron_h_8b",
        "cache.size_gb=inf",
    ],
    "swebench, Nemotron-H-8B, 2 GB, unit 16, retention 4 blocks": [
        "trace=swebench",
        "trace.limit=30",
        "model=nemotron_h_8b",
        "cache.size_gb=2",
        "policy.prefix_match_unit=16",
        "policy.prefix_cache_retention_interval=4160",  # 4 of its 1,040-token blocks
    ],
    "lmsys, Qwen3.5-27B, 4 GB, retention dense": [
        "trace=lmsys",
        "model=qwen3_5_27b",
        "cache.size_gb=4",
        "policy.prefix_cache_retention_interval=null",
    ],
}


class EveryStep(HybridPool):
    """The pool stepping every decode token (the oracle)."""

    def next_change(self, n: int) -> int:
        return n + 1


@pytest.mark.parametrize("overrides", CASES.values(), ids=list(CASES))
def test_skipping_the_decode_steps_that_change_nothing_keeps_every_record(overrides):
    plan = plan_run(compose([*overrides, *QUIET]))
    _, requests = trace_requests(plan.trace, plan.settings)
    (spec,) = plan.policies.values()
    step = policy_step(spec, plan.model, plan.settings, requests[0].block_size)
    shape = pool_shape(step, requests)
    assert shape is not None and shape.state_groups
    fast, committed = step_pool(step, shape)
    assert committed
    oracle = EveryStep(
        shape,
        fast.junction,
        fast.max_tokens,
        unit=fast.unit,
        alignment=fast.alignment,
    )
    oracle.every = fast.every
    outputs = sum(r.output_len for r in requests)
    assert outputs > 10 * len(requests)  # decode steps to skip
    runs = [pool_records(requests, plan.model, "vllm", p, committed) for p in (fast, oracle)]
    assert runs[0].extras == runs[1].extras
    got, want = ([dataclasses.asdict(r) for r in run.records] for run in runs)
    assert got == want
    assert fast.pool.evicted == oracle.pool.evicted
    if shape.blocks != float("inf"):
        assert fast.pool.evicted > 0  # the finite pools evict
