"""FIFO eviction: leaves only; the leaf whose tokens entered the cache first goes first.

Semantics. A node's score is the clock (``cache.now``) at which its tokens were admitted, its
"birth"; the lowest (oldest) leaf is evicted first, ties by the cache's rule (oldest node id).
A hit refreshes nothing (``on_hit`` is the base class's no-op): unlike LRU, a prefix that is
reused again and again still goes once everything admitted after it is younger. FIFO is the
baseline that shows what recency (LRU's refresh on a hit) is worth.

Births are recorded from ``on_admit(cache, nodes)``, which the cache calls with the nodes an
insertion created: the new chain of an admission (parent before child) and the upper half of a
split edge (a new node whose only child is the old node it was cut from). ``nodes`` is walked
in reverse (children first; a child starts where its parent ends) and each node is born at
``min(cache.now, born of its tracked children)``, so

* a fresh chain is born now (its nodes have no tracked children, or children born now);
* the upper half of a split inherits the birth of the lower half: splitting an edge moves no
  token in or out of the cache, so it must not make the tokens younger (nor older).

Invariants.

* Per-slot state (``born``, ``nid``) is valid only where ``nid[slot] == cache.nids[slot]``:
  the cache reuses a slot after its node is evicted, and a stale birth never leaks to the
  node that takes the slot over (the same scheme as ``simlab.cache.scoring.HitCounts``). The arrays
  grow on demand to ``cache.nids.shape[0]``.
* A parent is never born after any of its children (a child is created after its parent,
  a split's upper half is born with the oldest of its children), so when the oldest leaf
  goes and its parent becomes a leaf, the parent scores no higher than any leaf left and goes
  next (up to ties): a chain leaves from its tail up, as a whole.
* Scores are static (``scores_depend_on_candidates=False``): a birth is set once, when the
  node is created, and never changes when other nodes are hit or evicted.
* A slot ``on_admit`` never reported (which the cache does not produce) scores as born at 0,
  i.e. first to go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache.contract import CacheView, EvictionPolicy

if TYPE_CHECKING:
    from simlab.cache.prefix import Node


def _deepest_first(node: Node) -> int:
    return -node.start


@dataclass
class FIFO(EvictionPolicy):
    """Evict the leaf admitted longest ago; hits do not refresh it."""

    order = "fifo"
    evicts_inner_nodes: bool = False
    scores_depend_on_candidates: bool = False
    born: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=np.float64), init=False, repr=False, compare=False
    )
    nid: np.ndarray = field(
        default_factory=lambda: np.full(0, -1, dtype=np.int64),
        init=False,
        repr=False,
        compare=False,
    )

    def _grow(self, cache: CacheView) -> None:
        n = cache.nids.shape[0]
        if self.nid.shape[0] < n:
            grow = n - self.nid.shape[0]
            self.nid = np.concatenate((self.nid, np.full(grow, -1, dtype=np.int64)))
            self.born = np.concatenate((self.born, np.zeros(grow, dtype=np.float64)))

    def _tracked(self, node: Node) -> bool:
        return node.slot < self.nid.shape[0] and self.nid[node.slot] == node.nid

    def on_admit(self, cache: CacheView, nodes: Sequence[Node]) -> None:
        self._grow(cache)
        now = float(cache.now)
        # Children before parents (reversed: the cache lists a parent before its child; the
        # stable sort by start keeps that order and only guards against any other order).
        for node in sorted(reversed(nodes), key=_deepest_first):
            born = now
            for child in node.children.values():
                if self._tracked(child):
                    born = min(born, float(self.born[child.slot]))
            self.born[node.slot] = born
            self.nid[node.slot] = node.nid

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        self._grow(cache)
        valid = self.nid[candidates] == cache.nids[candidates]
        return np.where(valid, self.born[candidates], 0.0)
