"""The shared KV pool beside a separate SSM pool (``engine.kv_pool=shared`` with
``cache.ssm_gb``, SGLang's two pools): running requests hold their Mamba slots in the SSM pool,
cached states get the rest, SGLang's cap on running requests, preemption gives slots back,
huge pools equal separate pools, bad sizes are errors naming the key."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simlab.cache.state_pool import StatePool
from simlab.config import ClusterSettings
from simlab.engines.cluster.engine import ClusterEngine
from simlab.engines.records import records_frame
from simlab.engines.step import RequestStep
from simlab.engines.timed.admission import Admission
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.feeders import SessionFeeder
from simlab.engines.timed.kv_pool import KVPool
from simlab.run.cli import USER_ERRORS
from simlab.run.simulate import simulate
from tests.fixtures import compose, policy_plugins
from tests.test_cluster import A100, CKPT, HYBRID, chat_requests

KV = HYBRID.kv_bytes_per_token


def requests():
    return chat_requests(sessions=30, rate=4.0)


def longest(reqs) -> int:
    return max(r.input_tokens + r.output_len for r in reqs)


def step(states: int, kv_tokens: int = 2000, mamba: str = "no_buffer") -> RequestStep:
    """An SGLang step on a Marconi 7B hybrid: ``kv_tokens`` of KV beside ``states`` SSM states."""
    admission, eviction = policy_plugins("sglang", [f"policy.admission.mamba={mamba}"])
    return RequestStep.build(
        HYBRID,
        kv_tokens * KV,
        admission,
        eviction,
        "sglang",
        state_pool=StatePool.given(kv_tokens * KV, states * CKPT, CKPT),
    )


def engine(**settings) -> TimedEngine:
    return TimedEngine(hardware=A100, memory_check=False, **settings)


def shared(reqs, running_tokens: int | None = None) -> TimedEngine:
    tokens = 4 * longest(reqs) if running_tokens is None else running_tokens
    return engine(kv_pool="shared", running_memory_gb=tokens * KV / 1e9)


@pytest.mark.parametrize(("mamba", "slots", "cap"), [("no_buffer", 1, 4), ("extra_buffer", 3, 2)])
def test_running_requests_hold_their_slots_within_sglangs_cap(monkeypatch, mamba, slots, cap):
    """SGLang runs at most ``states // (slots + 2)`` requests; each holds its slots from its
    scheduling to its finish, and cached states never take what running requests hold."""
    checks: list[tuple[int, int, float]] = []
    reqs = requests()
    world = shared(reqs).world(reqs, step(states=12, mamba=mamba))
    kv: KVPool = world.memory.kv
    check = kv.check

    def spy() -> None:
        pool, cache = kv.pool, kv.cache
        assert pool.ssm_budget is not None
        checks.append((len(world.running), pool.held_slots, pool.ssm_budget - cache.ssm_bytes))
        check()

    monkeypatch.setattr(kv, "check", spy)
    records = world.run(SessionFeeder(reqs))
    assert len(records) == len(reqs)
    assert world.max_running == world.pool.max_running == cap
    assert max(running for running, _, _ in checks) == cap  # the load fills the cap
    assert max(held for _, held, _ in checks) == cap * slots == world.pool.peak_held_slots
    assert all(held <= slots * (running + 1) for running, held, _ in checks)
    assert all(room >= held * CKPT - 1.0 for _, held, room in checks)
    assert world.pool.held_slots == 0 and world.cache.ssm_capacity == world.pool.ssm_budget


def test_running_slots_leave_less_room_for_cached_states():
    """The same SSM pool caches fewer states when running requests hold slots in it: shared
    pools evict states that separate pools (running memory outside the cache) keep."""
    reqs = requests()
    kv = 10**6  # KV never binds
    one = shared(reqs).run(reqs, step(states=9, kv_tokens=kv))
    other = engine(running_memory_gb=16.0).run(reqs, step(states=9, kv_tokens=kv))
    hits = [records_frame(r.records)["hit_tokens"].sum() for r in (one, other)]
    assert 0 < hits[0] < hits[1]
    assert one.extras["ssm_max_running"] == 3 and one.extras["peak_running_states"] == 3
    assert one.extras["ssm_pool_gb"] == pytest.approx(9 * CKPT / 1e9)


def test_huge_pools_equal_separate_pools():
    reqs = requests()
    kv, states = 10**6, 10**4  # nothing is ever evicted
    separate = engine(running_memory_gb=16.0).run(reqs, step(states, kv))
    pooled = shared(reqs).run(reqs, step(states, kv))
    assert pooled.extras["preemptions"] == 0 and pooled.extras["pool_evicted_gb"] == 0
    one, other = records_frame(separate.records), records_frame(pooled.records)
    assert one["hit_tokens"].sum() > 0
    pd.testing.assert_frame_equal(one, other)


def test_a_preempted_request_gives_its_slots_back(monkeypatch):
    """After each scheduling pass exactly the running requests hold slots (a preempted one,
    back in the queue, holds none), and the KV budget holds KV only (whole tokens' bytes)."""
    held: list[tuple[int, int]] = []
    deltas: list[float] = []
    schedule, hold = Admission.schedule, KVPool.hold

    def spy_schedule(admission: Admission) -> None:
        schedule(admission)
        held.append((admission.pool.held_slots, len(admission.world.running)))

    def spy_hold(kv: KVPool, delta: float) -> None:
        deltas.append(delta)
        hold(kv, delta)

    monkeypatch.setattr(Admission, "schedule", spy_schedule)
    monkeypatch.setattr(KVPool, "hold", spy_hold)
    reqs = requests()
    # 120 states let 40 requests run beside 100 cached tokens of KV: tight enough to preempt
    world = shared(reqs, running_tokens=longest(reqs)).world(reqs, step(states=120, kv_tokens=100))
    records = world.run(SessionFeeder(reqs))
    assert len(records) == len(reqs) and world.pool.preemptions > 0
    assert all(slots == running for slots, running in held)  # one slot each (no_buffer)
    assert world.pool.held_slots == 0
    assert CKPT % KV and all(d % KV == 0 for d in deltas) and max(deltas) > 0


def test_the_invariant_check_catches_an_ssm_overdraft():
    reqs = requests()
    world = shared(reqs).world(reqs, step(states=12))
    world.pool.held_slots = 13
    with pytest.raises(RuntimeError, match="SSM pool over budget"):
        world.memory.kv.check()


@pytest.mark.parametrize(("mamba", "need"), [("no_buffer", 3), ("extra_buffer", 5)])
def test_an_ssm_pool_too_small_for_one_request_is_an_error_naming_the_key(mamba, need):
    reqs = requests()
    with pytest.raises(USER_ERRORS, match=rf"cache\.ssm_gb: .* must hold {need} states"):
        shared(reqs).world(reqs, step(states=need - 1, mamba=mamba))
    shared(reqs).world(reqs, step(states=need, mamba=mamba))  # just enough


def test_a_run_reports_the_state_pool(tmp_path):
    overrides = [
        "engine.calibration=null",
        "report=false",
        "bounds.enabled=false",
        "+policy=sglang",
        "model=nemotron_h_8b",
        "trace=chat",
        "trace.n_sessions=10",
        "cache.size_gb=2",
        "cache.ssm_gb=1",
        "engine.kv_pool=shared",
        f"output_dir={tmp_path}",
    ]
    simulate(compose(overrides))
    summary = json.loads((tmp_path / "summary.json").read_text())["policies"]["sglang"]
    assert summary["kv_pool"] == "shared" and summary["ssm_pool_gb"] == 1.0
    assert 1 <= summary["peak_running_states"] <= summary["ssm_max_running"]
    assert summary["peak_ssm_gb"] <= 1.0


def test_a_cluster_sums_the_replicas_running_states():
    reqs = requests()

    def make() -> RequestStep:
        return step(states=12)

    run = ClusterEngine(shared(reqs), ClusterSettings(2, "round_robin")).run(reqs, make(), make)
    assert len(run.records) == len(reqs)
    assert run.extras["ssm_max_running"] == 4
    assert 4 < run.extras["peak_running_states"] <= 8  # both replicas filled their cap
