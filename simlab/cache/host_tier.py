"""A host-memory tier below the GPU prefix cache (``cache.host_gb``, ``cache.host_bw_gbps``).

The model is SGLang's HiCache (``python/sglang/srt/mem_cache/hiradix_cache.py``, class
``HiRadixCache``): **one radix tree** whose nodes are GPU-resident or host-resident, not a second
store. What this module follows, rule by rule:

* **Write-back on eviction** (HiCache's ``write_policy="write_back"``, ``evict``): the GPU cache
  evicts only nodes with no GPU-resident child (HiCache's ``_collect_leaves_device``); such a
  victim is written to the host and stays in the tree, host-resident (``_evict_backuped``: the
  node keeps its place, ``value`` is dropped). Its parent may become a GPU leaf and go next.
* **Host eviction** (``evict_host``): when the host has no room for a write-back, host-resident
  leaves (no children at all) are dropped, least recently used first (HiCache's heap by
  ``last_access_time``; ties: the oldest node here); a parent left without children becomes a
  host leaf. A victim the host cannot take even so (bigger than the host, or everything there
  in use) is dropped with its host-resident subtree (HiCache's ``_evict_regular``).
* **Match** (``match_prefix``): a lookup walks GPU-resident nodes, then host-resident ones; the
  host part of the hit is a *host hit* (``host_hit_length``).
* **Load back** (``load_back``): the host-resident nodes from the GPU frontier down to the hit
  are loaded all or nothing; room is made on the GPU by its own eviction (which writes other
  nodes back to the host); when the GPU cannot make the room the request uses its GPU part only.
  A token radix tree splits the last node at the hit first (HiCache splits at the match).
* **Recompute** (``_insert_helper``: "change the reference if the node is evicted"): when a
  request's admission walks through host-resident nodes (its own tokens past its hit, which it
  recomputed), they become GPU-resident again without a load.

Where simlab differs, on purpose: the tier is **exclusive** — a node lives in one tier, so a
load back frees its host bytes (HiCache keeps the host copy, ``host_value``, after a load and
re-evicts such a node without writing it again; with an exclusive tier the GPU and the host
together hold GPU + host bytes of distinct entries, which is what the capacity oracles compare
against). HiCache's ``load_back_threshold`` (no load under 10 tokens) and its write-through
policies are not modelled. Hybrid models: an SSM checkpoint goes to the host with its node, at
its true size (``model.ssm_state_bytes``), and comes back with it.

Invariants (:func:`check`): GPU residency is closed upwards (a GPU node's parent is on the GPU,
so a host node's children are host nodes); ``cache.n_children`` counts a node's **GPU-resident**
children when the tier exists (the policies and the evictor see the GPU tree); host bytes never
exceed the host's capacity; pinned nodes are never dropped from the host.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from simlab.cache.contract import EvictionPolicy
    from simlab.cache.nodes import Node
    from simlab.cache.prefix import PrefixCache
    from simlab.cache.tree import NodeTable


@dataclass
class HostTier:
    """The host tier's capacity, bandwidth and counters (bytes; bandwidth in bytes/s)."""

    capacity: float
    bandwidth: float
    kv_bytes: int = 0
    ssm_bytes: int = 0
    peak_bytes: int = 0
    written_bytes: int = 0  # GPU victims written back to the host
    loaded_bytes: int = 0  # host hits loaded back to the GPU
    recomputed_bytes: int = 0  # host nodes made GPU-resident by a recompute (no load)
    dropped_bytes: int = 0  # left the tree from the host (or could not be written to it)
    #: (last_access, nid, slot) of host-resident leaves; entries are checked when popped
    heap: list[tuple[float, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.capacity > 0 or not self.bandwidth > 0:
            raise ValueError(
                f"host tier: capacity and bandwidth must be > 0, got {self.capacity}, "
                f"{self.bandwidth}"
            )

    @property
    def used_bytes(self) -> int:
        return self.kv_bytes + self.ssm_bytes

    @property
    def free_bytes(self) -> float:
        return self.capacity - self.kv_bytes - self.ssm_bytes

    def load_seconds(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over the host link (0 with an infinite bandwidth)."""
        return 0.0 if math.isinf(self.bandwidth) or not nbytes else nbytes / self.bandwidth

    def summary(self) -> dict[str, Any]:
        return {
            "host_gb": self.capacity / 1e9,
            "host_bw_gbps": self.bandwidth / 1e9,
            "peak_host_gb": self.peak_bytes / 1e9,
            "host_written_gb": self.written_bytes / 1e9,
            "host_loaded_gb": self.loaded_bytes / 1e9,
            "host_recomputed_gb": self.recomputed_bytes / 1e9,
            "host_dropped_gb": self.dropped_bytes / 1e9,
        }


# ---------------------------------------------------------------------- GPU view of the tree
def gpu_kids(cache: NodeTable, node: Node) -> int:
    """Children of ``node`` that are GPU-resident (``cache.n_children`` with a host tier)."""
    on_host = cache.on_host
    return sum(1 for child in node.children.values() if not on_host[child.slot])


def candidates(cache: PrefixCache, inner: bool) -> np.ndarray:
    """Slots of unpinned GPU-resident nodes the GPU may evict: those without a GPU child
    (written back), plus, if ``inner``, those whose only child is GPU-resident (merged)."""
    kids, pins = cache.n_children, cache.pins
    ok = (kids <= 1) & (pins == 0) if inner else (kids | pins) == 0
    mask = cache.alive & ~cache.on_host & ok
    mask[cache.root.slot] = False
    slots = mask.nonzero()[0]
    if inner:
        node_at = cache.node_at
        slots = np.array(
            [s for s in slots.tolist() if kids[s] == 0 or len(node_at(s).children) == 1],
            dtype=np.int64,
        )
    return slots


def is_candidate(cache: PrefixCache, node: Node, inner: bool) -> bool:
    """:func:`candidates` for one node."""
    slot = node.slot
    if node is cache.root or cache.pins[slot] > 0 or cache.on_host[slot]:
        return False
    kids = cache.n_children[slot]
    return kids == 0 or (inner and kids == 1 and len(node.children) == 1)


def evictable_bytes(cache: PrefixCache) -> float:
    """GPU bytes eviction could free: every unpinned GPU node (pins cover ancestors, so they
    all go eventually, GPU leaves first)."""
    mask = cache.alive & ~cache.on_host & (cache.pins == 0)
    mask[cache.root.slot] = False
    return float(cache.node_bytes[mask].sum())


# ---------------------------------------------------------------------- GPU -> host
def write_back(cache: PrefixCache, node: Node) -> int:
    """Evict a GPU node without GPU children: write it (KV and its checkpoint) to the host if
    the host can make room, else drop it with its host subtree. Returns the GPU bytes freed."""
    host = cache.host
    assert host is not None and not cache.on_host[node.slot] and node.parent is not None
    size = int(cache.node_bytes[node.slot])
    kv = cache.edge_kv(node)
    ssm = cache.ckpt_bytes if node.ckpt else 0
    cache.account(-kv, -ssm)
    cache.n_children[node.parent.slot] -= 1
    if make_room(cache, size):
        cache.on_host[node.slot] = True
        host.kv_bytes += kv
        host.ssm_bytes += ssm
        host.written_bytes += size
        host.peak_bytes = max(host.peak_bytes, host.used_bytes)
        if not node.children:
            _push_leaf(cache, node)
        return size
    _drop_subtree(cache, node)
    host.dropped_bytes += size
    return size


def make_room(cache: PrefixCache, need: float) -> bool:
    """Drop host-resident leaves, least recently used first (ties: oldest), until ``need``
    bytes are free on the host; False if they cannot be (pinned host nodes stay)."""
    host = cache.host
    assert host is not None
    if need > host.capacity:
        return False
    heap, held = host.heap, []
    on_host, pins, last = cache.on_host, cache.pins, cache.last_access
    while need > host.free_bytes and heap:
        entry = heapq.heappop(heap)
        score, nid, slot = entry
        node = cache.live_node(slot, nid)
        if node is None or not on_host[slot] or node.children:
            continue  # gone, back on the GPU, or not a leaf (pushed again when it is one)
        if last[slot] != score:  # touched since it was pushed
            heapq.heappush(heap, (float(last[slot]), nid, slot))
            continue
        if pins[slot]:
            held.append(entry)
            continue
        _drop_host_leaf(cache, node)
    for entry in held:
        heapq.heappush(heap, entry)
    return need <= host.free_bytes


def _push_leaf(cache: PrefixCache, node: Node) -> None:
    assert cache.host is not None
    heapq.heappush(cache.host.heap, (float(cache.last_access[node.slot]), node.nid, node.slot))


def _drop_host_leaf(cache: PrefixCache, node: Node) -> None:
    """Delete a host-resident leaf from the tree; its parent may become a host leaf."""
    host = cache.host
    parent = node.parent
    assert host is not None and parent is not None and not node.children
    del parent.children[int(node.tokens[0])]
    size = _forget(cache, node)
    host.dropped_bytes += size
    if parent is not cache.root and cache.on_host[parent.slot] and not parent.children:
        _push_leaf(cache, parent)


def _forget(cache: PrefixCache, node: Node) -> int:
    """Release a host node's slot and bytes (the caller unlinks it); returns its bytes."""
    host = cache.host
    assert host is not None
    kv = cache.edge_kv(node)
    ssm = cache.ckpt_bytes if node.ckpt else 0
    host.kv_bytes -= kv
    host.ssm_bytes -= ssm
    cache.on_host[node.slot] = False
    node.children.clear()
    cache.release(node)
    return kv + ssm


def _drop_subtree(cache: PrefixCache, node: Node) -> None:
    """Delete ``node`` (its GPU bytes already unaccounted) and its host-resident subtree."""
    parent = node.parent
    assert parent is not None
    del parent.children[int(node.tokens[0])]
    stack = list(node.children.values())
    node.children.clear()
    cache.release(node)
    while stack:
        below = stack.pop()
        stack.extend(below.children.values())
        assert cache.host is not None
        cache.host.dropped_bytes += _forget(cache, below)


# ---------------------------------------------------------------------- host -> GPU
def _to_gpu(cache: PrefixCache, nodes: Sequence[Node]) -> int:
    """Make host nodes GPU-resident (top-down: each one's parent is on the GPU or listed
    before it); the GPU may be over capacity until the caller evicts. Returns their bytes."""
    host = cache.host
    assert host is not None
    moved = 0
    for node in nodes:
        kv = cache.edge_kv(node)
        ssm = cache.ckpt_bytes if node.ckpt else 0
        cache.on_host[node.slot] = False
        host.kv_bytes -= kv
        host.ssm_bytes -= ssm
        cache.account(kv, ssm)
        assert node.parent is not None
        cache.n_children[node.parent.slot] += 1
        moved += kv + ssm
    return moved


def _host_chain(cache: PrefixCache, node: Node | None) -> list[Node]:
    """The host-resident nodes from the GPU frontier down to ``node``, top-down."""
    chain = []
    on_host, root = cache.on_host, cache.root
    while node is not None and node is not root and on_host[node.slot]:
        chain.append(node)
        node = node.parent
    chain.reverse()
    return chain


def _bring_back(cache: PrefixCache, chain: list[Node], pin: Node, policy: EvictionPolicy) -> bool:
    """Move ``chain`` to the GPU all or nothing, evicting GPU nodes (written back) for room;
    ``pin`` (the chain's deepest node) is pinned meanwhile. False (nothing moved) if the GPU
    cannot make the room."""
    size = float(cache.node_bytes[[n.slot for n in chain]].sum())
    cache.pin(pin)
    try:
        if size > cache.free_bytes + evictable_bytes(cache):
            return False
        _to_gpu(cache, chain)
        if cache.free_bytes < 0:
            cache.evict(0.0, policy)
        assert cache.free_bytes >= 0, "a load back did not fit after its eviction"
    finally:
        cache.unpin(pin)
    cache.note_peaks()
    return True


def load_hit(cache: PrefixCache, hit: int, hit_node: Node | None, policy: EvictionPolicy) -> int:
    """Load back the host part of a hit ending at ``hit`` (ids) in ``hit_node``: its nodes
    become GPU-resident (``hit_node`` split at ``hit`` first when the hit ends inside it).
    Returns the bytes loaded: 0 when the hit is all on the GPU, -1 when the GPU cannot make
    room (nothing loaded; the caller falls back to the GPU part of the hit)."""
    if hit_node is None or not cache.on_host[hit_node.slot]:
        return 0
    if hit_node.end > hit > hit_node.start:  # load only what is reused (HiCache splits too)
        hit_node = cache.split(hit_node, hit)
    chain = _host_chain(cache, hit_node)
    if not _bring_back(cache, chain, hit_node, policy):
        return -1
    loaded = int(cache.node_bytes[[n.slot for n in chain]].sum())
    assert cache.host is not None
    cache.host.loaded_bytes += loaded
    return loaded


def recompute_path(cache: PrefixCache, deepest: Node | None, policy: EvictionPolicy) -> bool:
    """An admission walks through host nodes down to ``deepest`` (its own recomputed tokens):
    they become GPU-resident without a load. False if the GPU cannot hold them."""
    chain = _host_chain(cache, deepest)
    if not chain:
        return True
    assert deepest is not None and cache.host is not None
    if not _bring_back(cache, chain, deepest, policy):
        return False
    cache.host.recomputed_bytes += int(cache.node_bytes[[n.slot for n in chain]].sum())
    return True


def gpu_prefix(cache: PrefixCache, path: list[Node], partial: Node | None) -> int:
    """Ids of the matched prefix held on the GPU: the match stops at the first host node."""
    on_host = cache.on_host
    for node in path:
        if on_host[node.slot]:
            return node.start
    if partial is not None and on_host[partial.slot]:
        return partial.start
    return -1  # all of it


# ---------------------------------------------------------------------- invariants
def check(cache: PrefixCache) -> None:
    """Assert the tier's invariants (O(tree); for tests)."""
    host = cache.host
    assert host is not None
    kv = ssm = 0
    on_host = cache.on_host
    for node in cache.nodes():
        parent = node.parent
        assert parent is not None
        if on_host[node.slot]:
            kv += cache.edge_kv(node)
            ssm += cache.ckpt_bytes if node.ckpt else 0
        elif parent is not cache.root:
            assert not on_host[parent.slot], f"GPU node {node} under a host node"
    assert (kv, ssm) == (host.kv_bytes, host.ssm_bytes), (kv, ssm, host.kv_bytes, host.ssm_bytes)
    assert host.used_bytes <= host.capacity, (host.used_bytes, host.capacity)
    assert not on_host[cache.root.slot]
