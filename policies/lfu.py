"""LFU eviction: leaves only; the fewest hits go first, ties by least recent use.

A node's hit count starts at 1 when it is admitted and grows by one for every request that reuses
it (the nodes on the matched path that the hit covers). :class:`simlab.cache.scoring.HitCounts` keeps the counts in
slot-indexed arrays validated by node id, so the cache's slot reuse never leaks a count to a new
node; an upper node created by a split inherits the count of the node it was cut from (every hit
on that node covered its tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache.contract import CacheView, EvictionPolicy
from simlab.cache.scoring import HitCounts, reused_nodes

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup


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


__all__ = ["LFU", "HitCounts", "reused_nodes"]
