"""The production engines' own eviction orders: SGLang 0.5.23's LRU over its radix tree and vLLM
0.33.0's free queue (their admissions, and each rule's source, are in :mod:`policies.production`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simlab.cache.contract import CacheView
from simlab.cache.scoring import Recency

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup


@dataclass
class RadixLRU(Recency):
    """SGLang's LRU: a match refreshes every node it passes and the one it stops inside; so
    does an insertion's walk (``refreshes_insert_path``). On a hybrid a match refreshes the
    path up to its hit only (``_match_post_processor`` stamps ``best_match_node``, the deepest
    node holding a state, and its ancestors) and both halves of the node it splits
    (``_split_node`` stamps them; :attr:`SGLang.splits_at_match`): whole nodes matched past the
    last state stay as old as they were. Each access is stamped from one global counter, so
    an insertion is newer than every match before it (``ticks_on_insert``)."""

    order = "sglang_recency"
    refreshes_insert_path: bool = True
    ticks_on_insert: bool = True

    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        if cache.hybrid:
            touched = [node for node in lookup.path if node.end <= lookup.hit]
            if lookup.split is not None:  # both halves of the split: the upper is new
                touched.append(lookup.split)
            cache.touch(touched)
            return
        partial = lookup.partial
        cache.touch(lookup.path if partial is None else [*lookup.path, partial])

    on_match = on_hit  # SGLang's match refreshes the same nodes whether it admits or not


@dataclass
class BlockLRU(Recency):
    """vLLM's free queue: a hit takes its blocks out of the queue and the finished request
    returns every block it used (``refreshes_insert_path``), tail first."""

    order = "free_queue"
    refreshes_insert_path: bool = True

    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        node = lookup.hit_node
        touched = []
        while node is not None and node is not cache.root:
            touched.append(node)
            node = node.parent
        cache.touch(touched)
