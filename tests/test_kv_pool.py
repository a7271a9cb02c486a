"""The shared KV pool of the timed engine (``engine.kv_pool=shared``, ``engine.preemption``):
preemption under a tiny budget (LIFO, FIFO, SGLang's retraction), equality with separate pools
under a huge one, the budget invariant, a cluster of shared pools, bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from simlab.config import ClusterSettings
from simlab.engines.cluster.engine import ClusterEngine
from simlab.engines.records import RECORD_COLUMNS, records_frame
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.feeders import SessionFeeder
from simlab.engines.timed.jobs import Job
from simlab.engines.timed.kv_pool import KVPool
from simlab.engines.timed.preemption import Preemption
from simlab.run.breakdown import COLUMNS as PART_COLUMNS
from simlab.run.cli import USER_ERRORS
from simlab.run.simulate import simulate
from tests.fixtures import compose, policy_plugins, routed
from tests.test_cluster import A100, HYBRID, LLAMA, chat_requests
from traces.format import Request

KV = LLAMA.kv_bytes_per_token


def requests():
    return chat_requests(sessions=30, rate=4.0)


def longest(reqs) -> int:
    return max(r.input_tokens + r.output_len for r in reqs)


def build(policy="sglang_plus", spec=LLAMA, cache_bytes=1000 * KV):
    def make() -> RequestStep:
        admission, eviction = policy_plugins(policy)
        return RequestStep.build(spec, cache_bytes, admission, eviction, policy)

    return make


def engine(**settings) -> TimedEngine:
    return TimedEngine(hardware=A100, memory_check=False, **settings)


def tiny(reqs, **settings) -> TimedEngine:
    """A pool of 1,000 cached tokens + the longest request: the load must preempt."""
    return engine(kv_pool="shared", running_memory_gb=longest(reqs) * KV / 1e9, **settings)


@pytest.mark.parametrize("preemption", ["lifo", "fifo", "sglang"])
def test_a_tiny_pool_preempts_and_every_request_completes(preemption):
    reqs = requests()
    run = tiny(reqs, preemption=preemption).run(reqs, build()())
    frame = records_frame(run.records).assign(**run.columns)
    assert len(frame) == len(reqs) and frame["finished"].notna().all()
    assert sorted(frame["request_id"]) == sorted(r.request_id for r in reqs)
    extras = run.extras
    assert extras["kv_pool"] == "shared" and extras["preemption"] == preemption
    assert extras["preemptions"] > 0 and extras["recomputed_tokens"] > 0
    assert frame["preemptions"].sum() == extras["preemptions"]
    assert (frame["preemptions"] > 0).sum() == extras["preempted_requests"]
    assert extras["pool_evicted_gb"] > 0
    # a recomputed request keeps its first scheduling and first token
    assert (frame["first_token"] >= frame["scheduled"]).all()


def test_the_preemption_orders_differ_and_are_deterministic():
    reqs = requests()
    runs = {
        p: [records_frame(tiny(reqs, preemption=p).run(reqs, build()()).records) for _ in "ab"]
        for p in ("lifo", "fifo", "sglang")
    }
    for first, second in runs.values():
        pd.testing.assert_frame_equal(first, second)
    assert not runs["lifo"][0].equals(runs["fifo"][0])
    assert not runs["sglang"][0].equals(runs["lifo"][0])


def test_a_huge_pool_equals_separate_pools():
    reqs = requests()
    cache = 10**6 * KV  # nothing is ever evicted
    separate = engine(running_memory_gb=16.0).run(reqs, build(cache_bytes=cache)())
    shared = engine(kv_pool="shared", running_memory_gb=16.0).run(reqs, build(cache_bytes=cache)())
    assert shared.extras["preemptions"] == 0 and shared.extras["pool_evicted_gb"] == 0
    one, other = records_frame(separate.records), records_frame(shared.records)
    assert one["hit_tokens"].sum() == other["hit_tokens"].sum() > 0
    pd.testing.assert_frame_equal(one, other)
    assert set(shared.columns) == {"preemptions"} and not separate.columns
    assert "kv_pool" not in separate.extras


@pytest.mark.parametrize(("policy", "spec"), [("sglang_plus", LLAMA), ("vllm_plus", LLAMA)])
def test_cache_plus_running_bytes_never_exceed_the_budget(monkeypatch, policy, spec):
    checks: list[float] = []
    check = KVPool.check

    def spy(kv: KVPool) -> None:
        checks.append(kv.cache.used_bytes + kv.pool.held - kv.pool.budget)
        check(kv)

    monkeypatch.setattr(KVPool, "check", spy)
    reqs = requests()
    run = tiny(reqs).run(reqs, build(policy, spec)())
    assert run.extras["preemptions"] > 0
    assert len(checks) > 2 * len(reqs) and max(checks) <= 0


def test_the_invariant_check_catches_an_overdraft():
    reqs = requests()
    world = tiny(reqs).world(reqs, build()())
    world.pool.held = world.pool.budget + 1000.0
    with pytest.raises(RuntimeError, match="shared KV pool over budget"):
        world.memory.kv.check()


def test_a_hybrid_model_in_a_small_shared_pool_completes():
    reqs = requests()
    spec = HYBRID
    need = longest(reqs) * spec.kv_bytes_per_token + spec.ssm_state_bytes
    eng = engine(kv_pool="shared", running_memory_gb=2 * need / 1e9)
    run = eng.run(reqs, build("sglang_plus", spec, cache_bytes=need)())
    assert len(run.records) == len(reqs) and run.extras["preemptions"] >= 0


def test_a_pool_too_small_for_the_longest_request_is_an_error_naming_the_keys():
    reqs = requests()
    eng = engine(kv_pool="shared", running_memory_gb=0.01)
    with pytest.raises(USER_ERRORS, match=r"cache\.size_gb \+ engine\.running_memory_gb"):
        eng.run(reqs, build(cache_bytes=10 * KV)())


def test_a_cluster_of_shared_pools_counts_preemptions_per_replica():
    reqs = requests()
    timed = tiny(reqs)
    cluster = ClusterEngine(timed, ClusterSettings(2, "round_robin"))
    make = build()
    run = cluster.run(reqs, make(), make)
    frame = records_frame(run.records).assign(**run.columns)
    assert len(frame) == len(reqs)
    assert sum(run.extras["replica_preemptions"]) == run.extras["preemptions"]
    assert frame["preemptions"].sum() == run.extras["preemptions"]


def test_a_shared_run_writes_the_preemption_column_and_summary(tmp_path):
    overrides = [
        "engine.calibration=null",
        "report=false",
        "bounds.enabled=false",
        "+policy=sglang_plus",
        "trace=chat",
        "trace.n_sessions=10",
        "engine.kv_pool=shared",
    ]
    simulate(compose([*overrides, f"output_dir={tmp_path}"]))
    frame = pd.read_parquet(tmp_path / "records.parquet")
    parts = list(PART_COLUMNS.values())  # the reuse breakdown's (simlab.run.breakdown)
    assert list(frame.columns) == [*RECORD_COLUMNS, "preemptions", *parts]
    summary = json.loads((tmp_path / "summary.json").read_text())["policies"]["sglang_plus"]
    assert summary["kv_pool"] == "shared" and summary["preemptions"] == 0


SGLANG_POOL = ["engine.kv_pool=shared", "engine.request_admission=sglang"]


def test_an_overlap_run_says_so_in_its_summary_and_serves_every_request():
    """``engine.overlap`` (SGLang's overlap scheduler) under load on a tiny pool: every
    request completes, and the summary names the loop (absent: the normal one)."""
    reqs = requests()
    sglang = {"preemption": "sglang", "request_admission": "sglang"}
    overlap = tiny(reqs, overlap=True, **sglang).run(reqs, build()())
    normal = tiny(reqs, **sglang).run(reqs, build()())
    assert len(overlap.records) == len(normal.records) == len(reqs)
    assert overlap.extras["overlap"] is True and "overlap" not in normal.extras


BAD_POOL = [
    (["engine.kv_pool=foo"], "engine.kv_pool must be one of separate|shared, got 'foo'"),
    (["engine.preemption=bar"], "engine.preemption must be one of lifo|fifo|sglang, got 'bar'"),
    (
        ["engine.request_admission=eager"],
        "engine.request_admission must be one of whole|sglang, got 'eager'",
    ),
    (["engine.ignore_eos=maybe"], "engine.ignore_eos must be true or false, got 'maybe'"),
    (
        ["engine.batching=chunked"],
        "engine.batching must be one of mixed|prefill_first, got 'chunked'",
    ),
    (["engine.running_memory_gb=0"], "engine.running_memory_gb must be > 0, got 0"),
    (["engine.overlap=maybe"], "engine.overlap must be true or false, got 'maybe'"),
    (
        ["engine.overlap=true", "engine.kv_pool=shared"],  # marconi on the prefix tree
        "vLLM's async scheduling runs on vLLM's block pool (policy=vllm: a hybrid, or a "
        "Transformer with engine.kv_pool=shared); got engine.request_admission='whole' on the "
        "prefix tree",
    ),
    (
        ["engine.overlap=true", "engine.request_admission=sglang"],
        "engine.overlap with engine.request_admission=sglang is SGLang's overlap scheduler: it "
        "needs engine.kv_pool=shared, got 'separate'",
    ),
    (
        ["engine.overlap=true", *SGLANG_POOL],  # marconi_7b, the default model, is a hybrid
        "engine.overlap: SGLang runs a hybrid model under its overlap scheduler only with "
        "policy.mamba=extra_buffer",
    ),
    (
        [
            "engine.overlap=true",
            *SGLANG_POOL,
            "+policy=sglang",
            "policy.mamba=extra_buffer",
            "policy.admission.tracking_slots=1",
        ],
        "got policy.mamba='extra_buffer', tracking_slots=1",
    ),
    (
        ["engine.kv_pool=shared", "engine.running_memory_gb=-1"],
        "engine.running_memory_gb must be >= 0 with kv_pool=shared, got -1",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_POOL, ids=lambda v: str(v)[:40])
def test_bad_pool_config_is_one_line_naming_the_key(tmp_path, overrides, message):
    out = tmp_path / "out"
    cfg = compose(["report=false", "engine.calibration=null", *overrides, f"output_dir={out}"])
    with pytest.raises(USER_ERRORS) as caught:
        simulate(cfg)
    text = str(caught.value)
    assert message in text and "\n" not in text


def test_a_shared_pool_may_be_the_cache_alone():
    """``running_memory_gb=0`` with a shared pool (a DynoSim / vLLM ``num_gpu_blocks`` budget):
    the budget is ``cache.size_gb`` and running requests take it from the cache."""
    reqs = requests()
    cache_bytes = (longest(reqs) + 1000) * KV
    alone = engine(kv_pool="shared", running_memory_gb=0).run(
        reqs, build(cache_bytes=cache_bytes)()
    )
    split = engine(kv_pool="shared", running_memory_gb=longest(reqs) * KV / 1e9).run(
        reqs, build(cache_bytes=1000 * KV)()
    )
    assert alone.extras["pool_gb"] == pytest.approx(split.extras["pool_gb"])
    assert records_frame(alone.records).equals(records_frame(split.records))


def test_a_shared_pool_does_not_keep_room_twice_for_a_running_prompt():
    """A block pool's publish keeps room for the blocks its request holds, unless the engine
    counts them itself, as the shared pool does. vLLM, 16-token blocks, a pool of 7 blocks
    (112 tokens). A (40 tokens: 2 full blocks and a partial one) leaves 2 blocks cached. B, 40
    other tokens, runs holding 40 tokens of the pool, so the cache has 72: A's 32 stay beside
    B's 2 published blocks. Keeping room for B's 3 blocks once more would evict A's last block,
    and A's prompt again would hit 16 tokens, not 32."""
    prompts = [list(range(40)), list(range(100, 140)), list(range(40))]
    reqs = [
        Request(i, i, 0, 100.0 * i, np.asarray(p, dtype=np.int32), np.asarray([7], np.int32), 1)
        for i, p in enumerate(prompts)
    ]
    shared = engine(kv_pool="shared", running_memory_gb=0)
    run = shared.run(reqs, routed(build("vllm", cache_bytes=7 * 16 * KV)(), shared, reqs))
    frame = records_frame(run.records).set_index("request_id")
    assert frame["hit_tokens"].tolist() == [0, 0, 32]
    assert frame["bytes_evicted"].sum() == 0


def outputs_key(job: Job) -> tuple[int, int]:
    """SGLang's retraction key: (outputs sampled so far, -prompt length)."""
    return (job.input_tokens - job.req.input_tokens + job.decoded + 1, -job.req.input_tokens)


def test_sglang_retracts_the_fewest_outputs_first_until_the_next_step_fits(monkeypatch):
    """``engine.preemption=sglang`` (``retract_decode``): each victim has the fewest outputs
    of the decoders left (ties: the longest prompt), joins the back of the queue, and the
    retraction stops once the others fit their next step (or one is left)."""
    victims: list[tuple[tuple[int, int], list[tuple[int, int]]]] = []
    after: list[bool] = []
    retracting: list[bool] = []
    drop, retract = Preemption.drop_progress, Preemption.retract

    def spy_drop(preemption: Preemption, victim: Job) -> None:
        if retracting:
            running = preemption.world.running
            others = [outputs_key(j) for j in running if j.prefilled >= j.input_tokens]
            victims.append((outputs_key(victim), others))
        drop(preemption, victim)

    def spy_retract(preemption: Preemption, decoders: list[Job]) -> None:
        world = preemption.world
        retracting.append(True)
        retract(preemption, decoders)
        retracting.clear()
        left = [j for j in decoders if j in world.running]
        room = len(left) * KV
        after.append(len(left) == 1 or world.cache.free_bytes >= room)
        assert world.waiting[-1] not in world.running and world.waiting[-1].preemptions

    monkeypatch.setattr(Preemption, "drop_progress", spy_drop)
    monkeypatch.setattr(Preemption, "retract", spy_retract)
    reqs = requests()
    run = tiny(reqs, preemption="sglang").run(reqs, build()())
    assert len(run.records) == len(reqs) and run.extras["preemptions"] >= len(victims) > 0
    assert all(not others or key <= min(others) for key, others in victims)
    assert after and all(after)


def test_sglang_retracts_until_the_rest_fit_their_next_step():
    """Twelve 4-token prompts decoding 300 tokens each in a pool of 1,200 tokens: when a step
    does not fit, SGLang 0.5.23 retracts one request, then more only while the rest do not fit
    their next step (``check_decode_mem``: one token each, not the 20 steps older versions
    asked); one retraction frees enough here every time (the 20-step rule retracted several
    at once), and every request still completes."""
    reqs = [
        Request(
            i, i, 0, 0.0, np.arange(4 * i, 4 * i + 4, dtype=np.int32), np.zeros(0, np.int32), 300
        )
        for i in range(12)
    ]
    world = engine(kv_pool="shared", running_memory_gb=1200 * KV / 1e9, preemption="sglang").world(
        reqs, build(cache_bytes=KV)()
    )
    sizes: list[int] = []
    preemption = world.memory.preemption
    retract = preemption.retract

    def spy(decoders: list[Job]) -> None:
        before = len(world.waiting)
        retract(decoders)
        sizes.append(len(world.waiting) - before)
        left = [j for j in decoders if j in world.running]
        assert len(left) == 1 or world.cache.free_bytes >= len(left) * KV

    preemption.retract = spy  # type: ignore[method-assign]
    records = world.run(SessionFeeder(reqs))
    assert len(records) == len(reqs) and sizes and set(sizes) == {1}


def token_request(rid: int, prompt: np.ndarray, outputs: np.ndarray) -> Request:
    return Request(rid, rid, 0, float(rid), prompt, outputs, int(outputs.shape[0]))


def test_a_recompute_is_matched_and_published_with_its_sampled_outputs():
    """SGLang keys a retracted request by its fill ids (``origin_input_ids + output_ids``): it
    publishes the outputs it prefills again with its prompt, split at the prompt's end, and a
    later match runs into them (up to the last id, as for a prompt). A hybrid's fill is
    published with the state at its end, not at its prompt's (its one extend ran through the
    outputs: ``checkpoint_kv_cache`` up to ``extend_end``), which a later turn hits."""
    prompt, outputs = np.arange(50, dtype=np.int32), np.arange(1000, 1020, dtype=np.int32)
    step = build("sglang", cache_bytes=1000 * KV)()
    started = step.start(token_request(0, prompt, outputs), refill=10)
    assert (started.refill, started.fill) == (10, 60)
    step.prefilled(started, keep_room=False)
    assert step.cache.deepest_cached(started.seq[:60]).end == 60
    assert step.cache.deepest_cached(prompt).end == 50  # split at the prompt's end
    next_turn = token_request(1, np.concatenate((prompt, outputs[:15])), np.asarray([7], np.int32))
    assert step.match_queued(next_turn)[0] == 60
    again = step.start(token_request(0, prompt, outputs), refill=10)
    assert again.hit == 59  # its own fill, less the position that samples

    hybrid = build("sglang", spec=HYBRID, cache_bytes=10**10)()
    started = hybrid.start(token_request(0, prompt, outputs), refill=10)
    assert (started.refill, started.fill) == (10, 60)
    hybrid.prefilled(started, keep_room=False)
    fill_node, prompt_node = (hybrid.cache.deepest_cached(x) for x in (started.seq[:60], prompt))
    assert (fill_node.end, fill_node.ckpt) == (60, True)
    assert (prompt_node.end, prompt_node.ckpt) == (50, False)  # no state at the prompt's end
    assert hybrid.match_queued(next_turn)[0] == 60


def test_sglangs_publish_is_newer_than_the_matches_before_it():
    """SGLang stamps every access from one global counter: a request's publish at its end is
    later than another request's match earlier in the same step, so under LRU that match's
    leaf goes first (``RadixLRU.ticks_on_insert``). With the match's clock the two tied and
    the older node, the publisher's, went first: 1-3 hits differed in 8 ``extra_buffer`` cases
    against SGLang."""
    step = build("sglang", cache_bytes=1000 * KV)()
    cache = step.cache
    one = np.asarray([7], np.int32)  # one output: the finish publishes the prompt again
    first = token_request(0, np.arange(40, dtype=np.int32), one)
    other = token_request(1, np.arange(100, 130, dtype=np.int32), one)
    started = step.start(first)
    step.prefilled(started, keep_room=False)  # the first prompt's node: the older one
    step.finish(step.start(other))  # the other prompt's node
    matched = step.start(other)  # matched again (a queued request, say), then let go
    step.abort(matched)
    step.finish(started)  # the first request's end refreshes its prompt after that match
    published, other_node = (cache.deepest_cached(r.input_ids) for r in (first, other))
    assert published.nid < other_node.nid
    assert cache.last_access[published.slot] > cache.last_access[other_node.slot]
    assert cache.next_victim(step.eviction) is other_node
