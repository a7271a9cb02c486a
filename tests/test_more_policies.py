"""GDSF, LFU and Marconi+ under the eviction protocol (contract tests and goldens cover them
through configs/policy/*.yaml; these check what each one is meant to do)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from policies.flop_aware import FlopAware
from policies.gdsf import GDSF
from policies.judicious import Judicious
from policies.lfu import LFU, HitCounts
from policies.lru import LRU
from policies.marconi_plus import MarconiPlus
from simlab.cache.prefix import PrefixCache
from simlab.engines.replay import replay
from tests.fixtures import chat_trace, model

HYBRID = model("marconi_7b")
LLAMA = model("llama3_8b")
CKPT = HYBRID.ssm_state_bytes


def leaves(spec, lengths, accesses, policy):
    """One leaf per length (distinct tokens), admitted at the given clock values."""
    cache = PrefixCache(spec, math.inf)
    for i, (length, when) in enumerate(zip(lengths, accesses, strict=True)):
        cache.now = float(when)
        cache.insert(np.full(length, 1000 + i, dtype=np.int32), [length], length, policy)
    cache.now = float(max(accesses) + 1)
    return cache


def hit(cache, policy, tokens):
    look = cache.lookup(np.append(tokens, np.int32(-1)))
    policy.on_hit(cache, look)
    return look


# --------------------------------------------------------------------------- LFU
def test_lfu_evicts_the_least_hit_leaf_ties_by_recency():
    lfu = LFU()
    cache = leaves(LLAMA, [10, 10, 10], [1, 2, 3], lfu)
    cache.now = 4.0
    hit(cache, lfu, np.full(10, 1000, np.int32))  # leaf 0: 2 hits now
    assert cache.next_victim(lfu).tokens[0] == 1001  # 1001 and 1002 tie on 1: older goes
    cache.now = 5.0
    hit(cache, lfu, np.full(10, 1001, np.int32))
    assert cache.next_victim(lfu).tokens[0] == 1002


def test_hit_counts_never_leak_to_a_reused_slot_and_splits_inherit():
    counts, lru = HitCounts(), LRU()
    cache = PrefixCache(LLAMA, math.inf)
    seq = np.arange(100, dtype=np.int32)
    cache.insert(seq, [], 100, lru)
    counts.sync(cache)
    (node,) = cache.nodes()
    counts.count[node.slot] = 5.0
    cache.insert(np.concatenate((seq[:40], [7, 7])), [], 42, lru)  # splits [0,100) at 40
    counts.sync(cache)
    upper = next(n for n in cache.nodes() if n.end == 40)
    assert counts.count[upper.slot] == 5.0 and counts.count[node.slot] == 5.0
    tail = next(n for n in cache.nodes() if n.end == 42)
    cache.capacity = cache.used_bytes
    cache.evict(1, lru)  # the least recent leaf goes: same tick, oldest node = node
    cache.insert(np.full(3, 9, np.int32), [], 3, lru)
    counts.sync(cache)
    fresh = next(n for n in cache.nodes() if n.end == 3)
    assert counts.count[fresh.slot] == 1.0 and counts.nid[fresh.slot] == fresh.nid
    assert counts.count[tail.slot] == 1.0


# --------------------------------------------------------------------------- GDSF
def test_gdsf_value_is_frequency_times_cost_per_byte():
    gdsf = GDSF()
    cache = leaves(HYBRID, [20, 8000], [1, 1], gdsf)
    cand = cache.candidates(inner=False)
    h = gdsf.scores(cache, cand)
    expected = cache.saved_flops[cand] / cache.node_bytes[cand]
    assert np.allclose(h, expected)
    assert cache.next_victim(gdsf).end == 20  # a short node: its SSM state dominates its bytes
    cache.now = 3.0
    hit(cache, gdsf, np.full(20, 1000, np.int32))
    hit(cache, gdsf, np.full(20, 1000, np.int32))
    assert np.allclose(gdsf.scores(cache, cand), expected * np.where(cache.nids[cand] == 1, 3, 1))


def test_gdsf_inflation_is_the_last_evicted_value():
    gdsf = GDSF()
    cache = leaves(LLAMA, [10, 20, 30], [1, 1, 1], gdsf)
    cand = cache.candidates(inner=False)
    h = dict(zip(cache.nids[cand].tolist(), gdsf.scores(cache, cand).tolist(), strict=True))
    lowest = min(h.values())
    cache.capacity = cache.used_bytes
    cache.evict(1, gdsf)
    cache.now = 5.0
    look = hit(cache, gdsf, np.full(30, 1002, np.int32))
    assert gdsf.inflation == pytest.approx(lowest)
    # the re-used node is re-based on L; the untouched one keeps its old base (0)
    cand = cache.candidates(inner=False)
    after = dict(zip(cache.nids[cand].tolist(), gdsf.scores(cache, cand).tolist(), strict=True))
    reused = look.path[-1].nid
    assert after[reused] == pytest.approx(lowest + 2 * h[reused])
    other = next(n for n in after if n != reused)
    assert after[other] == pytest.approx(h[other])


# --------------------------------------------------------------------------- Marconi+
@pytest.mark.parametrize("seed", [0, 1])
def test_marconi_plus_with_marconi_terms_is_marconi(seed):
    trace = chat_trace(seed=seed)
    runs = []
    for policy in (
        FlopAware(alpha=1.0),
        MarconiPlus(alpha=1.0, recency="inverse", landing=False, ckpt_ancestor=False),
    ):
        records = replay(trace.requests(), PrefixCache(HYBRID, 15 * CKPT), Judicious(), policy, "")
        runs.append([r.hit_tokens for r in records])
    assert runs[0] == runs[1]


def test_marconi_plus_alpha_zero_ranks_like_recency():
    policy = MarconiPlus(alpha=0.0)
    cache = leaves(HYBRID, [10, 5000, 300, 80, 2000], [5, 1, 4, 2, 3], policy)
    cand = cache.candidates(inner=True)
    assert np.array_equal(
        np.argsort(policy.scores(cache, cand), kind="stable"),
        np.argsort(cache.last_access[cand], kind="stable"),
    )


def test_marconi_plus_values_a_one_child_checkpoint_by_the_hits_landing_on_it():
    """Checkpoints at 600 (a hit landed there) and 1000 (passed through only) inside chains:
    the landed one keeps half its FLOPs-per-byte value (k / (k + 1), k = 1), the other none."""
    policy, plain = MarconiPlus(), MarconiPlus(landing=False)
    cache = PrefixCache(HYBRID, math.inf)
    system = np.arange(5000, 5600, dtype=np.int32)
    cache.now = 1.0
    cache.insert(system, [600], 600, policy)
    cache.insert(np.arange(3000, dtype=np.int32), [1000, 3000], 3000, policy)
    cache.now = 2.0
    seq = np.concatenate((system, np.arange(9000, 9100, dtype=np.int32)))
    assert hit(cache, policy, seq[:-1]).hit == 600
    cache.insert(seq, [len(seq)], len(seq), policy)
    inner = sorted((n for n in cache.nodes() if len(n.children) == 1), key=lambda n: n.end)
    assert [n.end for n in inner] == [600, 1000]
    cand = np.array([n.slot for n in inner])
    eff, ok = policy._efficiency(cache, cand)
    base, _ = plain._efficiency(cache, cand)
    assert ok.all() and eff[0] == pytest.approx(base[0] / 2) and eff[1] == 0.0 < base[1]
    assert base[0] == pytest.approx(cache.saved_flops[cand[0]] / cache.node_bytes[cand[0]])


def test_marconi_plus_alpha_hook_validates():
    policy = MarconiPlus()
    policy.set_alpha(0.25)
    assert policy.alpha == 0.25
    with pytest.raises(ValueError, match="alpha"):
        policy.set_alpha(-1.0)
    with pytest.raises(ValueError, match="recency"):
        MarconiPlus(recency="square")


def test_marconi_plus_counts_lost_flops_in_tokens_on_a_hash_id_trace():
    """With ids of 512 tokens (a Mooncake trace) a leaf below the root loses exactly the FLOPs
    the cache saved for it: the node's ends are converted to tokens (in ids, its attention
    term was 512x and its linear term 512x too small, and the ranking distorted)."""
    policy = MarconiPlus(alpha=1.0, landing=False, frequency=False)
    for unit in (1, 512):
        cache = PrefixCache(HYBRID, math.inf, unit_tokens=unit)
        cache.insert(np.arange(1, 9, dtype=np.int32), [8], 8, policy)
        (leaf,) = cache.nodes()
        cand = np.array([leaf.slot])
        lost, _ = policy._efficiency(cache, cand)
        assert lost[0] * cache.node_bytes[leaf.slot] == pytest.approx(
            cache.saved_flops[leaf.slot], rel=1e-12
        )
        assert cache.saved_flops[leaf.slot] == pytest.approx(HYBRID.prefill_flops(0, 8 * unit))
