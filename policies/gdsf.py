"""GDSF eviction (greedy-dual-size-frequency, Cherkasova 1998) on the prefix tree: leaves only.

Each node carries ``H = L + frequency x cost / size`` with ``cost`` the FLOPs that reusing the
node saves beyond its parent (``saved_flops``), ``size`` the bytes it holds (``node_bytes``) and
``frequency`` its hit count (:class:`simlab.cache.scoring.HitCounts`). ``L``, the inflation value, starts
at 0 and becomes the ``H`` of each evicted node, so nodes not used for a while age relative to
newly admitted or re-used ones. ``H`` is re-based on ``L`` when a node is admitted or hit; the
lowest ``H`` is evicted first (ties: oldest node).

Mapping onto the scoring protocol: the policy keeps, per slot (validated by node id), the ``L``
at the node's last access and the score it last returned. The cache does not say which node it
evicted; the next call (``on_hit`` or ``scores``) sees which scored nodes are gone and raises
``L`` to the largest of their scores. Evictions happen in increasing ``H`` and are noticed before
any node is admitted or re-used, so this is exact GDSF: within one burst the order does not
depend on ``L``, and a node admitted after a burst is based on the ``L`` that burst left. A node's
``cost / size`` is read when it is scored, so a split (which changes both) is taken into account.
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
class GDSF(EvictionPolicy):
    evicts_inner_nodes: bool = False
    scores_depend_on_candidates: bool = False
    inflation: float = field(default=0.0, init=False, compare=False)
    counts: HitCounts = field(default_factory=HitCounts, init=False, repr=False, compare=False)
    _base: np.ndarray = field(
        default_factory=lambda: np.zeros(0), init=False, repr=False, compare=False
    )
    _last: np.ndarray = field(
        default_factory=lambda: np.zeros(0), init=False, repr=False, compare=False
    )

    def _sync(self, cache: CacheView) -> None:
        n = cache.nids.shape[0]
        if self._base.shape[0] < n:
            grow = n - self._base.shape[0]
            self._base = np.concatenate((self._base, np.zeros(grow)))
            self._last = np.concatenate((self._last, np.full(grow, -np.inf)))
        gone, new = self.counts.sync(cache)
        if gone.size:
            self.inflation = max(self.inflation, float(self._last[gone].max()))
            self._last[gone] = -np.inf
        self._base[new] = self.inflation

    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        self._sync(cache)
        cache.touch(lookup.path)
        for node in reused_nodes(lookup):
            self.counts.count[node.slot] += 1.0
            self._base[node.slot] = self.inflation

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        self._sync(cache)
        value = self.counts.count[candidates] * (
            cache.saved_flops[candidates] / cache.node_bytes[candidates]
        )
        h = self._base[candidates] + value
        self._last[candidates] = h
        return h
