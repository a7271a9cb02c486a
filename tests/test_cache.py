"""Radix cache: oracles (brute-force LCP), hit rules, byte accounting, pins, a state machine."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from policies.flop_aware import FlopAware
from policies.lru import LRU
from simlab.cache import insertion
from simlab.cache.prefix import PrefixCache
from tests.fixtures import model

LLAMA = model("llama3_8b")
HYBRID = model("marconi_7b")


def seq(*tokens: int) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


small_seqs = st.lists(st.integers(0, 3), min_size=1, max_size=24).map(
    lambda v: np.asarray(v, dtype=np.int32)
)


@settings(max_examples=200, deadline=None)
@given(st.lists(small_seqs, min_size=1, max_size=12), small_seqs)
def test_radix_match_equals_brute_force_lcp(stored, query):
    cache = PrefixCache(LLAMA, math.inf)
    for s in stored:
        cache.insert(s, [], len(s), LRU())
    expected = max(lcp(s, query) for s in stored)
    look = cache.lookup(query)
    assert look.matched == expected
    assert look.hit == min(expected, len(query) - 1)
    cache.check_invariants()


def test_transformer_hit_rounds_down_to_pages():
    cache = PrefixCache(LLAMA, math.inf)
    cache.insert(np.arange(100, dtype=np.int32), [], 100, LRU())
    query = np.concatenate((np.arange(70, dtype=np.int32), seq(999, 999)))
    assert cache.lookup(query).hit == 70
    assert cache.lookup(query, page_size=32).hit == 64


def test_hit_never_covers_the_whole_input():
    cache = PrefixCache(LLAMA, math.inf)
    cache.insert(np.arange(50, dtype=np.int32), [], 50, LRU())
    assert cache.lookup(np.arange(50, dtype=np.int32)).hit == 49
    assert cache.lookup(np.arange(20, dtype=np.int32)).hit == 19


def test_hybrid_hit_needs_a_checkpoint_at_exactly_the_hit_length():
    cache = PrefixCache(HYBRID, math.inf)
    base = np.arange(100, dtype=np.int32)
    cache.insert(base, [40, 100], 100, LRU())
    # matches 80 tokens, but the only checkpoint within is at 40
    look = cache.lookup(np.concatenate((base[:80], seq(7777))))
    assert (look.matched, look.hit) == (80, 40)
    # a checkpoint exactly at the match end makes the whole match reusable
    look = cache.lookup(np.concatenate((base, seq(7777))))
    assert look.hit == 100
    # a prefix shorter than the first checkpoint gets nothing
    assert cache.lookup(np.concatenate((base[:30], seq(7777)))).hit == 0


def test_hybrid_kv_past_the_last_checkpoint_is_not_admitted():
    cache = PrefixCache(HYBRID, math.inf)
    res = cache.insert(np.arange(100, dtype=np.int32), [64], 100, LRU())
    assert res.admitted_end == 64
    assert cache.kv_bytes == 64 * HYBRID.kv_bytes_per_token
    assert cache.ssm_bytes == HYBRID.ssm_state_bytes


def test_split_adds_checkpoint_bytes_only():
    cache = PrefixCache(HYBRID, math.inf)
    cache.insert(np.arange(100, dtype=np.int32), [100], 100, LRU())
    before = cache.kv_bytes
    cache.insert(np.arange(100, dtype=np.int32), [50], 100, LRU())
    assert cache.kv_bytes == before
    assert cache.ssm_bytes == 2 * HYBRID.ssm_state_bytes
    assert sorted((n.start, n.end, n.ckpt) for n in cache.nodes()) == [
        (0, 50, True),
        (50, 100, True),
    ]
    cache.check_invariants()


def test_flop_aware_merge_moves_kv_into_the_child():
    per_ckpt = HYBRID.ssm_state_bytes
    cache = PrefixCache(HYBRID, math.inf)
    cache.insert(np.arange(100, dtype=np.int32), [50, 100], 100, LRU())
    cache.capacity = cache.used_bytes  # full
    freed, count = cache.evict(cache.used_bytes - per_ckpt * 1.5, FlopAware(alpha=0.0))
    # the older (inner, 0..50) node goes first by recency tie-break -> merged, KV kept
    assert count == 1 and freed == per_ckpt
    assert [(n.start, n.end, n.ckpt) for n in cache.nodes()] == [(0, 100, True)]
    cache.check_invariants()


def test_pinned_nodes_are_never_evicted():
    cache = PrefixCache(LLAMA, 200 * LLAMA.kv_bytes_per_token)
    a = np.arange(100, dtype=np.int32)
    cache.insert(a, [], 100, LRU())
    look = cache.lookup(np.concatenate((a, seq(5))))
    with cache.pinned(look.hit_node):
        res = cache.insert(np.arange(1000, 1200, dtype=np.int32), [], 200, LRU())
        assert res.truncated and res.admitted_end == 100  # only the free half fits
        assert cache.lookup(np.concatenate((a, seq(5)))).hit == 100
    cache.check_invariants()
    res = cache.insert(np.arange(2000, 2200, dtype=np.int32), [], 200, LRU())
    assert not res.truncated and cache.lookup(np.concatenate((a, seq(5)))).hit == 0


@pytest.mark.parametrize("spec", [LLAMA, HYBRID], ids=["transformer", "hybrid"])
def test_an_admission_may_evict_the_unmatched_tail_of_the_edge_it_branches_in(spec):
    """A cache full of one 100-token sequence; a new one shares its first 60 tokens and goes
    on for 60 more. Only the shared 60 are on the new request's path: the other 40 of that
    edge go to make room (SGLang splits the edge at the match), so the whole new sequence is
    admitted. Pinning the whole edge truncated it to 60 + what was free."""
    unit = spec.kv_bytes_per_token
    cache = PrefixCache(spec, 120 * unit + 3 * spec.ssm_state_bytes)
    old = np.arange(100, dtype=np.int32)
    cache.insert(old, [100], 100, LRU())
    new = np.concatenate((old[:60], np.arange(1000, 1060, dtype=np.int32)))
    res = cache.insert(new, [60, 120], 120, LRU())
    assert not res.truncated and res.admitted_end == 120
    assert res.evicted_nodes == 1 and res.evicted_bytes == 40 * unit + spec.ssm_state_bytes
    assert sorted((n.start, n.end) for n in cache.nodes()) == [(0, 60), (60, 120)]
    cache.check_invariants()


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        PrefixCache(LLAMA, 0)


class CacheMachine(RuleBasedStateMachine):
    """Random insert / lookup / pin / unpin / evict sequences keep every invariant."""

    def __init__(self):
        super().__init__()
        self.model = HYBRID
        self.cache = PrefixCache(self.model, 40 * self.model.ssm_state_bytes)
        self.pinned: list = []
        self.tick = 0

    def _tick(self):
        self.tick += 1
        self.cache.now = float(self.tick)

    @rule(
        s=st.lists(st.integers(0, 2), min_size=2, max_size=40),
        every=st.integers(1, 8),
        alpha=st.sampled_from([0.0, 1.0, 5.0]),
        lru=st.booleans(),
    )
    def insert(self, s, every, alpha, lru):
        self._tick()
        arr = np.asarray(s, dtype=np.int32)
        ckpts = list(range(every, len(arr) + 1, every))
        chooser = LRU() if lru else FlopAware(alpha=alpha)
        pinned_before = [(n, n.start, n.end) for n in self.pinned]
        self.cache.insert(arr, ckpts, len(arr), chooser)
        for node, _, _ in pinned_before:
            assert self.cache.alive[node.slot] and self.cache.slot_nodes()[node.slot] is node

    @rule(s=st.lists(st.integers(0, 2), min_size=2, max_size=40))
    def lookup_and_pin(self, s):
        self._tick()
        look = self.cache.lookup(np.asarray(s, dtype=np.int32))
        if look.hit_node is not None:
            self.cache.pin(look.hit_node)
            self.pinned.append(look.hit_node)

    @precondition(lambda self: self.pinned)
    @rule(i=st.integers(0, 100))
    def unpin(self, i):
        node = self.pinned.pop(i % len(self.pinned))
        self.cache.unpin(node)

    @rule(frac=st.floats(0.0, 1.0), lru=st.booleans())
    def evict(self, frac, lru):
        chooser = LRU() if lru else FlopAware(alpha=1.0)
        self.cache.evict(frac * self.cache.capacity, chooser)

    @invariant()
    def consistent(self):
        self.cache.check_invariants()
        assert self.cache.used_bytes <= self.cache.capacity
        for node in self.pinned:
            assert self.cache.slot_nodes()[node.slot] is node


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _block_chain(cache: PrefixCache, blocks: int, block: int = 4, first: int = 0) -> np.ndarray:
    """Admit one sequence checkpointed every ``block`` tokens (a fine-grained chain)."""
    tokens = np.arange(first, first + blocks * block, dtype=np.int32)
    cache.insert(tokens, list(range(block, blocks * block + 1, block)), len(tokens), LRU())
    return tokens


def test_chain_eviction_stops_once_enough_is_freed():
    per_block = 4 * HYBRID.kv_bytes_per_token + HYBRID.ssm_state_bytes
    cache = PrefixCache(HYBRID, 40 * per_block)
    tokens = _block_chain(cache, 30)
    assert sum(1 for _ in cache.nodes()) == 30
    freed, count = cache.evict(cache.free_bytes + 3.5 * per_block, LRU())
    # the deepest 4 blocks go (3.5 blocks needed beyond what is free), tail first
    assert (count, freed) == (4, 4 * per_block)
    assert cache.lookup(tokens).hit == 26 * 4
    cache.check_invariants()


def test_chain_eviction_stops_at_a_pinned_node_and_at_a_fresher_leaf():
    per_block = 4 * HYBRID.kv_bytes_per_token + HYBRID.ssm_state_bytes
    cache = PrefixCache(HYBRID, 100 * per_block)
    cache.now = 1.0
    old = _block_chain(cache, 20)
    cache.now = 2.0
    new = _block_chain(cache, 10, first=1000)
    cache.pin(cache.lookup(old[: 8 * 4 + 1]).hit_node)  # blocks 1..8 of the old chain
    _freed, count = cache.evict(math.inf, LRU())
    assert count == 12 + 10  # the old chain down to the pin first, then the newer chain
    assert cache.lookup(old).hit == 8 * 4 and cache.lookup(new).hit == 0
    cache.check_invariants()


def test_chain_eviction_stops_at_a_pin_deep_in_a_long_chain():
    """A chain longer than the node-by-node pin check (its pins read in one call)."""
    per_block = 4 * HYBRID.kv_bytes_per_token + HYBRID.ssm_state_bytes
    cache = PrefixCache(HYBRID, 100 * per_block)
    tokens = _block_chain(cache, 80)
    cache.pin(cache.lookup(tokens[: 50 * 4 + 1]).hit_node)  # blocks 1..50
    _freed, count = cache.evict(math.inf, LRU())
    assert count == 30
    assert cache.lookup(tokens).hit == 50 * 4
    cache.check_invariants()


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(0, 5),
    lengths=st.one_of(
        st.lists(st.integers(1, 6), min_size=1, max_size=12),
        st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6), st.integers(0, 9)).map(
            lambda t: [t[0], *[t[1]] * t[3], t[2]]
        ),
    ),
)
def test_chain_edges_are_the_slices_of_the_sequence(start, lengths):
    """The views a bulk append hangs its nodes on equal slicing the sequence at the stops,
    whether the inner edges are equally long (one 2-D view) or not."""
    from simlab.cache.tree import _edge_views

    stops = np.cumsum([start, *lengths]).tolist()[1:]
    seq = np.arange(stops[-1] + 3, dtype=np.int32) * 7
    edges = _edge_views(seq, stops, np.asarray(lengths, dtype=np.int64))
    bounds = [start, *stops]
    expected = [seq[a:b] for a, b in itertools.pairwise(bounds)]
    assert len(edges) == len(expected)
    for got, want in zip(edges, expected, strict=True):
        assert got.dtype == want.dtype and got.tolist() == want.tolist()


@settings(max_examples=200, deadline=None)
@given(
    scores=st.lists(st.sampled_from([-math.inf, 0.0, 1.0, 2.0, 3.5, math.inf]), max_size=300),
    pushes=st.lists(st.sampled_from([-1.0, 0.0, 1.0, 2.0, 3.5, 9.0]), max_size=40),
    first=st.sampled_from([1, 2, 32]),
)
def test_frontier_pops_in_the_order_of_one_full_heap(scores, pushes, first):
    """The lazily filled frontier of an eviction call pops exactly what one heap over every
    candidate pops, pushes interleaved, ties (many) broken by nid."""
    import heapq

    from simlab.cache.evictor import _Frontier

    n = len(scores)
    nids = np.random.default_rng(n).permutation(n).astype(np.int64)
    slots = np.arange(n, dtype=np.int64)
    frontier = _Frontier(np.array(scores, dtype=np.float64), nids, slots, first)
    full = list(zip(scores, nids.tolist(), slots.tolist(), strict=True))
    heapq.heapify(full)
    extra = iter(pushes)
    for i in range(n + len(pushes) + 1):
        if i % 3 == 1 and (score := next(extra, None)) is not None:
            entry = (score, n + i, n + i)
            frontier.push(entry)
            heapq.heappush(full, entry)
        bound = frontier.lower_bound()
        if full:
            assert bound is not None and bound <= full[0][:2]
        expected = heapq.heappop(full) if full else None
        assert frontier.pop() == expected


@settings(max_examples=150, deadline=None)
@given(
    st.lists(small_seqs, min_size=1, max_size=14),
    st.sets(st.integers(0, 40), max_size=4),
    st.integers(0, 4),
    st.booleans(),
)
def test_depth_first_ties_are_the_first_in_a_full_depth_first_listing(
    stored, pinned, merges, inner
):
    """``ties: dfs`` finds the victim from the candidate arrays: it must be the first lowest of
    :func:`simlab.cache.evictor.dfs_candidates` (the reference code's listing, walked whole), and the
    listing's last candidate (``miscounts_freed_bytes``) must be the one found walking back."""
    from simlab.cache import evictor

    cache = PrefixCache(LLAMA, math.inf)
    for i, s in enumerate(stored):
        cache.now = float(i // 4)  # few distinct access times: many ties
        cache.insert(s, [], len(s), LRU())
    nodes = list(cache.nodes())
    for k in sorted(pinned):
        if k < len(nodes):
            cache.pin(nodes[k])
    policy = FlopAware(alpha=0.0, ties="dfs")
    for _ in range(merges):  # merges and drops reorder nothing else
        if (victim := cache.next_victim(policy)) is not None:
            cache.evict_node(victim)
    policy = FlopAware(alpha=0.0, ties="dfs", evicts_inner_nodes=inner)
    order = evictor.dfs_candidates(cache, inner)
    assert sorted(order, key=evictor._dfs_position) == order
    if not order:
        assert cache.next_victim(policy) is None
        return
    scores = policy.scores(cache, np.array([n.slot for n in order], dtype=np.int64))
    assert cache.next_victim(policy) is order[int(np.argmin(scores))]
    assert evictor._last_dfs_candidate(cache, inner) is order[-1]
    cache.check_invariants()


@given(
    ckpts=st.one_of(
        st.lists(st.integers(-3, 60), max_size=12),
        st.builds(
            lambda a, n, k: list(range(a, a + n * k, k)),
            st.integers(-1, 5),
            st.integers(0, 12),
            st.integers(1, 6),
        ),
    ),
    end=st.integers(0, 60),
    matched=st.integers(0, 60),
    branch=st.booleans(),
)
def test_the_checkpoints_to_take_are_those_in_range_sorted_and_distinct(
    ckpts, end, matched, branch
):
    """``_wanted`` (its shortcut for checkpoints already sorted, distinct and in range
    included) is its definition: ``ckpts`` in ``1..end`` and a branch's match, sorted, once
    each."""
    extra = {matched} if branch and matched > 0 else set()
    expected = sorted({c for c in ckpts if 0 < c <= end} | extra)
    assert insertion._wanted(ckpts, end, matched, branch) == expected
