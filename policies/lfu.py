"""LFU eviction: leaves only; the fewest hits go first, ties by least recent use.

A node's hit count starts at 1 when it is admitted and grows by one for every request that reuses
it (the nodes on the matched path that the hit covers). :class:`HitCounts` keeps the counts in
slot-indexed arrays validated by node id, so the cache's slot reuse never leaks a count to a new
node; an upper node created by a split inherits the count of the node it was cut from (every hit
on that node covered its tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache.contract import CacheView, EvictionPolicy

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup, Node


def reused_nodes(lookup: Lookup) -> list[Node]:
    """Nodes whose tokens the hit reuses (a node is reused if the hit reaches into it)."""
    nodes = [n for n in lookup.path if n.start < lookup.hit]
    if lookup.partial is not None and lookup.partial.start < lookup.hit:
        nodes.append(lookup.partial)
    return nodes


@dataclass
class HitCounts:
    """Per-node hit counts in slot-indexed arrays (a slot's count belongs to ``nid[slot]``).

    A new node starts at ``initial``; with ``inherit`` an upper node cut off by a split starts
    at the counts of its (already counted) children instead, when that is larger.
    """

    initial: float = 1.0
    inherit: bool = True
    nid: np.ndarray = field(
        default_factory=lambda: np.full(0, -1, dtype=np.int64), repr=False, compare=False
    )
    count: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=np.float64), repr=False, compare=False
    )

    def sync(self, cache: CacheView) -> tuple[np.ndarray, np.ndarray]:
        """Forget nodes that are gone, start counting new ones; returns (gone, new) slots."""
        n = cache.nids.shape[0]
        if self.nid.shape[0] < n:
            grow = n - self.nid.shape[0]
            self.nid = np.concatenate((self.nid, np.full(grow, -1, dtype=np.int64)))
            self.count = np.concatenate((self.count, np.zeros(grow)))
        tracked = self.nid[:n] >= 0
        gone = np.flatnonzero(tracked & (~cache.alive | (cache.nids != self.nid[:n])))
        self.nid[gone] = -1
        new = np.flatnonzero(cache.alive & (self.nid[:n] < 0))
        new = new[new != cache.root.slot]
        self.count[new] = self.initial
        for slot in new.tolist() if self.inherit else ():  # few: the last admission's nodes
            self.count[slot] = max(self.initial, self._children_count(cache.node_at(slot)))
        self.nid[new] = cache.nids[new]
        return gone, new

    def _children_count(self, node: Node) -> float:
        """Hits counted on ``node``'s already tracked children (a split's lower half)."""
        children = node.children.values()
        return float(sum(self.count[c.slot] for c in children if self.nid[c.slot] == c.nid))

    def hit(self, cache: CacheView, nodes: list[Node]) -> None:
        self.sync(cache)
        for node in nodes:
            self.count[node.slot] += 1.0


@dataclass
class LFU(EvictionPolicy):
    """Least frequently used leaf first; equal counts: least recently used first."""

    evicts_inner_nodes: bool = False
    scores_depend_on_candidates: bool = False
    counts: HitCounts = field(default_factory=HitCounts, init=False, repr=False, compare=False)

    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        cache.touch(lookup.path)
        self.counts.hit(cache, reused_nodes(lookup))

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        self.counts.sync(cache)
        recency = cache.last_access[candidates] / (cache.now + 1.0)  # in [0, 1): a tie-break
        return self.counts.count[candidates] + recency
