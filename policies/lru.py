"""LRU eviction with SGLang semantics: leaves only; a hit refreshes every node on the matched path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from simlab.cache.contract import CacheView, Switches
from simlab.cache.scoring import LRU_TIE_ORDERS, Recency

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup

_REFERENCE = {"refreshes_insert_path": True, "ties": "heap"}  # the reference's SGLang+


@dataclass
class LRU(Recency):
    """Evict the least recently used leaf; its parent may become a leaf and go next."""

    order = "recency"
    reference_switches: ClassVar[Switches] = {
        "reference": _REFERENCE,
        "reference_fixed": _REFERENCE,
    }

    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        cache.touch(lookup.path)


__all__ = ["LRU", "LRU_TIE_ORDERS"]
