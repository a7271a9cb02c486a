"""Marconi+: Marconi's FLOP-aware eviction with a better-founded value of each candidate.

Candidates, merge-on-evict and the utility shape are Marconi's (``policies.flop_aware``):
``S(n) = recency(n) + alpha * efficiency(n)``, both min-max normalised over the candidates, lowest
evicted first (ties: oldest node); ``efficiency`` = FLOPs lost by evicting ``n`` / bytes. Marconi's
terms are already per node (its own bytes and its savings beyond the parent); what changes:

* **Recency** (``recency: linear``): the age ``now - last_access`` rather than Marconi's
  ``1 / (1 + age)``, whose min-max scaling crushes every node older than a few requests to ~0, so
  that among old nodes only FLOP efficiency orders them (long dead sequences are kept for ever).
* **Landing share** (``landing: true``, hybrids): evicting a one-child node only drops its
  checkpoint, which matters only to future hits that *land* on it (a hit that goes on to a deeper
  checkpoint does not use it). Its FLOPs lost are weighted by ``k / (k + 1)``, ``k`` = hits that
  landed on it so far: the checkpoint a finished turn left in the middle of a conversation
  (``k = 0``) goes first, a branch point many sessions land on (a shared system prompt) stays.
* **Checkpointed ancestor** (``ckpt_ancestor: true``, hybrids): a hit that would have landed on
  ``n`` falls back to the nearest *checkpointed* ancestor, not to the parent (which may hold no
  state), so the loss is the prefill from that ancestor's end to ``n.end``.
* ``exact_bytes: true`` divides a one-child node's loss by the checkpoint bytes it frees rather
  than all its bytes, and ``frequency: true`` weights the loss by the node's hit count (GDSF's
  expected value). Both were measured and are off by default: exact bytes make one-child
  efficiencies dwarf the leaves' and the min-max scaling then flattens the leaves to ~0;
  frequency was neutral (see the report).

A one-child node without checkpoint frees nothing when evicted (its KV only moves into the
child) and is never chosen while another candidate is. Apart from that, with every switch at
Marconi's setting (``recency: inverse``, the others false) the scores are Marconi's. Periodic re-tuning of ``alpha`` is a later issue: a tuner sets it through
:meth:`MarconiPlus.set_alpha` between requests (the paper's bootstrap-window grid search re-run
every N requests); nothing else in the policy depends on it.

Vectorised: per-slot mirrors of each node's end, checkpoint flag and parent slot are refreshed
only for the slots whose node changed (new id, or new bytes / saved FLOPs: a split, a merge, a
new checkpoint), so scoring stays O(candidates) numpy per eviction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache.contract import CacheView, EvictionPolicy
from simlab.cache.scoring import HitCounts, checked_alpha, min_max, reused_nodes

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup

RECENCY = ("linear", "inverse")


@dataclass
class MarconiPlus(EvictionPolicy):
    alpha: float = 1.0
    recency: str = "linear"
    frequency: bool = False
    exact_bytes: bool = False
    ckpt_ancestor: bool = True
    landing: bool = True
    evicts_inner_nodes: bool = True
    scores_depend_on_candidates: bool = True
    counts: HitCounts = field(default_factory=HitCounts, init=False, repr=False, compare=False)
    landed: HitCounts = field(
        default_factory=lambda: HitCounts(initial=0.0, inherit=False),
        init=False,
        repr=False,
        compare=False,
    )
    _key: np.ndarray = field(
        default_factory=lambda: np.zeros((0, 3)), init=False, repr=False, compare=False
    )
    _end: np.ndarray = field(
        default_factory=lambda: np.zeros(0), init=False, repr=False, compare=False
    )
    _ckpt: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=bool), init=False, repr=False, compare=False
    )
    _parent: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.set_alpha(self.alpha)
        if self.recency not in RECENCY:
            raise ValueError(f"eviction.recency must be one of {RECENCY}, got {self.recency!r}")

    def set_alpha(self, alpha: float) -> None:
        """The re-tuning hook: the weight of FLOP efficiency against recency."""
        self.alpha = checked_alpha(alpha)

    # ------------------------------------------------------------------ protocol
    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        if lookup.hit_node is not None:
            cache.touch([lookup.hit_node])
        landed = [lookup.hit_node] if cache.hybrid else reused_nodes(lookup)
        self.counts.hit(cache, [n for n in landed if n is not None])
        self.landed.hit(cache, [lookup.hit_node] if lookup.hit_node is not None else [])

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        age = cache.now - cache.last_access[candidates]
        recency = -age if self.recency == "linear" else 1.0 / (1.0 + age)
        if self.alpha == 0.0:
            return recency
        efficiency, ok = self._efficiency(cache, candidates)
        out = np.full(candidates.shape[0], np.inf)
        if ok.any():
            out[ok] = min_max(recency[ok]) + self.alpha * min_max(efficiency[ok])
        return out

    # ------------------------------------------------------------------ efficiency
    def _efficiency(self, cache: CacheView, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(FLOPs lost per byte freed, which candidates free anything)."""
        self._refresh(cache)
        inner = cache.n_children[cand] > 0
        freed = cache.node_bytes[cand].copy()
        freed[inner] = np.where(self._ckpt[cand[inner]], cache.ckpt_bytes, 0.0)
        ok = freed > 0  # merging a one-child node without checkpoint frees nothing
        per = freed if self.exact_bytes else cache.node_bytes[cand]
        if cache.hybrid and self.ckpt_ancestor:
            anc_end = self._end[self._checkpointed_ancestor(cache, cand)]
            end = self._end[cand]
            lost = cache.model.prefill_flops_array(anc_end, end - anc_end)
        else:
            lost = cache.saved_flops[cand]
        if self.frequency:
            lost = lost * self.counts.count[cand]
        if self.landing and cache.hybrid:
            landed = self.landed.count[cand[inner]]
            lost[inner] = lost[inner] * landed / (landed + 1.0)
        eff = np.zeros(cand.shape[0])
        eff[ok] = lost[ok] / per[ok]
        return eff, ok

    def _checkpointed_ancestor(self, cache: CacheView, cand: np.ndarray) -> np.ndarray:
        anc = self._parent[cand]
        need = ~self._ckpt[anc]
        while need.any():
            anc[need] = self._parent[anc[need]]
            need = ~self._ckpt[anc]
        return anc

    def _refresh(self, cache: CacheView) -> None:
        """Update the per-slot mirrors for the slots whose node is new or changed."""
        self.counts.sync(cache)
        self.landed.sync(cache)
        n = cache.nids.shape[0]
        if self._end.shape[0] < n:
            grow = n - self._end.shape[0]
            self._key = np.concatenate((self._key, np.full((grow, 3), -1.0)))
            self._end = np.concatenate((self._end, np.zeros(grow)))
            self._ckpt = np.concatenate((self._ckpt, np.zeros(grow, dtype=bool)))
            self._parent = np.concatenate((self._parent, np.zeros(grow, dtype=np.int64)))
        key = np.stack((cache.nids, cache.node_bytes, cache.saved_flops), axis=1)
        changed = np.flatnonzero(cache.alive & (key != self._key[:n]).any(axis=1))
        root = cache.root
        for slot in changed.tolist():
            node = cache.node_at(slot)
            self._end[slot] = node.end * cache.unit  # tokens, as the FLOPs count them
            self._ckpt[slot] = node.ckpt or node is root
            self._parent[slot] = node.parent.slot if node.parent is not None else root.slot
        self._key[changed] = key[changed]
