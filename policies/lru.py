"""LRU eviction with SGLang semantics: leaves only; a hit refreshes every node on the matched path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache.contract import CacheView, EvictionPolicy

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup


LRU_TIE_ORDERS = ("oldest", "heap")


@dataclass
class LRU(EvictionPolicy):
    """Evict the least recently used leaf; its parent may become a leaf and go next."""

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

    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        cache.touch(lookup.path)

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        return cache.last_access[candidates]
