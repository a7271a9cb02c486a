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

Reference-code switches (``policy.compat=reference`` sets them all; :mod:`simlab.run.compat`):

* ``memory: path`` divides by one SSM state plus the KV of the node's *whole path* (prefix
  included), as ``radix_cache_hybrid.py`` (FLOP-efficiency block, line 528) does; ``own`` (the
  default) by the bytes evicting the node frees;
* ``recency: inverse_age`` is the reference's ``1 / (now - last_access)`` (its clock ticks per
  cache operation, so the age is never 0; an age of 0 counts as one tick);
* ``mlp_bug``: the MLP term subtracts the parent's *attention* FLOPs per MLP layer instead of
  its MLP FLOPs (``28 * (mlp(T) - attn(P))``, line 526), which inflates short prefixes and goes
  negative past about 10K tokens;
* ``ties: dfs`` and ``miscounts_freed_bytes`` (:class:`simlab.cache.contract.EvictionPolicy`).

``alpha`` is :class:`simlab.cache.contract.Tunable`: with ``policy.tuning.enabled`` the paper's
retrospective tuning (``simlab.engines.tuning``) starts it at 0 and sets it through :meth:`set_alpha`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from simlab.cache.contract import CacheView, EvictionPolicy, Switches
from simlab.cache.scoring import checked_alpha, min_max

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup
    from simlab.model.spec import ModelSpec


MEMORY_TERMS = ("own", "path")
RECENCY_TERMS = ("shifted", "inverse_age")
TIE_ORDERS = ("oldest", "dfs")
_REFERENCE = {"memory": "path", "recency": "inverse_age", "ties": "dfs"}
_BUGS = ("mlp_bug", "miscounts_freed_bytes")


@dataclass
class FlopAware(EvictionPolicy):
    alpha: float = 1.0
    memory: str = "own"
    recency: str = "shifted"
    mlp_bug: bool = False
    ties: str = "oldest"
    miscounts_freed_bytes: bool = False
    evicts_inner_nodes: bool = True
    scores_depend_on_candidates: bool = True
    #: the reference's terms, with its two bugs (``reference``) or without (``reference_fixed``)
    reference_switches: ClassVar[Switches] = {
        "reference": _REFERENCE | dict.fromkeys(_BUGS, True),
        "reference_fixed": _REFERENCE | dict.fromkeys(_BUGS, False),
    }

    @property
    def order(self) -> str:
        """``flop_aware`` with the paper's terms; the reference code's are ``custom``."""
        paper = (self.memory, self.recency, self.mlp_bug) == ("own", "shifted", False)
        return "flop_aware" if paper else "custom"

    def __post_init__(self) -> None:
        self.set_alpha(self.alpha)
        for key, value, allowed in (
            ("memory", self.memory, MEMORY_TERMS),
            ("recency", self.recency, RECENCY_TERMS),
            ("ties", self.ties, TIE_ORDERS),
        ):
            if value not in allowed:
                raise ValueError(f"eviction.{key} must be one of {allowed}, got {value!r}")
        for key in _BUGS:
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"eviction.{key} must be true or false")

    def set_alpha(self, alpha: float) -> None:
        self.alpha = checked_alpha(alpha)

    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        if lookup.hit_node is not None:
            cache.touch([lookup.hit_node])

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        """Marconi's utility score of each candidate slot (higher = keep)."""
        age = cache.now - cache.last_access[candidates]
        shifted = self.recency == "shifted"
        recency = 1.0 / (1.0 + age) if shifted else 1.0 / np.maximum(age, 1.0)
        if self.alpha == 0.0:
            return recency
        return min_max(recency) + self.alpha * min_max(self.efficiency(cache, candidates))

    def efficiency(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        """FLOPs saved per byte of each candidate, under the configured terms."""
        if self.memory == "own" and not self.mlp_bug:
            return cache.saved_flops[candidates] / cache.node_bytes[candidates]
        flops = cache.saved_flops[candidates]
        if self.mlp_bug:
            start = cache.starts[candidates].astype(np.float64)
            flops = flops + parent_mlp_bug(cache.model, start * cache.unit)
        end = cache.ends[candidates].astype(np.float64)
        if self.memory == "own":
            return flops / cache.node_bytes[candidates]
        return flops / (cache.ckpt_bytes + cache.kv_per_token * end)


def parent_mlp_bug(model: ModelSpec, prefix: np.ndarray) -> np.ndarray:
    """What the reference's MLP term adds to a node's saved FLOPs: it subtracts the parent
    prefix's attention FLOPs per MLP layer where the prefix's MLP FLOPs belong, i.e.
    ``mlp(P) - n_mlp * attn_layer(P)``."""
    per_layer = 1.0 / model.n_attn_layers if model.n_attn_layers else 0.0
    return np.array(
        [
            model.mlp_flops(0, p) - model.n_mlp_layers * per_layer * model.attention_flops(0, p)
            for p in prefix.astype(np.int64).tolist()
        ],
        dtype=np.float64,
    )
