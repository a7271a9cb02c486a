"""The radix tree as a node table: slots, per-slot arrays, nodes, byte counters and pins.

A :class:`NodeTable` owns every node of the tree and the numbers kept per node in arrays
indexed by ``node.slot`` (``last_access``, ``pins``, ``n_children``, ``node_bytes``,
``saved_flops``, ...), which are the single source of truth for those values; ``starts``/``ends``
mirror ``node.start``/``node.end`` for vectorised scoring. Its operations keep the arrays, the
tree and the byte counters (``kv_bytes``, ``ssm_bytes``) in step: making and releasing nodes,
hanging a chain of new nodes, splitting an edge, merging a node into its only child, dropping
leaves and chains, pins (which walk up to the root) and the recency stamps. What to keep, what
to evict and what a request may reuse are decided above it (:mod:`simlab.cache.prefix`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Self, cast

import numpy as np

from simlab.cache import host_tier as tiers
from simlab.cache.nodes import Node

if TYPE_CHECKING:
    from simlab.model.spec import ModelSpec

_INITIAL_SLOTS = 1024
#: chains and paths longer than this get their per-node arrays read or filled in bulk
BULK_MIN_NODES = 8
#: the slot-indexed arrays
_ARRAYS = (
    "last_access",
    "state_access",
    "pins",
    "n_children",
    "node_bytes",
    "saved_flops",
    "nids",
    "starts",
    "ends",
    "alive",
    "on_host",
)


def _edge_views(seq: np.ndarray, stops: list[int], lengths: np.ndarray) -> list[np.ndarray]:
    """Views of ``seq`` on the edges of a chain ending at ``stops`` (of ``lengths``; the first
    starts at ``stops[0] - lengths[0]``): the same views slicing would give, made in one call
    (rows of a 2-D view) when the inner edges are equally long, as fine-grained blocks are."""
    k = len(stops)
    inner = lengths[1:-1]
    if k < 3 or not (inner == inner[0]).all():
        return [seq[b - n : b] for b, n in zip(stops, lengths.tolist(), strict=True)]
    first, last = stops[0], stops[-2]
    rows = list(seq[first:last].reshape(k - 2, int(inner[0])))
    return [seq[first - int(lengths[0]) : first], *rows, seq[last : stops[-1]]]


def _chain_flags(stops: list[int], held: set[int], anywhere: bool) -> list[bool]:
    """Which of a chain's ``stops`` hold a checkpoint (are in ``held``): unless they may be
    ``anywhere`` (cuts, or block nodes) every stop but the last is one
    (:meth:`NodeTable.append_chain`'s common case)."""
    if not held:
        return [False] * len(stops)
    if anywhere:
        return [stop in held for stop in stops]
    return [True] * (len(stops) - 1) + [stops[-1] in held]


class NodeTable:
    """The tree's nodes, their slot-indexed numbers, the bytes they hold and their pins."""

    def __init__(
        self,
        model: ModelSpec,
        unit: int,
        ckpt_bytes: int,
        block_nodes: bool,
        host: tiers.HostTier | None,
    ):
        self.model = model
        self.unit = unit
        self.kv_per_unit_token = int(model.kv_bytes_per_token)
        self.kv_per_token = self.kv_per_unit_token * unit  # per id: ``unit`` tokens
        self.ckpt_bytes = ckpt_bytes
        self.block_nodes = block_nodes  # one node per id (a block pool's blocks)
        #: the host-memory tier below this cache (:mod:`simlab.cache.host_tier`); None: none
        self.host = host
        self.now = 0.0
        self.kv_bytes = 0
        self.ssm_bytes = 0
        self.peak_kv_bytes = 0
        self.peak_ssm_bytes = 0
        self.peak_bytes = 0
        self._next_nid = 0
        self._created: list[Node] | None = None  # nodes made by the insertion in progress
        self._state_clock = 0  # state admissions and uses so far
        self._alloc_arrays(_INITIAL_SLOTS)
        self.root = self._new_node(np.zeros(0, dtype=np.int32), None, 0)

    # ------------------------------------------------------------------ slots and nodes
    def _alloc_arrays(self, n: int) -> None:
        self.last_access = np.zeros(n, dtype=np.float64)
        #: its state's admission or last use, in the order they happened (:meth:`stamp_states`)
        self.state_access = np.zeros(n, dtype=np.float64)
        self.pins = np.zeros(n, dtype=np.int64)
        self.n_children = np.zeros(n, dtype=np.int64)
        self.node_bytes = np.zeros(n, dtype=np.float64)
        self.saved_flops = np.zeros(n, dtype=np.float64)
        self.nids = np.zeros(n, dtype=np.int64)
        #: each node's token span [start, end), as ``Node.start`` and ``Node.end``
        self.starts = np.zeros(n, dtype=np.int64)
        self.ends = np.zeros(n, dtype=np.int64)
        self.alive = np.zeros(n, dtype=bool)
        self.on_host = np.zeros(n, dtype=bool)  # the node lives in the host tier
        self._free: list[int] = list(range(n - 1, -1, -1))
        self._by_slot: list[Node | None] = [None] * n

    def _grow(self) -> None:
        old = len(self.alive)
        for name in _ARRAYS:
            arr = getattr(self, name)
            setattr(self, name, np.concatenate((arr, np.zeros_like(arr))))
        self._free.extend(range(2 * old - 1, old - 1, -1))
        self._by_slot.extend([None] * old)

    def _new_node(
        self, tokens: np.ndarray, parent: Node | None, start: int, ckpt: bool = False
    ) -> Node:
        if not self._free:
            self._grow()
        slot = self._free.pop()
        node = Node(tokens, parent, start, start + len(tokens), slot, self._next_nid, ckpt)
        self._next_nid += 1
        self.alive[slot] = True
        self._by_slot[slot] = node
        self.nids[slot] = node.nid
        self.last_access[slot] = self.now
        self.state_access[slot] = self.stamp_states(1)
        self.pins[slot] = 0
        self.n_children[slot] = 0
        self.refresh(node)
        if self._created is not None:
            self._created.append(node)
        return node

    def release(self, node: Node) -> None:
        """Free ``node``'s slot (the caller has unlinked it and settled its bytes)."""
        self.alive[node.slot] = False
        self._by_slot[node.slot] = None
        self.node_bytes[node.slot] = 0.0
        self._free.append(node.slot)

    def refresh(self, node: Node) -> None:
        """Recompute the bytes and the FLOPs-saved-beyond-parent of a node after a change."""
        length, short = node.end - node.start, node.short
        self.starts[node.slot], self.ends[node.slot] = node.start, node.end
        kv = length * self.kv_per_token - short * self.kv_per_unit_token  # :meth:`edge_kv`
        self.node_bytes[node.slot] = kv + (self.ckpt_bytes if node.ckpt else 0)
        tokens = length * self.unit - short
        self.saved_flops[node.slot] = (
            self.model.prefill_flops(node.start * self.unit, tokens) if tokens else 0.0
        )

    def edge_kv(self, node: Node) -> int:
        """KV bytes of ``node``'s edge (its tokens: a short last id's true ones)."""
        return (node.end - node.start) * self.kv_per_token - node.short * self.kv_per_unit_token

    def _attach(self, parent: Node, child: Node) -> None:
        parent.children[int(child.tokens[0])] = child
        child.parent = parent
        if self.host is None:
            self.n_children[parent.slot] = len(parent.children)
        else:  # the GPU view: host-resident children do not count
            self.n_children[parent.slot] = tiers.gpu_kids(self, parent)

    def node_at(self, slot: int) -> Node:
        """The live node at ``slot`` (slots come from the arrays or a policy's candidates)."""
        node = self._by_slot[slot]
        assert node is not None, slot
        return node

    def live_node(self, slot: int, nid: int) -> Node | None:
        """The node at ``slot`` if it is still node ``nid`` (a heap's entry may be stale)."""
        node = self._by_slot[slot]
        return node if node is not None and node.nid == nid else None

    def nodes(self) -> Iterator[Node]:
        """All non-root nodes, depth first."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ------------------------------------------------------------------ bytes and state stamps
    def account(self, kv: int, ssm: int) -> None:
        """Count ``kv`` and ``ssm`` bytes more (fewer when negative) on the GPU."""
        self.kv_bytes += kv
        self.ssm_bytes += ssm

    def note_peaks(self) -> None:
        """Record peak occupancy; called after every admission (the only growth)."""
        self.peak_kv_bytes = max(self.peak_kv_bytes, self.kv_bytes)
        self.peak_ssm_bytes = max(self.peak_ssm_bytes, self.ssm_bytes)
        self.peak_bytes = max(self.peak_bytes, self.kv_bytes + self.ssm_bytes)

    def stamp_states(self, k: int) -> np.ndarray | float:
        """Stamps for ``k`` state admissions or uses happening now, in order: a separate SSM
        pool evicts its least recently used state first, and SGLang's Mamba LRU is a list, so
        two states used at the same tick of the clock keep the order of their uses."""
        first = self._state_clock + 1
        self._state_clock += k
        return float(first) if k == 1 else np.arange(first, first + k, dtype=np.float64)

    # ------------------------------------------------------------------ pins
    def pin(self, node: Node | None) -> None:
        """Protect ``node`` and its ancestors from eviction until :meth:`unpin`."""
        slots = self._path_slots(node)
        if len(slots) > BULK_MIN_NODES:  # a deep node (a block pool's): one numpy call
            self.pins[slots] += 1  # distinct slots: no repeated index
            return
        pins = self.pins
        for slot in slots:
            pins[slot] += 1

    def unpin(self, node: Node | None) -> None:
        slots = self._path_slots(node)
        pins = self.pins
        if len(slots) > BULK_MIN_NODES and (pins[slots] > 0).all():
            pins[slots] -= 1
            return
        for i, slot in enumerate(slots):  # short paths; or name the unpinned node
            if pins[slot] <= 0:
                pins[slots[:i]] += 1  # undo, as if nothing had been unpinned
                raise RuntimeError(f"unpin of an unpinned node {self._by_slot[slot]!r}")
            pins[slot] -= 1

    def state_pinned(self, node: Node) -> bool:
        """Whether ``node`` itself is pinned, not only as an ancestor of a pinned node (its
        pins exceed its children's)."""
        pins = self.pins
        return bool(pins[node.slot] > sum(pins[c.slot] for c in node.children.values()))

    def _path_slots(self, node: Node | None) -> list[int]:
        """Slots of ``node`` and its ancestors, root excluded (the nodes a pin covers)."""
        slots: list[int] = []
        root = self.root
        while node is not None and node is not root:
            slots.append(node.slot)
            node = node.parent
        return slots

    @contextmanager
    def pinned(self, node: Node | None) -> Iterator[None]:
        self.pin(node)
        try:
            yield
        finally:
            self.unpin(node)

    # ------------------------------------------------------------------ growing the tree
    def split(self, node: Node, pos: int) -> Node:
        """Split ``node`` at ``pos``: a new upper node [start, pos) adopts it as only child."""
        parent = node.parent
        assert parent is not None
        cut = pos - node.start
        upper = self._new_node(node.tokens[:cut], parent, node.start)
        self.on_host[upper.slot] = self.on_host[node.slot]  # a host node splits into two
        upper_pins = self.pins[node.slot]
        node.tokens = node.tokens[cut:]
        node.key = None
        node.start = pos
        self._attach(parent, upper)
        self._attach(upper, node)
        self.pins[upper.slot] = upper_pins
        self.refresh(node)
        self.refresh(upper)
        return upper

    def append_chain(
        self,
        parent: Node,
        seq: np.ndarray,
        start: int,
        end: int,
        ckpts: list[int],
        cuts: list[int],
    ) -> Node:
        """Hang ``seq[start:end]`` under ``parent`` (a leaf or branch ending at ``start``) as a
        chain of nodes cut after each checkpoint in ``ckpts`` (sorted, distinct, in
        ``(start, end]``; the node ending there holds it), at each of ``cuts`` (in
        ``(start, end)``), and after every id for a block pool (``block_nodes``). A long chain's
        per-node arrays are filled in bulk: a fine-grained admission or a block pool appends
        hundreds of nodes at a time. Returns the last node; the caller counts its bytes."""
        if self.block_nodes:
            stops = list(range(start + 1, end + 1))
        elif cuts:
            stops = sorted({*ckpts, *cuts, end})
        else:  # the common case: ckpts are sorted, distinct, in (start, end]
            stops = [*ckpts[: bisect.bisect_left(ckpts, end)], end]
        held = set(ckpts)
        if len(stops) <= BULK_MIN_NODES:  # numpy's per-call cost outweighs a short loop
            pos = start
            for stop in stops:
                child = self._new_node(seq[pos:stop], parent, pos, ckpt=stop in held)
                self._attach(parent, child)
                parent, pos = child, stop
            return parent
        flags = _chain_flags(stops, held, bool(cuts) or self.block_nodes)
        return self._append_bulk(parent, seq, start, stops, flags)

    def _append_bulk(
        self, parent: Node, seq: np.ndarray, start: int, stops: list[int], flags: list[bool]
    ) -> Node:
        """:meth:`append_chain` of a long chain, its per-node arrays filled in bulk."""
        k = len(stops)
        while len(self._free) < k:
            self._grow()
        free = self._free
        slots = free[: -k - 1 : -1]  # the slots k pops would give, in that order
        del free[-k:]
        nid0 = self._next_nid
        self._next_nid += k
        starts = [start, *stops[:-1]]
        bounds = np.asarray([start, *stops], dtype=np.int64)
        edges = _edge_views(seq, stops, bounds[1:] - bounds[:-1])
        firsts = seq[starts].tolist()
        by_slot = self._by_slot
        top = parent
        nids = range(nid0, nid0 + k)
        for slot, a, b, edge, first_id, flag, nid in zip(
            slots, starts, stops, edges, firsts, flags, nids, strict=True
        ):
            node = Node(edge, parent, a, b, slot, nid, flag)
            parent.children[first_id] = node
            by_slot[slot] = node
            parent = node
        if self._created is not None:
            self._created.extend(cast("list[Node]", [by_slot[slot] for slot in slots]))
        self._fill_chain_arrays(np.asarray(slots, dtype=np.int64), nid0, bounds, flags)
        self.n_children[top.slot] = (
            len(top.children) if self.host is None else tiers.gpu_kids(self, top)
        )
        return parent

    def _fill_chain_arrays(
        self, idx: np.ndarray, nid0: int, bounds: np.ndarray, flags: list[bool]
    ) -> None:
        """The per-node arrays of a new chain in bulk: slots ``idx`` top to bottom, node ids
        from ``nid0``, node ``i`` spanning ``bounds[i]:bounds[i + 1]``, checkpoints ``flags``."""
        k, lengths = len(idx), bounds[1:] - bounds[:-1]
        self.alive[idx] = True
        self.nids[idx] = np.arange(nid0, nid0 + k)
        self.last_access[idx] = self.now
        self.state_access[idx] = self.stamp_states(k)
        self.pins[idx] = 0
        self.n_children[idx] = 1
        self.n_children[idx[-1]] = 0
        self.starts[idx], self.ends[idx] = bounds[:-1], bounds[1:]
        self.node_bytes[idx] = lengths * self.kv_per_token
        if any(flags):
            self.node_bytes[idx[np.asarray(flags, dtype=bool)]] += self.ckpt_bytes
        self.saved_flops[idx] = self.model.prefill_flops_array(
            bounds[:-1] * self.unit, lengths * self.unit
        )

    # ------------------------------------------------------------------ shrinking the tree
    def merge_down(self, node: Node) -> int:
        """Merge a one-child node into its child (its KV moves down, its state goes);
        returns the bytes freed (its state's)."""
        parent = node.parent
        assert parent is not None
        (child,) = node.children.values()
        child.tokens = np.concatenate((node.tokens, child.tokens))
        child.key = None
        child.start = node.start
        self.last_access[child.slot] = max(
            self.last_access[child.slot], self.last_access[node.slot]
        )
        self._attach(parent, child)
        self.refresh(child)
        freed_ckpt = self.ckpt_bytes if node.ckpt else 0
        self.ssm_bytes -= freed_ckpt
        self.release(node)
        return freed_ckpt

    def drop_leaf(self, node: Node) -> int:
        """Delete an unpinned leaf; returns the bytes freed (the hot path of eviction)."""
        parent = node.parent
        assert parent is not None
        children = parent.children
        del children[int(node.tokens[0])]
        self.n_children[parent.slot] = len(children)
        freed_kv = self.edge_kv(node)
        freed_ckpt = self.ckpt_bytes if node.ckpt else 0
        self.kv_bytes -= freed_kv
        self.ssm_bytes -= freed_ckpt
        self.release(node)
        return freed_kv + freed_ckpt

    def drop_chain(self, chain: list[Node], slots: list[int]) -> int:
        """Delete ``chain`` (a leaf, then its parent, ... each the only child of the next; their
        ``slots``; none pinned): only the topmost node's parent keeps a reference to fix.
        Returns the bytes freed."""
        if not chain:
            return 0
        top = chain[-1]
        parent = top.parent
        assert parent is not None
        del parent.children[int(top.tokens[0])]
        self.n_children[parent.slot] = len(parent.children)
        tokens = chain[0].end - top.start  # contiguous: each node's parent is the next
        ckpts = 0
        by_slot = self._by_slot
        for node, slot in zip(chain, slots, strict=True):
            ckpts += node.ckpt
            node.children.clear()  # no parent <-> child cycles left for the cyclic GC to find
            by_slot[slot] = None
        freed_kv = tokens * self.kv_per_token - chain[0].short * self.kv_per_unit_token
        freed_ckpt = ckpts * self.ckpt_bytes
        self.kv_bytes -= freed_kv
        self.ssm_bytes -= freed_ckpt
        self.alive[slots] = False
        self.node_bytes[slots] = 0.0
        self._free.extend(slots)
        return freed_kv + freed_ckpt

    def dismantle(self) -> None:
        """Unlink the tree of a cache that is done with (it is unusable after): with no
        parent-child cycle left, dropping it frees every node by reference counting, without
        the cyclic garbage collector, which :func:`simlab.util.collector.collector_paused` holds
        back while a run goes on (a tuner drops a copy of the tree per alpha per window)."""
        for node in self._by_slot:
            if node is not None:
                node.children.clear()
        self.root.children.clear()

    # ------------------------------------------------------------------ as plain data
    def slot_nodes(self) -> Sequence[Node | None]:
        """Each slot's node (None: a free slot), for :mod:`simlab.cache.snapshot`."""
        return self._by_slot

    def fields(self) -> dict[str, Any]:
        """The table's attributes but its nodes (``root`` and the slots'), the insertion in
        progress reset (:mod:`simlab.cache.snapshot`; values are not copied)."""
        fields = {k: v for k, v in vars(self).items() if k not in ("_by_slot", "root")}
        fields["_created"] = None
        return fields

    @classmethod
    def restore(cls, fields: dict[str, Any], nodes: list[Node | None], root: int) -> Self:
        """A table of :meth:`fields` and linked ``nodes`` (per slot), its root at ``root``."""
        table = object.__new__(cls)
        node = nodes[root]
        assert node is not None
        vars(table).update(fields, _by_slot=nodes, root=node)
        return table
