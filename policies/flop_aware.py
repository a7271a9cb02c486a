"""Marconi's FLOP-aware eviction.

Candidates are unpinned nodes with at most one child; evicting a one-child node frees its SSM
checkpoint and merges its KV into the child. A hit refreshes only the deepest accessed node.
Utility ``S(n) = recency(n) + alpha * flop_efficiency(n)``, both min-max normalised over the
candidates; the lowest utility is evicted first (ties: oldest node).

* ``recency(n) = 1 / (1 + now - last_access(n))`` in engine time units (the reference code's
  inverse age, shifted by one tick so that a node touched now is finite);
* ``flop_efficiency(n)`` = FLOPs that reusing ``n`` saves beyond its parent (prefill of the
  node's own tokens after the parent's prefix, all layer types) / bytes the node holds (its
  edge's KV plus its checkpoint). Unlike the reference code, the bytes are the node's own and the
  MLP term of the parent is not subtracted as attention FLOPs.

``alpha = 0`` ranks exactly like recency (LRU over the extended candidate set).

``alpha`` is :class:`policies.base.Tunable`: with ``policy.tuning.enabled`` the paper's
retrospective tuning (``simlab.tuning``) starts it at 0 and sets it through :meth:`set_alpha`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from policies.base import CacheView, EvictionPolicy, min_max

if TYPE_CHECKING:
    from simlab.nodes import Lookup


def checked_alpha(alpha: float) -> float:
    """``alpha`` if it is a finite number >= 0 (ValueError naming ``policy.alpha`` otherwise)."""
    if not (isinstance(alpha, int | float) and alpha >= 0.0 and math.isfinite(alpha)):
        raise ValueError(f"policy.alpha must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


@dataclass
class FlopAware(EvictionPolicy):
    alpha: float = 1.0
    evicts_inner_nodes: bool = True
    scores_depend_on_candidates: bool = True

    def __post_init__(self) -> None:
        self.set_alpha(self.alpha)

    def set_alpha(self, alpha: float) -> None:
        self.alpha = checked_alpha(alpha)

    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        if lookup.hit_node is not None:
            cache.touch([lookup.hit_node])

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        """Marconi's utility score of each candidate slot (higher = keep)."""
        recency = 1.0 / (1.0 + cache.now - cache.last_access[candidates])
        if self.alpha == 0.0:
            return recency
        efficiency = cache.saved_flops[candidates] / cache.node_bytes[candidates]
        return min_max(recency) + self.alpha * min_max(efficiency)
