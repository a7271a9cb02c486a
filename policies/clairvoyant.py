"""Clairvoyant eviction (Belady's farthest-next-use) on the prefix tree.

The policy is given the whole request sequence through ``prepare(requests)`` (the replay engine
calls it; position ``i`` is processed at clock ``i + 1``, so while request ``i`` is admitted the
future is positions ``>= now``). It evicts the candidate whose next use is farthest; a candidate
never used again goes first (ties: oldest node).

What "used" means follows the hit rule, judged against the current tree:

* pure Transformer, leaf ``n``: a future request uses ``n`` iff its reusable prefix reaches past
  ``n.start`` (at least one page of ``n``): evicting a leaf loses even a partial reuse. One-child
  nodes hold no state of their own (merging them frees nothing): never chosen while a leaf is.
* hybrid, leaf ``n`` with a checkpoint: used iff a future input passes through all of ``n`` and
  goes on for at least one token (a hit never covers a whole input); a leaf without checkpoint is
  useless KV (evicted first).
* hybrid, one-child ``n`` with a checkpoint (evicting it frees the checkpoint, its KV merges into
  the child): used by the future hits that *land* on it, i.e. pass through ``n`` but not through
  the first checkpointed nodes below it (those hits would use the deeper checkpoint). A
  one-child node without checkpoint frees nothing and is never chosen while anything else is.

Under a host tier the GPU evicts by writing back, and "leaf" means no GPU child: a GPU node
whose children are all on the host follows the leaf rules (a hybrid's is used by any future
input passing through all of it, since hits landing on the host checkpoints below need its
KV too). Scores still count uses, not load times: a written-back node is not lost.

So a parent's next use is never later than a child's (whatever passes through a child passes
through its parent), and a node's usefulness for hybrids comes from the checkpoints future hits
land on. Approximations (documented bounds, not proofs of optimality): scores are judged against
the current tree (dropping an ancestor checkpoint now is not re-valued when a descendant later
goes), bytes are ignored (classic Belady), and admission is not bypassed (the new sequence is
always admitted, as for every online policy). Without ``prepare`` the policy falls back to LRU.

Speed: the future inputs form a :class:`traces.trie.BatchTrie`; a cache node's location
in it is memoised by node id (a node's end and path never change), the requests passing a
location are one sorted-order range, and "next one at or after now" is a binary search in a
lazily sorted copy of that range. Each candidate's next use is cached per slot and stays valid
until the clock passes it or the node changes (id, bytes, child count; for a one-child node, its
checkpointed child's id and bytes), checked with array operations: on SWE-bench (3,531 requests,
44.8M tokens) the whole replay, index included, takes under a second.

Engines: the replay engine calls ``prepare`` with the requests in processing order and sets the
clock to the 1-based position; an engine that processes requests in another order than the one
given to ``prepare`` (the timed engine under load) gets a slightly wrong future.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from simlab.cache.contract import CacheView, EvictionPolicy, Tokens
from traces.trie import BatchTrie, as_inputs

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup, Node

INF = math.inf
Location = tuple[int, int] | None


@dataclass
class Clairvoyant(EvictionPolicy):
    """Belady on the prefix tree (see the module docstring). ``page_size``: KV page of the
    admission (Transformer hits round down to it; the cache's own page size also counts)."""

    page_size: Tokens = 1
    evicts_inner_nodes: bool = True
    scores_depend_on_candidates: bool = False
    _trie: BatchTrie | None = field(default=None, init=False, repr=False, compare=False)
    _locs: dict[int, Location] = field(default_factory=dict, init=False, repr=False, compare=False)
    _gaps: dict[tuple[int, ...], list[tuple[int, int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def order(self) -> str:
        """``next_use`` on whole ids; ``custom`` when its Transformer leaves count pages."""
        return "next_use" if self.page_size == 1 else "custom"

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"eviction.page_size must be >= 1, got {self.page_size}")
        self._slot_state(0)

    # ------------------------------------------------------------------ protocol
    def prepare(self, requests: Sequence[Any]) -> None:
        """Index the future: a prefix tree of every input, in processing order."""
        self._trie = BatchTrie(as_inputs(requests))
        self._locs.clear()
        self._gaps.clear()
        self._slot_state(0)

    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        cache.touch(lookup.path)  # recency, for the fallback and the tie order only

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        """``-next_use`` per candidate (farthest next use lowest; never used = -inf)."""
        if self._trie is None:
            return cache.last_access[candidates]
        if self._nid.shape[0] < cache.nids.shape[0]:
            self._slot_state(cache.nids.shape[0])
        if candidates.shape[0] == 1:  # the evictor re-scoring one node: no array calls
            slot = int(candidates[0])
            if not cache.hybrid and cache.n_children[slot] > 0:
                return np.array([INF])
            return np.array([-self._next_use(cache, slot)])
        inner = cache.n_children[candidates] > 0
        out = np.empty(candidates.shape[0], dtype=np.float64)
        if not cache.hybrid:
            out[inner] = INF  # a Transformer one-child node frees nothing
            out[~inner] = -self._next_uses(cache, candidates[~inner])
        else:
            out[:] = -self._next_uses(cache, candidates)
        return out

    # ------------------------------------------------------------------ per-slot cache
    def _slot_state(self, n: int) -> None:
        """Next use per slot, with what it was computed from (valid while nothing changed)."""
        self._nid = np.full(n, -1, dtype=np.int64)
        self._bytes = np.zeros(n, dtype=np.float64)
        self._kids = np.zeros(n, dtype=np.int64)
        self._dep = np.full(n, -1, dtype=np.int64)  # slot of the child it depends on, -2: any
        self._dep_nid = np.full(n, -1, dtype=np.int64)
        self._dep_bytes = np.zeros(n, dtype=np.float64)
        self._nu = np.zeros(n, dtype=np.float64)
        self._until = np.full(n, -INF)  # clock up to which ``_nu`` holds

    def _next_uses(self, cache: CacheView, slots: np.ndarray) -> np.ndarray:
        """Cached next uses; recomputed for slots whose node, child or next use has changed."""
        t = int(cache.now)
        dep = self._dep[slots]
        at = np.maximum(dep, 0)
        child_same = (dep == -1) | (
            (dep >= 0)
            & (cache.nids[at] == self._dep_nid[slots])
            & (cache.node_bytes[at] == self._dep_bytes[slots])
        )
        stale = (
            (self._nid[slots] != cache.nids[slots])
            | (self._bytes[slots] != cache.node_bytes[slots])
            | (self._kids[slots] != cache.n_children[slots])
            | (self._until[slots] < t)
            | ~child_same
        )
        for slot in slots[stale].tolist():
            self._recompute(cache, cache.node_at(slot), t)
        return self._nu[slots]

    def _next_use(self, cache: CacheView, slot: int) -> float:
        """:meth:`_next_uses` for one slot, in plain Python."""
        t = int(cache.now)
        dep = int(self._dep[slot])
        if dep == -1:
            child_same = True
        else:
            child_same = (
                dep >= 0
                and cache.nids[dep] == self._dep_nid[slot]
                and cache.node_bytes[dep] == self._dep_bytes[slot]
            )
        if (
            not child_same
            or self._nid[slot] != cache.nids[slot]
            or self._bytes[slot] != cache.node_bytes[slot]
            or self._kids[slot] != cache.n_children[slot]
            or self._until[slot] < t
        ):
            self._recompute(cache, cache.node_at(slot), t)
        return float(self._nu[slot])

    def _recompute(self, cache: CacheView, node: Node, t: int) -> None:
        slot, dep = node.slot, -1
        if cache.n_children[slot] == 0:  # no GPU child (under a host tier, maybe host ones)
            nu = self._leaf_next_use(cache, node, t)
        else:
            nu = self._inner_next_use(cache, node, t)
            if node.ckpt:
                (child,) = node.children.values()
                dep = child.slot if child.ckpt else -2
                self._dep_nid[slot] = child.nid
                self._dep_bytes[slot] = cache.node_bytes[child.slot]
        self._nu[slot] = nu
        self._until[slot] = nu if math.isfinite(nu) else INF
        self._nid[slot] = node.nid
        self._bytes[slot] = cache.node_bytes[slot]
        self._kids[slot] = cache.n_children[slot]
        self._dep[slot] = dep

    # ------------------------------------------------------------------ next uses
    def _leaf_next_use(self, cache: CacheView, node: Node, t: int) -> float:
        trie = cast(BatchTrie, self._trie)
        if cache.hybrid:  # with host children, hits landing on their checkpoints pass it too
            loc = self._loc(cache, node) if node.ckpt or node.children else None
        else:
            page = max(self.page_size, cache.page_size)
            depth = (node.start // page + 1) * page  # the first page boundary inside the node
            parent = node.parent
            up = self._loc(cache, parent) if parent is not None and depth <= node.end else None
            loc = None if up is None else trie.walk(*up, node.tokens[: depth - node.start])
        return INF if loc is None else trie.next_in(*trie.passing(*loc), t)

    # ------------------------------------------------------------------ inner nodes (hybrid)
    def _inner_next_use(self, cache: CacheView, node: Node, t: int) -> float:
        """Next future hit landing on ``node``'s checkpoint; -inf (keep) without checkpoint."""
        if not node.ckpt:
            return -INF
        below = _first_checkpoints_below(node)
        key = (node.nid, *(m.nid for m in below))
        gaps = self._gaps.get(key)
        if gaps is None:
            gaps = self._landing_ranges(cache, node, below)
            self._gaps[key] = gaps
        trie = cast(BatchTrie, self._trie)
        return min((trie.next_in(lo, hi, t) for lo, hi in gaps), default=INF)

    def _landing_ranges(
        self, cache: CacheView, node: Node, below: list[Node]
    ) -> list[tuple[int, int]]:
        """Sorted-order ranges of the inputs passing ``node`` but none of ``below``."""
        trie = cast(BatchTrie, self._trie)
        loc = self._loc(cache, node)
        if loc is None:
            return []
        lo, hi = trie.passing(*loc)
        cuts = []
        for m in below:
            sub = self._loc(cache, m)
            if sub is not None:
                cuts.append(trie.passing(*sub))
        gaps, at = [], lo
        for a, b in sorted(cuts):
            if a > at:
                gaps.append((at, a))
            at = max(at, b)
        if at < hi:
            gaps.append((at, hi))
        return gaps

    # ------------------------------------------------------------------ locations
    def _loc(self, cache: CacheView, node: Node) -> Location:
        """Where the path to ``node.end`` lies in the future's trie (None: no future input
        shares it). Memoised by node id: a node's end and path never change."""
        trie = cast(BatchTrie, self._trie)
        chain = []
        while node is not cache.root and node.nid not in self._locs:
            chain.append(node)
            assert node.parent is not None
            node = node.parent
        loc: Location = (0, 0) if node is cache.root else self._locs[node.nid]
        for n in reversed(chain):
            if loc is not None:
                loc = trie.walk(loc[0], loc[1], n.tokens)
            self._locs[n.nid] = loc
        return loc


def _first_checkpoints_below(node: Node) -> list[Node]:
    """The checkpointed nodes strictly below ``node`` with no checkpoint in between."""
    out, stack = [], list(node.children.values())
    while stack:
        n = stack.pop()
        if n.ckpt:
            out.append(n)
        else:
            stack.extend(n.children.values())
    return out
