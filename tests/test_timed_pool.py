"""The timed engine on vLLM's hybrid pool (``simlab.engines.timed.vllm``): scheduling and preemption
counted by hand on a pool of a few blocks (blocks of 4 tokens, 2 Mamba groups), and the pool's
invariants under load. Its agreement with the replay at low load is
``tests/test_timed.py::test_low_load_records_equal_replay_for_production_rules_on_a_hybrid``."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from simlab.config import ConfigError
from simlab.cost.hardware import Hardware
from simlab.engines.block_pool import PoolShape
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.feeders import SessionFeeder
from simlab.engines.timed.vllm import VllmMemory
from simlab.engines.timed.world import TimedWorld
from tests.fixtures import CONFIGS, chat_trace, model, policy_plugins, routed
from traces.arrivals import assign_arrivals
from traces.format import Request

A100 = Hardware.from_config(OmegaConf.load(CONFIGS / "hardware" / "a100_40gb.yaml"))
SPEC = model("nemotron_h_8b")


def world(
    requests: list[Request], blocks: int, block: int = 4, policy: list[str] | None = None, **options
) -> TimedWorld:
    admission, eviction = policy_plugins("vllm", policy)
    step = RequestStep.build(SPEC, 1e9, admission, eviction, "vllm")
    engine = TimedEngine(hardware=A100, **options)
    shape = PoolShape(block=block, state_groups=2, block_bytes=1, blocks=blocks)
    cost = engine.cost_model(SPEC)
    return TimedWorld(requests, step, cost, engine, memory=VllmMemory.factory(shape))


def two_requests(a_out: int = 10) -> list[Request]:
    """Both arrive at 0: A (8 tokens, ``a_out`` out) first, then B (8 other tokens, 2 out)."""
    a_ids = np.arange(8, dtype=np.int32)
    a = Request(0, 0, 0, 0.0, a_ids, np.arange(50, 50 + a_out, dtype=np.int32), a_out)
    b = Request(1, 1, 0, 0.0, np.arange(100, 108, dtype=np.int32), np.arange(70, 72), 2)
    return [a, b]


def test_a_decoder_crossing_a_block_boundary_preempts_the_last_scheduled_request():
    """12 blocks. Step 1: A's prefill takes 6 (a checkpoint and a running block per group, 2
    KV); B's whole prefill needs 6 and 6 are free: it is scheduled. Step 2: A's first decode
    step (position 8) frees its checkpoint blocks (2 free) and needs 3: B, the last running,
    is preempted and frees its 6, cached ones at the tail. A's 3 come from the head: B's two
    running blocks and A's own state block of group 0, so A's state dies. B resumes with its
    sampled token to recompute (9 tokens): from its hit at 4, 2 KV blocks and 2 per group
    (a checkpoint at 8) plus its hit's 3 queued blocks make 9 > 7 free, so it waits for A's
    end, and A's position-16 step takes B's state of group 0: B misses. With 13 blocks B's
    own first decode step (2 freed, 3 needed, 1 free) preempts B, whose state then survives
    A's takes (the queue's head holds A's freed running blocks first): B hits 4. With 14,
    nothing is preempted. ``tests/fixtures/crosscheck_load`` checks these rules against
    vLLM's own scheduler."""
    requests = two_requests()
    for blocks, preempted, resumed in ((12, [0, 1], [0]), (13, [0, 1], [4]), (14, [0, 0], None)):
        w = world(requests, blocks=blocks)
        a, b = w.run(SessionFeeder(requests))
        assert w.preemption_column([a, b]) == preempted, blocks
        assert (a.hit_tokens, b.hit_tokens) == (0, 0), blocks  # their first scheduling's
        assert w.resume_hits.get(b.request_id) == resumed, blocks
        assert b.scheduled == a.scheduled == 0.0 and b.first_token < a.finished


def test_a_request_waits_until_its_first_chunk_fits_in_the_pool():
    """A decodes one step. 11 blocks: after A's 6, B's first chunk (6) does not fit in the
    5 free; A's decode step frees 2 and takes 3, so B still waits, and starts when A finishes
    and frees all (running memory does not count: the pool holds the running requests)."""
    requests = two_requests(a_out=2)
    w = world(requests, blocks=11)
    a, b = w.run(SessionFeeder(requests))
    assert w.pool.preemptions == 0 and a.scheduled == 0.0
    assert b.scheduled == pytest.approx(a.finished) and b.queue_delay > 0
    a, b = world(requests, blocks=12).run(SessionFeeder(requests))
    assert b.scheduled == 0.0


def test_a_request_the_pool_cannot_hold_alone_is_an_error_naming_the_capacity():
    requests = two_requests()
    with pytest.raises(ConfigError, match=r"cache\.size_gb"):
        world(requests, blocks=5).run(SessionFeeder(requests))


def test_fifo_preemption_is_refused_on_the_pool():
    with pytest.raises(ConfigError, match=r"engine\.preemption"):
        world(two_requests(), blocks=12, preemption="fifo")


def test_sglang_request_admission_is_refused_on_the_pool():
    with pytest.raises(ConfigError, match=r"engine\.request_admission"):
        world(two_requests(), blocks=12, request_admission="sglang")


def test_under_async_scheduling_mamba_blocks_retire_a_step_later():
    """vLLM's async scheduling (``engine.overlap``) frees Mamba blocks only up to the tokens
    whose step was processed. 14 blocks: step 1 runs A's and B's prefills (6 blocks each, 2
    left). Step 2 is A's first decode step (position 8: a KV block and a running block per
    group, 3). Synchronously it first frees its checkpoint blocks (state at 4) and takes 3 of
    the 4 free: nobody is preempted. Async, its prefill is still in flight, so nothing is
    freed: 2 free, 3 needed, and B, the last running, is preempted (its first token, in
    flight, is still delivered; it resumes on its state at 4). ``tests/fixtures/
    crosscheck_load`` (``*_async``) checks these rules against vLLM's ``AsyncScheduler``."""
    requests = two_requests()
    w = world(requests, blocks=14)
    a, b = w.run(SessionFeeder(requests))
    assert w.preemption_column([a, b]) == [0, 0]
    w = world(requests, blocks=14, overlap=True)
    a, b = w.run(SessionFeeder(requests))
    assert w.preemption_column([a, b]) == [0, 2] and w.resume_hits == {b.request_id: [4]}
    assert a.first_token == b.first_token  # step 1 sampled both; B keeps its first token


def test_async_scheduling_is_refused_on_the_prefix_tree():
    admission, eviction = policy_plugins("vllm")
    requests = two_requests()
    step = RequestStep.build(model("llama3_8b"), 1e9, admission, eviction, "vllm")
    engine = TimedEngine(hardware=A100, overlap=True)  # separate pools: the prefix tree
    with pytest.raises(ConfigError, match=r"engine\.overlap.*vLLM's block pool"):
        engine.world(requests, step)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("blocks", [260, 1000])
def test_under_load_every_block_returns_and_reruns_are_identical(blocks, overlap):
    """30 chat sessions at 5 sessions/s on a pool of blocks of 16 (the longest request
    needs 194 + 4), with vLLM's synchronous and asynchronous scheduling: requests are
    preempted, and once every request finished each block is back in the free queue with no
    reference; a second run gives identical records."""
    trace = assign_arrivals(
        chat_trace(seed=6, sessions=30), session_rate=5.0, think_time_mean=2.0, seed=0
    )
    requests = list(trace.requests())
    runs = []
    for _ in range(2):
        w = world(requests, blocks=blocks, block=16, overlap=overlap)
        records = w.run(SessionFeeder(requests))
        queue = w.memory.hybrid.pool
        assert len(queue.queue) == blocks and not any(queue.refs.values())
        assert w.pool.preemptions > 0 and len(records) == len(requests)
        assert sum(w.preemption_column(records)) == w.pool.preemptions
        assert all(r.hit_tokens % 16 == 0 and r.hit_tokens < r.input_tokens for r in records)
        runs.append([(r.request_id, r.hit_tokens, r.ttft, r.nodes_evicted) for r in records])
    assert runs[0] == runs[1]


def test_a_transformer_under_vllm_runs_on_its_pool_when_the_kv_pool_is_shared():
    """A Transformer under ``policy=vllm`` runs on vLLM's pool (no Mamba groups: one group of
    every layer) with ``engine.kv_pool=shared``, the engine's one budget for running and
    cached blocks; with separate pools it stays on the prefix tree. The pool's scheduling is
    checked against vLLM's own ``Scheduler`` over Llama-3-8B under load
    (``tests/fixtures/crosscheck_load``: ``*-vllm_sched-*``)."""
    llama = model("llama3_8b")
    admission, eviction = policy_plugins("vllm")
    requests = two_requests()
    for kv_pool, on_pool in (("shared", True), ("separate", False)):
        step = RequestStep.build(llama, 1e9, admission, eviction, "vllm")
        engine = TimedEngine(hardware=A100, kv_pool=kv_pool, running_memory_gb=1.0)
        world = engine.world(requests, routed(step, engine, requests))
        assert isinstance(world.memory, VllmMemory) == on_pool, kv_pool
    engine = TimedEngine(hardware=A100, kv_pool="shared", running_memory_gb=1.0, preemption="fifo")
    step = RequestStep.build(llama, 1e9, admission, eviction, "vllm")
    with pytest.raises(ConfigError, match=r"engine.preemption.*block_pool=false"):
        engine.world(requests, routed(step, engine, requests))
    shape = PoolShape.of(llama, 16, 2e9)
    assert shape is not None and shape.state_groups == 0
    assert shape.block_bytes == 16 * llama.kv_bytes_per_token  # a block of all 32 layers
    assert shape.blocks == 2e9 // shape.block_bytes


def test_a_hybrid_prompt_is_prefilled_at_the_engines_token_budget():
    """vLLM's ``max_num_batched_tokens`` is ``engine.token_budget`` on its hybrid pool too: a
    6,000-token prompt takes one step at the default 8,192 and three chunks at 2,048, and the
    policy's own ``max_num_batched_tokens``, where set, caps it."""
    ids = np.arange(6000, dtype=np.int32)
    requests = [Request(0, 0, 0, 0.0, ids, np.arange(10_000, 10_002, dtype=np.int32), 2)]

    def first_token(*policy: str, **options) -> float:
        w = world(requests, blocks=4096, block=16, policy=list(policy), **options)
        (record,) = w.run(SessionFeeder(requests))
        return record.first_token

    one_step = first_token()
    assert one_step == first_token(token_budget=8192)
    chunked = first_token(token_budget=2048)
    assert chunked != one_step  # three prefill steps, each with its own times
    assert first_token("policy.admission.max_num_batched_tokens=2048") == chunked
