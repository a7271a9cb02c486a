"""BatchLLM's planner (:mod:`simlab.engines.batchllm`) and the batch trie (:mod:`traces.trie`): the paper's
saving ratios from its own workload definitions. Schedules executed through a cache are tested on
the offline engine in tests/test_offline.py."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from simlab.engines.batchllm import (
    BatchLLM,
    RandomOrder,
    ThresholdSort,
    maximize_reuse,
    mutable_tree,
    plan_batch,
    saving_ratio,
    threshold_groups,
)
from traces.synthetic import microbenchmark_batch, table3_batch
from traces.trie import BatchTrie, common_prefix


def exact(groups) -> Fraction:
    return 1 - Fraction(
        sum(g.processed_tokens for g in groups), sum(g.logical_tokens for g in groups)
    )


@pytest.fixture(scope="module", params=[(490, 11, "48.6"), (400, 101, "39.7")], ids=["A", "B"])
def table3(request):
    group_prefix, sub_prefix, paper = request.param
    batch = table3_batch(group_prefix, sub_prefix)
    return group_prefix, paper, batch, BatchTrie(batch)


def test_table3_batchllm_saving_ratio(table3):
    """50 groups of 128 sharing the group prefix; the 11/101-token sub-prefix is not worth a fork
    (gain (2 - 1) x sub_prefix < penalty group_prefix), so Eq. 1 gives exactly
    1 - 50 (P + 128 (1000 - P)) / 6,400,000: 48.6% (A) and 39.7% (B)."""
    group_prefix, paper, batch, trie = table3
    groups = plan_batch(batch, trie)
    assert len(groups) == 50 and {len(g.members) for g in groups} == {128}
    assert {g.prefix_len for g in groups} == {group_prefix}
    assert exact(groups) == 1 - Fraction(50 * (group_prefix + 128 * (1000 - group_prefix)), 6400000)
    assert f"{100 * saving_ratio(groups):.1f}" == paper
    sub_prefix = 501 - group_prefix
    two_level = Fraction(127 * group_prefix + 64 * sub_prefix, 128000)
    assert 1 - Fraction(trie.multi_level_processed(), 6400000) == two_level > exact(groups)


def test_schedulers_plan_a_partition_of_the_batch():
    batch = microbenchmark_batch(100, 20, 4, n_prefixes=3)
    for scheduler in (BatchLLM(), ThresholdSort(), RandomOrder(seed=3)):
        groups = scheduler.plan(batch)
        assert sorted(m for g in groups for m in g.members) == list(range(len(batch)))
    assert RandomOrder(seed=3).plan(batch) == RandomOrder(seed=3).plan(batch)
    assert saving_ratio(RandomOrder().plan(batch)) == 0.0


def test_table3_threshold_heuristic_saving_ratio(table3):
    """The 50% heuristic only pairs the two prompts of a subcategory (501/1000 > 50%, but
    group_prefix/1000 < 50%): 3200 groups of 2, 1 - 3200 x 1499 / 6.4M = 25.05% in A and B."""
    _, _, batch, trie = table3
    groups = threshold_groups(batch, 0.5, trie)
    assert len(groups) == 3200 and {len(g.members) for g in groups} == {2}
    assert exact(groups) == 1 - Fraction(3200 * 1499, 6400000)
    assert round(100 * saving_ratio(groups)) == 25


def test_table3_plans_partition_the_batch_in_r_group_order(table3):
    _, _, batch, trie = table3
    for groups in (plan_batch(batch, trie), threshold_groups(batch, 0.5, trie)):
        members = sorted(m for g in groups for m in g.members)
        assert members == list(range(len(batch)))
        sizes = [g.processed_tokens for g in groups]
        assert sizes == sorted(sizes)  # largest R_group = 1 / (L_prefix + sum L_distinct) first
        for g in groups[:3]:
            head = batch[g.members[0]][: g.prefix_len]
            assert all(np.array_equal(batch[m][: g.prefix_len], head) for m in g.members)


@pytest.mark.parametrize(
    ("prefix_len", "paper"), [(2000, "85.2"), (16000, "92.6")], ids=["2000/200", "16000/200"]
)
def test_microbenchmark_upper_bounds(prefix_len, paper):
    """Sharing degree 16, distinct 200: 1 - (P + 16 x 200) / (16 (P + 200))."""
    batch = microbenchmark_batch(prefix_len, 200, 16, n_prefixes=4)
    groups = plan_batch(batch)
    assert len(groups) == 4
    assert exact(groups) == 1 - Fraction(prefix_len + 16 * 200, 16 * (prefix_len + 200))
    assert f"{100 * saving_ratio(groups):.1f}" == paper


def _seq(*parts):
    return np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])


def test_maximize_reuse_forks_when_the_gain_beats_the_penalty():
    """The paper's Fig. 4 situation: a 1-token first-level node 'b' shared by 5 prompts, two of
    which share 8 more tokens: forking 'b' into 'b'+8 gains (2 - 1) x 8 > 1 token."""
    b, x = [7], list(range(100, 108))
    prompts = [
        _seq([1], [50, 51]),
        _seq(b, x, [60]),
        _seq(b, x, [61]),
        _seq(b, [70, 71]),
        _seq(b, [80, 81]),
        _seq(b, [90, 91]),
    ]
    groups = plan_batch(prompts)
    by_members = {tuple(sorted(g.members)): g.prefix_len for g in groups}
    assert by_members[(1, 2)] == 9  # 'b' + the 8 shared tokens, now a first-level prefix
    assert by_members[(3, 4, 5)] == 1
    assert saving_ratio(groups) > saving_ratio(threshold_groups(prompts, 0.0))


def test_maximize_reuse_keeps_a_prefix_when_the_fork_costs_more():
    long_prefix = list(range(1000, 1100))
    prompts = [_seq(long_prefix, [s, s + 1], [t]) for s in (5, 9) for t in (1, 2)]
    groups = plan_batch(prompts)
    assert [(g.prefix_len, len(g.members)) for g in groups] == [(100, 4)]


def test_maximize_reuse_never_loses_leaves():
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 3, int(rng.integers(1, 12)), dtype=np.int32) for _ in range(300)]
    root = mutable_tree(BatchTrie(prompts))
    maximize_reuse(root)
    assert sorted(root.members()) == list(range(300))
    assert sorted(m for g in plan_batch(prompts) for m in g.members) == list(range(300))


def test_batch_trie_ranges_match_brute_force():
    """Every node's sorted-order range is exactly the sequences containing its path; the
    'passing' range drops those that end there."""
    rng = np.random.default_rng(3)
    base = [rng.integers(0, 4, 12, dtype=np.int32) for _ in range(5)]
    seqs = [b[: int(rng.integers(1, 13))].copy() for b in base for _ in range(8)]
    seqs += [seqs[0].copy(), seqs[3].copy()]  # duplicates
    trie = BatchTrie(seqs)
    for x in range(1, len(trie)):
        path = seqs[trie.order[trie.lo[x]]][: trie.end[x]]
        inside = {
            p
            for p, s in enumerate(seqs)
            if len(s) >= trie.end[x] and common_prefix(s, path) == trie.end[x]
        }
        assert set(trie.order[trie.lo[x] : trie.hi[x]].tolist()) == inside
        lo, hi = trie.passing(x, trie.end[x])
        assert set(trie.order[lo:hi].tolist()) == {p for p in inside if len(seqs[p]) > trie.end[x]}
        assert trie.walk(0, 0, path) == (x, trie.end[x])
    assert sum(trie.n_term) == len(seqs)
    n = len(seqs)
    assert [trie.next_in(0, n, t) for t in range(n + 1)] == [*range(n), math.inf]
    x = max(range(1, len(trie)), key=lambda x: trie.hi[x] - trie.lo[x])
    members = sorted(trie.order[trie.lo[x] : trie.hi[x]].tolist())
    assert trie.next_in(trie.lo[x], trie.hi[x], members[1]) == members[1]
    assert trie.next_in(trie.lo[x], trie.hi[x], members[-1] + 1) == math.inf
