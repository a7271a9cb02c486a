"""Evict-until-fits for :class:`simlab.cache.prefix.PrefixCache`: which nodes go, in which order.

The cache asks the eviction policy for scores (``simlab.cache.contract.EvictionPolicy``) and evicts the
lowest-scored candidate until the bytes needed are free or no candidate is left; ties go to the
oldest node (smallest creation id). Two paths give the same victims in the same order:

* **re-scoring** (``scores_depend_on_candidates``, e.g. min-max normalised scores): the whole
  candidate set is scored again after every eviction;
* **heap** (static scores): candidates are scored once into a heap; a popped entry is checked
  against the node's current score, and after a leaf's eviction its chain of one-child
  ancestors is scored in one call and evicted in bulk (fine-grained admission makes chains of
  hundreds of nodes).

``ties=heap`` (the Marconi reference code's SGLang+) pops leaves from a ``heapq`` compared by
score alone (:func:`heap_victims`): equal scores go in whatever order the heap gives.

With a host tier (:mod:`simlab.cache.host_tier`) the candidates are the GPU-resident nodes without a
GPU-resident child, an evicted one is written back to the host (it stays in the tree), and the
heap path pops victims one by one (its chain shortcut deletes whole chains, which a write-back
does not).

Every path tells the policy what it evicted through ``on_evict`` (only when the policy
overrides the no-op hook, so the hot path pays nothing otherwise).
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache.contract import EvictionPolicy, overrides

if TYPE_CHECKING:
    from simlab.cache.nodes import Node
    from simlab.cache.prefix import PrefixCache

#: chains up to this long are read node by node (numpy's per-call cost outweighs it)
_SHORT_CHAIN = 32

#: ``on_evict(cache, nodes)`` of a policy that wants eviction events.
Listener = Callable[["PrefixCache", Sequence["Node"]], None]


def eviction_listener(policy: EvictionPolicy) -> Listener | None:
    """The policy's ``on_evict`` hook, or None when it keeps the no-op default."""
    return policy.on_evict if overrides(policy, "on_evict", EvictionPolicy) else None


def evict(cache: PrefixCache, need: float, policy: EvictionPolicy) -> tuple[int, int]:
    """Evict the lowest-scored candidates until ``need`` bytes are free or none is left.

    Ties go to the oldest node (smallest creation id). Scores that depend on the candidate
    set (min-max normalisation) are recomputed after every eviction; otherwise a heap holds
    the candidates and each popped entry is re-scored, so the order is still exact.
    """
    if need <= cache.free_bytes:
        return 0, 0
    if policy.ties == "heap":
        return _evict_in_turn(cache, need, heap_victims(cache, policy), policy)
    if policy.scores_depend_on_candidates or policy.ties == "dfs":
        victims = iter(functools.partial(next_victim, cache, policy), None)
        return _evict_in_turn(cache, need, victims, policy)
    return _evict_heap(cache, need, policy)


def evict_states(cache: PrefixCache, need: float, policy: EvictionPolicy) -> tuple[int, int]:
    """With a separate SSM pool (SGLang's Mamba slots), free states until ``need`` bytes of the
    pool are free, least recently used state first (``state_access``: admitted, published again
    or resumed from, stamped in the order it happened; SGLang's Mamba LRU list, not the KV
    recency): a leaf is evicted whole (its KV too), an inner node keeps its KV and loses its
    state (a tombstone; ``components/mamba.py`` ``_evict_device_next_node``). A pin protects the state of the
    pinned node only, not its ancestors' (SGLang's ``inc_lock_ref`` locks the whole path's KV
    but only the locked node's Mamba value). Returns (bytes freed, nodes evicted)."""
    freed = count = 0
    notify = eviction_listener(policy)
    while need > cache.ssm_free:
        slots = np.array(
            [n.slot for n in cache.nodes() if n.ckpt and not cache.state_pinned(n)],
            dtype=np.int64,
        )
        if slots.size == 0:
            break
        scores = cache.state_access[slots]
        tied = slots[scores == scores.min()]
        victim = cache.node_at(int(tied[np.argmin(cache.nids[tied])]))
        if victim.children:
            freed += cache.drop_state(victim)
            continue
        freed += cache.drop_leaf(victim)
        count += 1
        if notify is not None:
            notify(cache, [victim])
    return freed, count


def dfs_candidates(cache: PrefixCache, inner: bool) -> list[Node]:
    """Unpinned candidates (leaves, and one-child nodes if ``inner``) in depth-first pre-order,
    children in insertion order: the order of the Marconi reference code's
    ``_collect_leaf_and_single_child_nodes``, whose first minimum is evicted."""
    out: list[Node] = []
    pins, most = cache.pins, 1 if inner else 0
    stack = list(reversed(cache.root.children.values()))
    while stack:
        node = stack.pop()
        if len(node.children) <= most and not pins[node.slot]:
            out.append(node)
        stack.extend(reversed(node.children.values()))
    return out


def evict_counted(cache: PrefixCache, to_remove: float, policy: EvictionPolicy) -> tuple[int, int]:
    """The Marconi reference code's eviction loop (``evict``/``evict_v1``/``evict_v2``): evict
    the policy's lowest-scored candidate, re-scoring every time, until the bytes *it counts*
    reach ``to_remove`` or no candidate is left. A merged one-child node counts its state; a
    deleted leaf its state plus its edge's KV, or the last candidate's edge's KV under
    ``policy.miscounts_freed_bytes`` (the reference's bug), so the loop may stop early or
    late. Returns (bytes actually freed, nodes evicted)."""
    counted = 0.0
    freed = count = 0
    notify = eviction_listener(policy)
    heap = heap_victims(cache, policy) if policy.ties == "heap" else None
    while counted < to_remove:
        if heap is not None:
            victim = next(heap, None)
            if victim is None:
                break
            edge = victim
        else:
            victim = next_victim(cache, policy)
            if victim is None:
                break
            edge = victim
            if policy.miscounts_freed_bytes:
                edge = _last_dfs_candidate(cache, policy.evicts_inner_nodes)
        counted += cache.ckpt_bytes if victim.ckpt else 0
        if not victim.children:
            counted += (edge.end - edge.start) * cache.kv_per_token
        freed += cache.evict_node(victim)
        count += 1
        if notify is not None:
            notify(cache, [victim])
    return freed, count


class _ByScore:
    """A heap entry compared by its score alone, as the reference's ``TreeNode.__lt__``
    compares ``last_access_time`` alone: equal scores keep whatever order ``heapq`` gives."""

    __slots__ = ("node", "score")

    def __init__(self, score: float, node: Node):
        self.score, self.node = score, node

    def __lt__(self, other: _ByScore) -> bool:
        return self.score < other.score


def heap_victims(cache: PrefixCache, policy: EvictionPolicy) -> Iterator[Node]:
    """Leaves in the order of the Marconi reference code's SGLang+ (``evict_v1``): the leaves
    in depth-first pre-order, ``heapq.heapify``-ed by score alone, popped one by one, and a
    parent left without children pushed. The caller evicts each node yielded before asking
    for the next. Scores must not change during one eviction (LRU's do not)."""

    def entry(node: Node) -> _ByScore:
        return _ByScore(float(policy.scores(cache, np.array([node.slot]))[0]), node)

    heap = [entry(node) for node in dfs_candidates(cache, inner=False)]
    heapq.heapify(heap)
    while heap:
        node = heapq.heappop(heap).node
        parent = node.parent
        yield node
        if parent is None or parent is cache.root or parent.children:
            continue
        if not cache.pins[parent.slot]:  # a leaf now
            heapq.heappush(heap, entry(parent))


def _last_dfs_candidate(cache: PrefixCache, inner: bool) -> Node:
    """The last of :func:`dfs_candidates` (the caller knows there is one), found by walking
    the pre-order backwards: a node's children last to first, each subtree before the node."""
    pins, most = cache.pins, 1 if inner else 0
    stack: list[tuple[Node, bool]] = [(child, False) for child in cache.root.children.values()]
    while stack:
        node, below_done = stack.pop()
        if below_done:
            if len(node.children) <= most and not pins[node.slot]:
                return node
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in node.children.values())
    raise AssertionError("no eviction candidate")


def _dfs_position(node: Node) -> list[int]:
    """The child indices (insertion order) from the root down to ``node``: depth-first
    pre-order is the lexicographic order of these (an ancestor's is a prefix of its
    descendants')."""
    path = []
    while (parent := node.parent) is not None:
        path.append(next(i for i, c in enumerate(parent.children.values()) if c is node))
        node = parent
    path.reverse()
    return path


def _lowest_scored(cache: PrefixCache, policy: EvictionPolicy, cand: np.ndarray) -> Node:
    """The lowest-scored of ``cand`` (non-empty candidate slots). Ties: the first in
    depth-first order under ``policy.ties == "dfs"`` (as if every candidate had been listed by
    :func:`dfs_candidates`; min-max scores do not depend on the listing order), else the
    oldest node."""
    scores = policy.scores(cache, cand)
    tied = cand[scores == scores.min()]
    if tied.size == 1:
        return cache.node_at(int(tied[0]))
    if policy.ties == "dfs":
        return min((cache.node_at(int(s)) for s in tied), key=_dfs_position)
    return cache.node_at(int(tied[np.argmin(cache.nids[tied])]))


def next_victim(cache: PrefixCache, policy: EvictionPolicy) -> Node | None:
    """The candidate the policy scores lowest (ties: oldest node, or the first in depth-first
    order under ``policy.ties == "dfs"``); None if there is none."""
    if policy.ties == "dfs" and cache.host is not None:
        order = dfs_candidates(cache, policy.evicts_inner_nodes)
        cand = np.fromiter((n.slot for n in order), dtype=np.int64, count=len(order))
    else:
        cand = cache.candidates(policy.evicts_inner_nodes)
    return _lowest_scored(cache, policy, cand) if cand.size else None


def _evict_in_turn(
    cache: PrefixCache, need: float, victims: Iterator[Node], policy: EvictionPolicy
) -> tuple[int, int]:
    """Evict ``victims`` (each drawn after the one before is gone) until ``need`` bytes are
    free or they run out."""
    freed = count = 0
    notify = eviction_listener(policy)
    while need > cache.free_bytes:
        victim = next(victims, None)
        if victim is None:
            break
        freed += cache.evict_node(victim)
        count += 1
        if notify is not None:
            notify(cache, [victim])
    return freed, count


class _Frontier:
    """The candidates of one eviction call as one heap of ``(score, nid, slot)``, filled
    lazily: only the lowest-scored few are heapified; the rest wait in a reserve (numpy
    arrays) whose scores are all above every entry taken so far, and move into the heap,
    twice as many each time, when the heap's top is not below the reserve's lowest score.
    Pops give exactly the order of one heap over every candidate (scores are computed once,
    up front, as they would be for that heap), at the cost of the victims' neighbourhood
    rather than of the whole candidate set."""

    __slots__ = ("_floor", "_nids", "_scores", "_slots", "_take", "heap")

    def __init__(self, scores: np.ndarray, nids: np.ndarray, slots: np.ndarray, first: int = 32):
        self.heap: list[tuple[float, int, int]] = []
        self._scores, self._nids, self._slots = scores, nids, slots
        self._floor = math.inf  # lowest score in the reserve
        self._take = first
        self._fill()

    def _fill(self) -> None:
        """Move the reserve's lowest ``_take`` scores (and every tie of the highest) in."""
        scores = self._scores
        if scores.size > self._take:
            cut = float(np.partition(scores, self._take - 1)[self._take - 1])
            moved = scores <= cut
        else:
            moved = np.ones(scores.size, dtype=bool)
        entries = zip(
            scores[moved].tolist(),
            self._nids[moved].tolist(),
            self._slots[moved].tolist(),
            strict=True,
        )
        self.heap.extend(entries)
        heapq.heapify(self.heap)
        kept = ~moved
        self._scores, self._nids, self._slots = scores[kept], self._nids[kept], self._slots[kept]
        self._floor = float(self._scores.min()) if self._scores.size else math.inf
        self._take *= 2

    def pop(self) -> tuple[float, int, int] | None:
        """The lowest ``(score, nid, slot)`` of heap and reserve; None when both are empty."""
        while self._scores.size and (not self.heap or self.heap[0][0] >= self._floor):
            self._fill()
        return heapq.heappop(self.heap) if self.heap else None

    def push(self, entry: tuple[float, int, int]) -> None:
        heapq.heappush(self.heap, entry)

    def lower_bound(self) -> tuple[float, int] | None:
        """A key no remaining entry is below (None when empty): the heap's top, or the
        reserve's lowest score with a nid below every node's when that is lower."""
        top = self.heap[0][:2] if self.heap else None
        if self._scores.size and (top is None or self._floor <= top[0]):
            return (self._floor, -1)
        return top


def _evict_heap(cache: PrefixCache, need: float, policy: EvictionPolicy) -> tuple[int, int]:
    inner = policy.evicts_inner_nodes
    chains = not inner and cache.host is None  # a leaf's chain of ancestors goes at once
    cand = cache.candidates(inner)
    scores = np.asarray(policy.scores(cache, cand), dtype=np.float64)
    frontier = _Frontier(scores, cache.nids[cand], cand)
    notify = eviction_listener(policy)
    freed = count = 0
    while need > cache.free_bytes:
        entry = frontier.pop()
        if entry is None:
            break
        score, nid, slot = entry
        node = cache.live_node(slot, nid)
        if node is None or not cache.is_candidate(node, inner):
            continue
        if inner:  # a merge may have changed this node's score since it was pushed
            now_score = float(policy.scores(cache, np.array([slot]))[0])
            if now_score != score:
                frontier.push((now_score, nid, slot))
                continue
        parent, child = node.parent, _gpu_child(cache, node)
        freed += cache.evict_node(node)
        count += 1
        if notify is not None:
            notify(cache, [node])
        if child is None and chains:  # its parent may go next: often a long chain
            f, c = _evict_up(cache, parent, need, policy, frontier, notify)
            freed, count = freed + f, count + c
            continue
        for other in (parent, child):
            if other is not None and cache.is_candidate(other, inner):
                s = float(policy.scores(cache, np.array([other.slot]))[0])
                frontier.push((s, other.nid, other.slot))
    return freed, count


def _gpu_child(cache: PrefixCache, node: Node) -> Node | None:
    """The child a merge moves ``node``'s KV into; None for a node without GPU children (a
    leaf, or under a host tier one written back, whose host children may be dropped with it)."""
    return next(iter(node.children.values())) if cache.n_children[node.slot] else None


def _evict_up(
    cache: PrefixCache,
    node: Node | None,
    need: float,
    policy: EvictionPolicy,
    frontier: _Frontier,
    notify: Listener | None,
) -> tuple[int, int]:
    """After a leaf's eviction, its ancestors that become leaves one after the other (a
    chain: one child each, unpinned) are evicted at once while each scores below every
    remaining candidate (the frontier would pop it next: its lower bound counts stale
    entries too) and bytes are still needed; the first one kept is pushed. The same victims
    in the same order as popping them one by one, with one scoring call and bulk bookkeeping
    per chain (fine-grained admission makes chains of hundreds of nodes). Relies on a static
    score not changing when a node's only child is evicted (``simlab.cache.contract.EvictionPolicy``)."""
    deficit = need - cache.free_bytes
    chain, slot_list = _leaf_chain(cache, node, deficit)
    if not chain:
        return 0, 0
    slots = np.array(slot_list, dtype=np.int64)
    # plain Python over the (short, truncated) chain: cheaper than numpy's per-call cost
    scores = np.asarray(policy.scores(cache, slots), dtype=np.float64).tolist()
    nids = [c.nid for c in chain]  # == cache.nids[slots]
    n = 0
    if deficit > 0:  # the victims: a prefix of the chain keyed below the frontier, ...
        sizes = cache.node_bytes[slots].tolist()
        bound = frontier.lower_bound()
        capped = bound is not None
        top_score, top_nid = bound if bound is not None else (0.0, 0)
        held = 0.0
        for score, nid, size in zip(scores, nids, sizes, strict=True):
            if capped and not (score < top_score or (score == top_score and nid < top_nid)):
                break
            n += 1
            held += size
            if held >= deficit:  # ... up to the one that frees enough
                break
    if n < len(chain):
        frontier.push((scores[n], nids[n], slot_list[n]))
    freed = cache.drop_chain(chain[:n], slot_list[:n])
    if notify is not None and n:
        notify(cache, chain[:n])
    return freed, n


def _leaf_chain(
    cache: PrefixCache, node: Node | None, deficit: float = math.inf
) -> tuple[list[Node], list[int]]:
    """``node`` (a leaf now) and the ancestors that would each become a leaf once the one
    below is gone (unpinned, non-root, one child), and their slots. Empty if ``node`` is
    not a candidate. The walk stops one node after the nodes so far hold ``deficit`` bytes
    (their ``node_bytes``): :func:`_evict_up` never evicts past the node that covers the
    deficit and only needs the next one to push back on the heap."""
    root = cache.root
    if node is None or node is root or node.children:
        return [], []
    chain, slots = [node], [node.slot]
    if deficit > 0:  # else the leaf alone is the one kept and pushed back
        kv, ckpt_bytes = cache.kv_per_token, cache.ckpt_bytes
        # bytes of the chain so far (node_bytes: the edge's KV plus its state; only a leaf
        # may hold a short last id)
        held = (node.end - node.start) * kv - node.short * cache.kv_per_unit_token
        held += ckpt_bytes if node.ckpt else 0
        up = node.parent
        while up is not None and up is not root and len(up.children) == 1:
            chain.append(up)
            slots.append(up.slot)
            if held >= deficit:  # this node is the one kept and pushed back
                break
            held += (up.end - up.start) * kv + (ckpt_bytes if up.ckpt else 0)
            up = up.parent
    # the chain stops before its first pinned node (a long chain's pins read in one call)
    pins, cut = cache.pins, len(slots)
    if cut > _SHORT_CHAIN:
        pinned = np.flatnonzero(pins.take(slots))
        cut = int(pinned[0]) if pinned.size else cut
    else:
        for i, slot in enumerate(slots):
            if pins[slot]:
                cut = i
                break
    del chain[cut:], slots[cut:]
    return chain, slots
