"""The steps of a hybrid's request in vLLM's pool that cannot change it are skipped: a request
running alone skips its decode steps between block boundaries (``HybridPool.next_change``), and
a step reading the same blocks as the plain step before it returns at once
(``PoolRun.step``'s ``last_reads``), in the replay and in the timed engine.

The oracle steps every token in full. Over real traces, hybrids and the pool's options (finite
pools that evict and preempt, finer match units, retention intervals, async scheduling), each
request's record and the run's peaks must be equal."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from simlab.engines.block_pool import HybridPool, PoolRun, pool_records
from simlab.engines.block_pool.replay import pool_shape, step_pool
from simlab.run.simulate import plan_run, policy_step, simulate, trace_requests
from tests.fixtures import compose

QUIET = ["bounds.enabled=false", "report=false", "engine=replay", "+policy=vllm"]
CASES = {
    "sharegpt, Marconi 7B, 1 GB": ["trace=sharegpt", "trace.limit=150", "cache.size_gb=1"],
    "sharegpt, Nemotron-H-8B, infinite": [
        "trace=sharegpt",
        "trace.limit=150",
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
    """The pool stepping every decode token (the oracle, with :func:`in_full`)."""

    def next_change(self, n: int) -> int:
        return n + 1


def in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every :meth:`PoolRun.step` run in full (none returns at once)."""
    step = PoolRun.step

    def full(run: PoolRun, *args, **kwargs) -> None:
        run.last_reads = None
        step(run, *args, **kwargs)

    monkeypatch.setattr(PoolRun, "step", full)


@pytest.mark.parametrize("overrides", CASES.values(), ids=list(CASES))
def test_skipping_the_decode_steps_that_change_nothing_keeps_every_record(overrides, monkeypatch):
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
    runs = [pool_records(requests, plan.model, "vllm", fast, committed)]
    with monkeypatch.context() as patch:
        in_full(patch)
        runs.append(pool_records(requests, plan.model, "vllm", oracle, committed))
    assert runs[0].extras == runs[1].extras
    got, want = ([dataclasses.asdict(r) for r in run.records] for run in runs)
    assert got == want
    assert fast.pool.evicted == oracle.pool.evicted
    if shape.blocks != float("inf"):
        assert fast.pool.evicted > 0  # the finite pools evict


TIMED = [
    "trace=sharegpt",
    "trace.limit=100",
    "cache.size_gb=1",
    "engine=timed",
    "reuse_breakdown=false",
]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async scheduling"])
def test_the_timed_engine_keeps_every_record_when_unchanged_steps_return_at_once(
    overlap, monkeypatch, tmp_path
):
    """Marconi's 7B hybrid on 1 GB under load: requests are preempted (vLLM's pool)."""
    overrides = [*TIMED, *QUIET[:2], "+policy=vllm", f"engine.overlap={overlap}"]
    frames = []
    for full in (False, True):
        with monkeypatch.context() as patch:
            if full:
                in_full(patch)
            out = tmp_path / str(full)
            simulate(compose([*overrides, f"output_dir={out}"]))
        frames.append(pd.read_parquet(out / "records.parquet"))
    assert frames[0]["preemptions"].sum() > 0
    pd.testing.assert_frame_equal(frames[0], frames[1])
