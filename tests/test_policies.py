"""Contract tests every policy inherits, oracles, and golden hit counts."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from policies.fifo import FIFO
from policies.flop_aware import FlopAware
from policies.judicious import Judicious
from policies.lru import LRU
from simlab.cache.prefix import PrefixCache
from simlab.config import run_settings
from simlab.engines.records import records_frame
from simlab.engines.replay import replay_step
from simlab.engines.step import RequestStep
from simlab.run.simulate import policy_spec, policy_step
from tests.fixtures import (
    POLICIES,
    chat_trace,
    compose,
    hot_prefix_trace,
    ideal_hits,
    model,
    policy_plugins,
    updating_goldens,
)
from traces.format import Request

HYBRID = model("marconi_7b")
LLAMA = model("llama3_8b")
GOLDENS = Path(__file__).parent / "goldens" / "hit_tokens.json"
CKPT = HYBRID.ssm_state_bytes


def run(policy: str, trace, spec, capacity, overrides=None):
    admission, eviction = policy_plugins(policy, overrides)
    step = RequestStep.build(spec, capacity, admission, eviction, policy)
    records = replay_step(list(trace.requests()), step)
    return step.cache, records_frame(records)


def test_standard_policy_set_is_configured():
    assert {"vllm_plus", "sglang_plus", "marconi", "fifo"} <= set(POLICIES)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("capacity_ckpts", [3, 12, 40])
def test_never_over_capacity(policy, capacity_ckpts):
    trace = chat_trace(seed=1)
    cache, frame = run(policy, trace, HYBRID, capacity_ckpts * CKPT)
    resident = frame["cache_kv_bytes"] + frame["cache_ssm_bytes"]
    assert (resident <= capacity_ckpts * CKPT).all()
    assert cache.peak_bytes <= capacity_ckpts * CKPT
    cache.check_invariants()


@pytest.mark.parametrize("policy", POLICIES)
def test_never_evicts_a_pinned_node(policy):
    """Keep the hit path of every third request pinned (in flight) while the rest replays."""
    admission, eviction = policy_plugins(policy)
    step = RequestStep.build(HYBRID, 25 * CKPT, admission, eviction, policy)
    cache = step.cache
    pinned = []
    for tick, req in enumerate(chat_trace(seed=2).requests(), start=1):
        started = step.start(req, pin=False)
        look = started.lookup
        if tick % 3 == 0 and look.hit_node is not None and len(pinned) < 4:
            cache.pin(look.hit_node)
            pinned.append((look.hit_node, look.hit))
        step.finish(started)
        for node, hit_end in pinned:
            assert cache.slot_nodes()[node.slot] is node and node.end >= hit_end
        assert cache.used_bytes <= cache.capacity
    assert pinned, "fixture should produce pinned hits"
    cache.check_invariants()


@pytest.mark.parametrize("policy", POLICIES)
def test_same_trace_same_records(policy):
    a = run(policy, chat_trace(seed=3), HYBRID, 10 * CKPT)[1]
    b = run(policy, chat_trace(seed=3), HYBRID, 10 * CKPT)[1]
    assert a.equals(b)


@pytest.mark.parametrize("policy", ["sglang_plus", "marconi"])
def test_infinite_cache_gives_ideal_reuse_for_transformers(policy):
    trace = chat_trace(seed=4)
    _, frame = run(policy, trace, LLAMA, math.inf)
    assert frame["hit_tokens"].tolist() == ideal_hits(trace)


def test_infinite_cache_fine_grained_gives_ideal_reuse_in_whole_blocks():
    trace = chat_trace(seed=4)
    _, frame = run("vllm_plus", trace, LLAMA, math.inf)
    assert frame["hit_tokens"].tolist() == [(h // 32) * 32 for h in ideal_hits(trace)]


def test_infinite_cache_with_every_token_checkpointed_gives_ideal_reuse_for_hybrids():
    trace = chat_trace(seed=5)
    _, frame = run("vllm_plus", trace, HYBRID, math.inf, ["policy.admission.block_size=1"])
    assert frame["hit_tokens"].tolist() == ideal_hits(trace)


ID_TOKENS = 512  # a Mooncake hash id


def _spelled_out(req: Request) -> Request:
    """A hash-id request as a token request: id ``i`` as the tokens ``512 i .. 512 i + 511``."""
    offsets = np.arange(ID_TOKENS, dtype=np.int32)
    tokens = (req.input_ids[:, None] * ID_TOKENS + offsets).ravel()
    return replace(req, input_ids=tokens.astype(np.int32), block_size=1)


@pytest.mark.parametrize(("policy", "states_per_id"), [("vllm_plus", 16), ("sglang_hybrid", 2)])
def test_a_hash_id_holds_the_states_its_tokens_would(policy, states_per_id):
    """An admission finer than an id keeps its states inside the id: the paper's vLLM+ a state
    per 32 tokens (16 in a 512-token id), SGLang's interval cache one per 256 (2). So a hash-id
    trace admits, per request, the KV, states and bytes its tokens spelled out admit, and hits
    as deep. An id held one state before, so vLLM+ on a hash-id trace kept up to 16 times as
    many ids as it could (on the Mooncake sample at 20 GB, Nemotron-H-8B: hit rate 0.0202,
    0.0021 now)."""
    cfg = compose([f"+policy={policy}", "cache.size_gb=inf"])
    settings = run_settings(cfg)
    by_ids = policy_step(policy_spec(policy, cfg.policy), HYBRID, settings, unit_tokens=ID_TOKENS)
    by_tokens = policy_step(policy_spec(policy, cfg.policy), HYBRID, settings)
    empty = np.zeros(0, dtype=np.int32)
    prompts = [[1, 2, 3], [1, 2, 4, 5], [1, 2, 4, 6], [7], [1, 2, 4, 5, 8]]
    fields = ("hit_tokens", "kv_bytes_admitted", "ssm_bytes_admitted", "ckpts_admitted")
    hits = []
    for i, prompt in enumerate(prompts):
        req = Request(i, i, 0, float(i), np.array(prompt, np.int32), empty, 1, ID_TOKENS)
        ids, tokens = by_ids.serve(req), by_tokens.serve(_spelled_out(req))
        assert [getattr(ids, f) for f in fields] == [getattr(tokens, f) for f in fields]
        hits.append(ids.hit_tokens)
    assert hits == [0, 1024, 1536, 0, 2048]
    assert by_ids.cache.used_bytes == by_tokens.cache.used_bytes
    assert by_ids.cache.ssm_bytes == states_per_id * 8 * CKPT  # ids 1 to 8, each cached once
    by_ids.cache.check_invariants()


def _cache_with_leaves(spec, lengths, accesses):
    cache = PrefixCache(spec, math.inf)
    for i, (length, when) in enumerate(zip(lengths, accesses, strict=True)):
        cache.now = float(when)
        s = np.full(length, 1000 + i, dtype=np.int32)
        cache.insert(s, [length], length, LRU())
    cache.now = float(max(accesses) + 1)
    return cache


def test_alpha_zero_ranks_like_recency():
    cache = _cache_with_leaves(HYBRID, [10, 5000, 300, 80, 2000], [5, 1, 4, 2, 3])
    cand = cache.candidates(inner=True)
    utility = FlopAware(alpha=0.0).scores(cache, cand)
    assert np.array_equal(
        np.argsort(utility, kind="stable"), np.argsort(cache.last_access[cand], kind="stable")
    )
    assert cache.next_victim(FlopAware(alpha=0.0)) is cache.next_victim(LRU())


def test_flop_aware_prefers_keeping_long_sequences():
    """Same recency: the short node saves few FLOPs per byte (its SSM state dominates)."""
    cache = _cache_with_leaves(HYBRID, [20, 8000], [1, 1])
    assert cache.next_victim(FlopAware(alpha=1.0)).end == 20
    assert cache.next_victim(FlopAware(alpha=0.0)).end == 20  # same recency: oldest node


def test_lru_evicts_least_recent_leaf_first():
    cache = _cache_with_leaves(HYBRID, [10, 20, 30], [3, 1, 2])
    cache.capacity = cache.used_bytes
    cache.evict(1, LRU())  # free one byte: exactly one leaf goes
    assert sorted(n.end for n in cache.nodes()) == [10, 30]


def test_judicious_checkpoints_the_branch_point_then_hits_it():
    cache = PrefixCache(HYBRID, math.inf)
    adm, lru = Judicious(), LRU()
    system = np.arange(500, dtype=np.int32)
    for i, tail in enumerate(
        (np.full(50, 7, np.int32), np.full(60, 8, np.int32), np.full(70, 9, np.int32))
    ):
        cache.now = float(i + 1)
        req = np.concatenate((system, tail))
        look = cache.lookup(req)
        plan = adm.plan(look, len(req), len(req) + 10)
        full = np.concatenate((req, np.full(10, 3, np.int32)))
        cache.insert(full, plan.ckpts, plan.end, lru)
        # 1st: miss, leaf ckpt only; 2nd: branch found at 500 and checkpointed; 3rd: hits it
        assert look.hit == [0, 0, 500][i]
        assert plan.ckpts == [[len(full)], [500, len(full)], [len(full)]][i]


def test_judicious_round_down_alignment_moves_the_branch_checkpoint():
    cache = PrefixCache(HYBRID, math.inf)
    cache.insert(np.arange(600, dtype=np.int32), [600], 600, LRU())
    look = cache.lookup(np.concatenate((np.arange(500, dtype=np.int32), np.full(5, 9, np.int32))))
    assert Judicious(alignment="round_down", chunk_size=256).plan(look, 505, 520).ckpts == [
        256,
        520,
    ]
    assert Judicious(alignment="exact").plan(look, 505, 520).ckpts == [500, 520]


#: Golden workloads: (key, trace, model, capacities in SSM checkpoints). The chat fixtures
#: barely tell recency apart from admission order; the hot-prefix ones do (see
#: :func:`tests.fixtures.hot_prefix_trace`), on a hybrid and on a pure Transformer.
GOLDEN_WORKLOADS = [
    *(
        (f"chat{seed}", lambda seed=seed: chat_trace(seed=seed), HYBRID, (4, 15, 60))
        for seed in (0, 1)
    ),
    *(
        (f"hot{seed}", lambda seed=seed: hot_prefix_trace(seed), HYBRID, (15, 40, 60))
        for seed in (0, 1)
    ),
    *(
        (f"hot{seed}_llama", lambda seed=seed: hot_prefix_trace(seed), LLAMA, (40, 100))
        for seed in (0, 1)
    ),
]


def _golden_table(policy: str) -> dict:
    table = {}
    for name, make_trace, spec, capacities in GOLDEN_WORKLOADS:
        for cap in capacities:
            _, frame = run(policy, make_trace(), spec, cap * CKPT)
            table[f"{policy}/{name}/{cap}ckpt"] = int(frame["hit_tokens"].sum())
    return table


@pytest.mark.parametrize("policy", POLICIES)
def test_golden_hit_counts(policy):
    """Golden hit tokens per (policy, fixture, capacity), one policy per test (they run in
    parallel). After a reviewed semantic change, regenerate with SIMLAB_UPDATE_GOLDENS=1
    (``make test`` then runs the tests one at a time) and commit the diff of the JSON file."""
    table = _golden_table(policy)
    if updating_goldens():
        pinned = json.loads(GOLDENS.read_text()) if GOLDENS.exists() else {}
        pinned = {k: v for k, v in pinned.items() if not k.startswith(f"{policy}/")} | table
        GOLDENS.parent.mkdir(exist_ok=True)
        GOLDENS.write_text(json.dumps(pinned, indent=2, sort_keys=True) + "\n")
    pinned = {
        k: v for k, v in json.loads(GOLDENS.read_text()).items() if k.startswith(f"{policy}/")
    }
    changed = {k: (pinned.get(k), table.get(k)) for k in pinned.keys() | table.keys()}
    assert {k: v for k, v in changed.items() if v[0] != v[1]} == {}  # key: (golden, now)


def test_every_golden_is_of_a_policy_still_tested():
    """A golden of a policy no longer in POLICIES is stale (the per-policy tests never see it)."""
    pinned = json.loads(GOLDENS.read_text())
    assert {k.split("/")[0] for k in pinned} == set(POLICIES)


class _Rescoring:
    """An eviction policy seen through the cache's reference path: every victim chosen by
    rescoring all candidates (``scores_depend_on_candidates``), no heap, no chain shortcut."""

    scores_depend_on_candidates = True

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


STATIC_SCORED = [p for p in POLICIES if not policy_plugins(p)[1].scores_depend_on_candidates]


@pytest.mark.parametrize("policy", STATIC_SCORED)
@pytest.mark.parametrize("capacity_ckpts", [4, 15])
def test_heap_eviction_follows_the_rescoring_order(policy, capacity_ckpts):
    """The heap (with its chain fast path) evicts exactly the nodes a full rescan would pick,
    in the same order: records and the final tree are the same."""
    trace = chat_trace(seed=4, sessions=16)
    admission, eviction = policy_plugins(policy)
    fast = RequestStep.build(HYBRID, capacity_ckpts * CKPT, admission, eviction, policy)
    a = records_frame(replay_step(list(trace.requests()), fast))
    admission, eviction = policy_plugins(policy)
    slow = RequestStep.build(HYBRID, capacity_ckpts * CKPT, admission, _Rescoring(eviction), policy)
    b = records_frame(replay_step(list(trace.requests()), slow))
    assert a["nodes_evicted"].sum() > 0
    assert a.equals(b)
    assert sorted(n.nid for n in fast.cache.nodes()) == sorted(n.nid for n in slow.cache.nodes())


# --------------------------------------------------------------------------- FIFO vs recency
def _eviction_order(cache, policy) -> list[int]:
    """End positions of the nodes the policy evicts, one at a time, until none is left."""
    order = []
    cache.capacity = cache.used_bytes
    while True:
        before = {n.nid: n.end for n in cache.nodes()}
        if cache.evict(cache.free_bytes + 1, policy)[1] == 0:
            return order
        after = {n.nid for n in cache.nodes()}
        order += [end for nid, end in before.items() if nid not in after]


def _split_tree(policy):
    """t=1: A = 0..99; t=2: C (unrelated); t=3: B shares A's first 50 tokens (splits A);
    t=4: A's whole input is hit again."""
    cache = PrefixCache(LLAMA, math.inf)
    a = np.arange(100, dtype=np.int32)
    b = np.concatenate((a[:50], np.full(30, 7000, np.int32)))
    c = np.full(60, 9000, np.int32)
    for now, seq in enumerate((a, c, b), start=1):
        cache.now = float(now)
        policy.on_hit(cache, cache.lookup(seq))
        cache.insert(seq, [], len(seq), policy)
    cache.now = 4.0
    policy.on_hit(cache, cache.lookup(np.append(a, np.int32(-1))))
    return cache


def test_fifo_split_keeps_the_age_of_the_tokens_and_a_hit_refreshes_nothing():
    fifo = FIFO()
    cache = _split_tree(fifo)
    by_end = {(n.start, n.end): n for n in cache.nodes()}
    scores = {k: float(fifo.scores(cache, np.array([n.slot]))[0]) for k, n in by_end.items()}
    # A's halves [0, 50) and [50, 100) were born at 1 (the split at 3 and the hit at 4 change
    # nothing), C at 2, B's new tail at 3.
    assert scores == {(0, 50): 1.0, (50, 100): 1.0, (0, 60): 2.0, (50, 80): 3.0}
    # FIFO: A's tail, C, B's tail, then A's head (a leaf now, and the oldest);
    # LRU: the hit at 4 keeps both halves of A until last.
    assert _eviction_order(cache, fifo) == [100, 60, 80, 50]
    assert _eviction_order(_split_tree(LRU()), LRU()) == [60, 80, 100, 50]


def test_fifo_never_leaks_a_birth_to_a_reused_slot():
    fifo = FIFO()
    cache = PrefixCache(LLAMA, math.inf)
    cache.now = 1.0
    cache.insert(np.arange(10, dtype=np.int32), [], 10, fifo)
    (old,) = cache.nodes()
    cache.capacity = cache.used_bytes
    cache.evict(cache.free_bytes + 1, fifo)
    cache.capacity = math.inf
    cache.now = 7.0
    cache.insert(np.full(10, 5, np.int32), [], 10, fifo)
    (new,) = cache.nodes()
    assert new.slot == old.slot and new.nid != old.nid
    assert fifo.scores(cache, np.array([new.slot])).tolist() == [7.0]


def _hot_and_cold_hits(policy, spec, capacity_ckpts, every=4):
    _, frame = run(policy, hot_prefix_trace(0, hot_every=every), spec, capacity_ckpts * CKPT)
    hits = frame["hit_tokens"].to_numpy()
    hot = np.arange(len(hits)) % every == every - 1
    return hits[hot], hits[~hot]


@pytest.mark.parametrize(("spec", "capacity_ckpts"), [(HYBRID, 60), (LLAMA, 40)])
def test_refreshing_on_a_hit_keeps_hot_prefixes_that_fifo_evicts(spec, capacity_ckpts):
    """Hot prefixes re-requested among a stream of one-off sequences, in a cache that holds a
    fraction of the stream: LRU (SGLang+) refreshes a hot prefix on every hit and keeps it;
    FIFO evicts it once the cold sequences admitted after it fill the cache, and misses."""
    lru_hot, lru_cold = _hot_and_cold_hits("sglang_plus", spec, capacity_ckpts)
    fifo_hot, fifo_cold = _hot_and_cold_hits("fifo", spec, capacity_ckpts)
    assert lru_cold.sum() == fifo_cold.sum() == 0  # one-off sequences never hit
    assert ((lru_hot > 0) & (fifo_hot == 0)).any()  # FIFO lost hot prefixes LRU kept
    assert ((fifo_hot > 0) <= (lru_hot > 0)).all()  # and kept none that LRU lost
    assert lru_hot.sum() > fifo_hot.sum()
