"""BatchLLM's explicit global prefix sharing for offline batches (sections 3.2-3.3): the planner.

For a batch known ahead, BatchLLM builds the prefix tree of every prompt, enlarges the first-level
prefixes with a dynamic programme (``MaximizeReuse``, its Algorithm 1), turns each first-level
prefix into a *prefix-sharing group*, schedules groups whole, in increasing order of
``L_prefix + sum L_distinct`` (largest ``R_group = 1 / (L_prefix + sum L_distinct)`` first, its
Eq. 3) and keeps a group's prefix cached until its last member is done.

This module only *plans*; the offline engine (:mod:`simlab.engines.offline`, ``engine=offline``) executes
a plan on the timed engine. It holds

* :class:`Group`, :func:`make_group`, :func:`order_groups` and :func:`saving_ratio`
  (``1 - N_processed / N_logical``, its Eq. 1, counting only the shared first-level prefixes, as
  the paper does);
* :func:`mutable_tree` and :func:`maximize_reuse`: Algorithm 1 on a mutable copy of the batch's
  :class:`~traces.trie.BatchTrie`;
* :func:`plan_batch`: BatchLLM's groups; :func:`threshold_groups`: the sorting heuristic the paper
  compares against (lexicographic sort, greedy scan, a group only while the common prefix exceeds
  50% of its shortest member);
* the offline schedulers selected by ``configs/offline/*.yaml``, each a ``name`` and
  ``plan(requests) -> list[Group]``: :class:`BatchLLM`, :class:`ThresholdSort` and
  :class:`RandomOrder` (no explicit sharing: the batch in a seeded random order, the implicit
  prefix cache alone decides what is reused).

Invariants: a plan's groups partition the batch (every position exactly once); within a group
every member starts with the group's prefix; a singleton group has ``prefix_len == 0``; groups
are in increasing ``processed_tokens`` order (except :class:`RandomOrder`'s);
``0 <= saving_ratio < 1``. Planning never touches a cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from traces.trie import INF, BatchTrie, as_inputs


# --------------------------------------------------------------------------- groups
@dataclass(frozen=True)
class Group:
    """A prefix-sharing group: ``prefix_len`` tokens shared by ``members`` (batch positions,
    in scheduled order). A singleton has ``prefix_len == 0`` (nothing shared)."""

    prefix_len: int
    members: tuple[int, ...]
    distinct_tokens: int  # sum over members of (input length - prefix_len)

    @property
    def processed_tokens(self) -> int:
        return self.prefix_len + self.distinct_tokens

    @property
    def logical_tokens(self) -> int:
        return self.prefix_len * len(self.members) + self.distinct_tokens

    @property
    def r_group(self) -> float:
        """BatchLLM's Eq. 3 with the decode length normalised to 1."""
        return 1.0 / self.processed_tokens if self.processed_tokens else INF


def make_group(
    prefix_len: int, members: Sequence[int], lengths: np.ndarray, rank: np.ndarray | None = None
) -> Group:
    """A group whose members are ordered shortest input first (Eq. 2 with L_decode = 1); equal
    lengths in ``rank`` order (lexicographic: deeper shared prefixes are processed back to back,
    which is what lets the implicit cache reuse the levels below the group prefix)."""
    ms = sorted(members, key=lambda m: (int(lengths[m]), m if rank is None else int(rank[m])))
    shared = prefix_len if len(ms) > 1 else 0
    distinct = int(sum(int(lengths[m]) - shared for m in ms))
    return Group(prefix_len=shared, members=tuple(ms), distinct_tokens=distinct)


def order_groups(groups: Sequence[Group]) -> list[Group]:
    """Largest ``R_group`` first; ties by the earliest member."""
    return sorted(groups, key=lambda g: (g.processed_tokens, min(g.members)))


def saving_ratio(groups: Sequence[Group]) -> float:
    """``1 - N_processed / N_logical`` (BatchLLM Eq. 1), first-level prefixes shared once."""
    logical = sum(g.logical_tokens for g in groups)
    return 1.0 - sum(g.processed_tokens for g in groups) / logical if logical else 0.0


# --------------------------------------------------------------------------- MaximizeReuse
@dataclass(eq=False)
class TreeNode:
    """Mutable prefix-tree node for the dynamic programme (tokens = edge length)."""

    tokens: int
    children: list[TreeNode] = field(default_factory=list)
    terminals: list[int] = field(default_factory=list)
    leaves: int = 0

    def members(self) -> list[int]:
        out, stack = [], [self]
        while stack:
            node = stack.pop()
            out.extend(node.terminals)
            stack.extend(node.children)
        return out


def mutable_tree(trie: BatchTrie) -> TreeNode:
    """A mutable copy of ``trie`` for :func:`maximize_reuse` (terminals = batch positions)."""
    nodes = [
        TreeNode(
            tokens=trie.end[x] - trie.start[x],
            terminals=[int(p) for p in trie.order[trie.lo[x] : trie.lo[x] + trie.n_term[x]]],
            leaves=trie.hi[x] - trie.lo[x],
        )
        for x in range(len(trie))
    ]
    for x in range(1, len(trie)):
        nodes[trie.parent[x]].children.append(nodes[x])
    return nodes[0]


def _post_order(root: TreeNode) -> list[TreeNode]:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children)
    return out[::-1]


def _fork(parent: TreeNode, child: TreeNode, gchild: TreeNode) -> None:
    """Algorithm 1, line 11: a copy of ``child`` merged with ``gchild`` becomes a child of
    ``parent``; ``child`` is removed when empty and compacted when left with one child."""
    child.children.remove(gchild)
    child.leaves -= gchild.leaves
    parent.children.append(
        TreeNode(child.tokens + gchild.tokens, gchild.children, gchild.terminals, gchild.leaves)
    )
    if not child.terminals and not child.children:
        parent.children.remove(child)
    elif not child.terminals and len(child.children) == 1:
        (only,) = child.children
        child.tokens += only.tokens
        child.children, child.terminals = only.children, only.terminals


def maximize_reuse(root: TreeNode) -> None:
    """BatchLLM's Algorithm 1 over the whole tree, bottom-up (no recursion limit)."""
    for node in _post_order(root):
        for child in list(node.children):
            for gchild in list(child.children):
                if gchild not in child.children:
                    continue  # absorbed by a compaction of ``child``
                if (gchild.leaves - 1) * gchild.tokens > child.tokens:
                    _fork(node, child, gchild)


def plan_batch(requests: Sequence[Any], trie: BatchTrie | None = None) -> list[Group]:
    """BatchLLM's prefix-sharing groups of a batch, in scheduling order."""
    trie = trie or BatchTrie(as_inputs(requests))
    root = mutable_tree(trie)
    maximize_reuse(root)
    rank = trie.rank
    groups = [make_group(0, [m], trie.lengths) for m in root.terminals]
    groups += [make_group(c.tokens, c.members(), trie.lengths, rank) for c in root.children]
    return order_groups(groups)


def threshold_groups(
    requests: Sequence[Any], threshold: float = 0.5, trie: BatchTrie | None = None
) -> list[Group]:
    """The sorting heuristic: lexicographic sort, then a greedy scan that keeps a request in the
    current group while the group's common prefix exceeds ``threshold`` x its shortest member."""
    trie = trie or BatchTrie(as_inputs(requests))
    groups: list[Group] = []
    members: list[int] = []
    common = shortest = 0
    for i, pos in enumerate(trie.order.tolist()):
        length = int(trie.lengths[pos])
        if members:
            new_common = min(common, int(trie.lcp[i]))
            new_shortest = min(shortest, length)
            if new_common > threshold * new_shortest:
                members.append(pos)
                common, shortest = new_common, new_shortest
                continue
            groups.append(make_group(common, members, trie.lengths, trie.rank))
        members, common, shortest = [pos], length, length
    if members:
        groups.append(make_group(common, members, trie.lengths, trie.rank))
    return order_groups(groups)


# --------------------------------------------------------------------------- schedulers
@dataclass
class BatchLLM:
    """Offline scheduler: explicit global prefix groups (Algorithm 1), ordered by R_group."""

    name: str = "batchllm"

    def plan(self, requests: Sequence[Any]) -> list[Group]:
        return plan_batch(requests)


@dataclass
class ThresholdSort:
    """Offline scheduler: the 50%-threshold sorting heuristic (Table 3's "Heuristic CSGroup")."""

    name: str = "threshold_sort"
    threshold: float = 0.5

    def plan(self, requests: Sequence[Any]) -> list[Group]:
        return threshold_groups(requests, self.threshold)


@dataclass
class RandomOrder:
    """Offline baseline: no explicit sharing, the batch in a seeded random order (the implicit
    prefix cache alone decides what is reused)."""

    name: str = "random_order"
    seed: int = 0

    def plan(self, requests: Sequence[Any]) -> list[Group]:
        lengths = np.array([s.shape[0] for s in as_inputs(requests)], dtype=np.int64)
        perm = np.random.default_rng(self.seed).permutation(len(requests))
        return [make_group(0, [int(p)], lengths) for p in perm]
