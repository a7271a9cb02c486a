"""Building blocks the plug-in policies share (``policies/*`` import them from here, never
from each other): hit counts per node, the nodes a hit reuses, a checked weight, the alignment
of a prefill checkpoint and the recency eviction every LRU variant is. The engines' rules for a
hybrid's recurrent state are :mod:`simlab.cache.engine_rules`.

Like :mod:`simlab.cache.contract`, this module imports nothing from ``simlab`` at run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache.contract import CacheView, EvictionPolicy

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup, Node

#: Where a prefill checkpoint off a chunk boundary is taken (:func:`aligned`).
ALIGNMENTS = ("exact", "round_down")
#: Tie orders of a recency eviction (:class:`Recency`).
LRU_TIE_ORDERS = ("oldest", "heap")


def aligned(pos: int, alignment: str, chunk_size: int) -> int:
    """Position where a prefill checkpoint for ``pos`` is actually taken (0 = none)."""
    if alignment == "exact":
        return pos
    return (pos // chunk_size) * chunk_size


def checked_alpha(alpha: float) -> float:
    """``alpha`` if it is a finite number >= 0 (ValueError naming ``policy.alpha`` otherwise)."""
    if not (isinstance(alpha, int | float) and alpha >= 0.0 and math.isfinite(alpha)):
        raise ValueError(f"policy.alpha must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


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
class Recency(EvictionPolicy):
    """The least recently used leaf goes first; its parent may become a leaf and go next.
    A plug-in built on it says what a hit refreshes (``on_hit``) and declares its ``order``
    (:data:`simlab.cache.contract.RECENCY_ORDERS`)."""

    evicts_inner_nodes: bool = False
    scores_depend_on_candidates: bool = False
    #: true: the insertion's walk refreshes the nodes it passes too (SGLang's ``_insert_helper``,
    #: and the Marconi reference code's SGLang+, ``policy.compat=reference``)
    refreshes_insert_path: bool = False
    #: ``oldest`` or ``heap`` (the reference's SGLang+, ``policy.compat=reference``)
    ties: str = "oldest"

    def __post_init__(self) -> None:
        if self.ties not in LRU_TIE_ORDERS:
            raise ValueError(f"eviction.ties must be one of {LRU_TIE_ORDERS}, got {self.ties!r}")

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        return cache.last_access[candidates]


def min_max(values: np.ndarray) -> np.ndarray:
    """Scale to [0, 1] over the candidates; all ones when they are all equal (reference code)."""
    lo, hi = np.minimum.reduce(values), np.maximum.reduce(values)  # .min(), without its wrapper
    if hi == lo:
        return np.ones_like(values)
    return (values - lo) / (hi - lo)


__all__ = [
    "ALIGNMENTS",
    "LRU_TIE_ORDERS",
    "HitCounts",
    "Recency",
    "aligned",
    "checked_alpha",
    "min_max",
    "reused_nodes",
]
