"""Radix prefix cache over token sequences, with exact KV / SSM-checkpoint byte accounting.

Structure. A radix tree whose edges hold numpy token arrays. A node owns the KV of its edge's
tokens (all attention layers) and optionally one SSM checkpoint: the recurrent + conv state of
every SSM layer *after* the node's last token. ``node.start``/``node.end`` are the token
positions the edge covers, so ``node.end`` is the length of the prefix the node represents.

Invariants (checked by :meth:`PrefixCache.check_invariants`):
  * a node's children start with distinct tokens; every non-root edge is non-empty;
  * ``used_bytes == kv_bytes + ssm_bytes == sum(node bytes)`` and ``used_bytes <= capacity``
    (except under ``Semantics.reference_insert``, which reproduces the Marconi reference code's
    insertion past capacity);
  * ``pins[n] > 0`` for every ancestor of a pinned node (pins walk up to the root), and pinned
    nodes are never evicted nor merged;
  * per-node arrays (``last_access``, ``pins``, ``n_children``, ``node_bytes``, ``saved_flops``)
    are indexed by ``node.slot`` and are the single source of truth for those values;
    ``starts``/``ends`` mirror ``node.start``/``node.end`` for vectorised scoring.

Units. Tree positions count ids; one id is ``unit_tokens`` tokens (1 for token traces, the block
size for hash-id traces), so ``kv_per_token`` is really KV bytes per id. A prompt's short last id
(:mod:`simlab.cache.keys`) holds fewer: with :attr:`PrefixCache.exact_tokens` its leaf holds its true
tokens (``node.short`` fewer), which its bytes and FLOPs count.

Hits. For a pure Transformer any cached prefix is reusable, rounded down to whole pages. For a
hybrid model a prefix of length ``L`` is reusable only if a checkpoint exists at exactly ``L``.
At least one input token is always recomputed (a prefill must produce the next-token logits),
so a hit never exceeds ``len(input) - 1``: in ids, or with :attr:`PrefixCache.exact_tokens` in
tokens (the request step caps it; the hit may then end inside the last id).

The cache owns the tree, the bytes, pins and evict-until-fits; which node to evict is asked of
an eviction policy (``simlab.cache.contract.EvictionPolicy``), and which checkpoints to take of an
admission policy. The cache reads the clock ``now`` that its engine sets; it never reads the
wall clock.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import numpy as np

from simlab.cache import evictor
from simlab.cache import host_tier as tiers
from simlab.cache.contract import EvictionPolicy, Semantics, overrides
from simlab.cache.nodes import (
    InsertPlan,
    InsertResult,
    Lookup,
    Node,
    plan_admission,
    plan_bytes,
    truncate,
)

if TYPE_CHECKING:
    from simlab.model.spec import ModelSpec

__all__ = ["InsertResult", "Lookup", "Node", "PrefixCache"]

_TOKEN_BYTES = 4  # int32 token ids

_INITIAL_SLOTS = 1024
_BULK_MIN_NODES = 8  # chains longer than this get their per-node arrays filled in bulk


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


class PrefixCache:
    """Radix tree + capacity + pins; see the module docstring for the invariants."""

    def __init__(
        self,
        model: ModelSpec,
        capacity_bytes: float,
        page_size: int = 1,
        unit_tokens: int = 1,
        block_nodes: bool = False,
        ssm_capacity_bytes: float | None = None,
        semantics: Semantics | None = None,
        host: tiers.HostTier | None = None,
        ckpt_states: int = 1,
        block_keys: bool = False,
    ):
        if not capacity_bytes > 0:
            raise ValueError(f"cache capacity must be positive, got {capacity_bytes} bytes")
        if page_size < 1 or unit_tokens < 1 or ckpt_states < 1:
            raise ValueError(
                "page_size, unit_tokens and ckpt_states must be >= 1, "
                f"got {page_size}, {unit_tokens}, {ckpt_states}"
            )
        self.model = model
        self.capacity = float(capacity_bytes)  # KV's bytes, and the states' unless separate
        #: None: states count against ``capacity``; else their own pool (SGLang's Mamba pool)
        self.ssm_capacity = None if ssm_capacity_bytes is None else float(ssm_capacity_bytes)
        self._states_share = self.ssm_capacity is None
        self.page_size = int(page_size)
        self.unit = int(unit_tokens)
        self.kv_per_token = int(model.kv_bytes_per_token) * self.unit
        #: SSM states one checkpoint holds (an admission finer than a hash-id trace's id keeps
        #: its states inside the id: AdmissionPolicy.states_per_checkpoint)
        self.ckpt_states = int(ckpt_states) if model.is_hybrid else 1
        self.ckpt_bytes = int(model.ssm_state_bytes) * self.ckpt_states if model.is_hybrid else 0
        self.hybrid = bool(model.is_hybrid)
        self.block_nodes = bool(block_nodes)  # one node per id (a block pool's blocks)
        #: ids are whole blocks of tokens (:class:`simlab.cache.keys.BlockKeys`): a block pool's, or
        #: a radix tree keyed by pages (SGLang's ``--page-size``)
        self.block_keys = bool(block_keys) or self.block_nodes
        self.semantics = semantics or Semantics()
        self.kv_per_unit_token = int(model.kv_bytes_per_token)  # ``kv_per_token`` is per id
        #: a Transformer's token-keyed tree over ids of many tokens (hash-id traces), simlab's
        #: semantics: a short last id holds its true tokens, and the hit rule leaves one token,
        #: not one id (SGLang's radix tree over the prompt's tokens)
        self.exact_tokens = (
            self.unit > 1 and not self.hybrid and not self.block_keys and not self._reference()
        )
        whole = self.semantics.whole_input_hit or self.exact_tokens
        self._hit_slack = 0 if whole else 1  # ids a hit leaves
        self.now = 0.0
        self.kv_bytes = 0
        self.ssm_bytes = 0
        self.peak_kv_bytes = 0
        self.peak_ssm_bytes = 0
        self.peak_bytes = 0
        self._next_nid = 0
        self._created: list[Node] | None = None  # nodes made by the insertion in progress
        self._admit_policy: EvictionPolicy | None = None  # whose ``on_admit`` override
        self._admits = False  # ... was checked: it has one
        #: the host-memory tier below this cache (:mod:`simlab.cache.host_tier`); None: none
        self.host = host
        if host is not None and (ssm_capacity_bytes is not None or self._reference()):
            raise ValueError(
                "a host tier needs simlab's own cache semantics and one shared GPU budget "
                "(no policy.compat=reference, no cache.ssm_gb)"
            )
        self._state_clock = 0  # state admissions and uses so far
        self._alloc_arrays(_INITIAL_SLOTS)
        self.root = self._new_node(np.zeros(0, dtype=np.int32), None, 0)

    # ------------------------------------------------------------------ arrays and nodes
    def _alloc_arrays(self, n: int) -> None:
        self.last_access = np.zeros(n, dtype=np.float64)
        #: its state's admission or last use, in the order they happened (:meth:`_state_uses`)
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
        for name in (
            "last_access",
            "state_access",
            "pins",
            "n_children",
            "node_bytes",
            "saved_flops",
            "nids",
            "starts",
            "ends",
        ):
            arr = getattr(self, name)
            setattr(self, name, np.concatenate((arr, np.zeros_like(arr))))
        self.alive = np.concatenate((self.alive, np.zeros(old, dtype=bool)))
        self.on_host = np.concatenate((self.on_host, np.zeros(old, dtype=bool)))
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
        self.state_access[slot] = self._state_uses(1)
        self.pins[slot] = 0
        self.n_children[slot] = 0
        self._refresh_numbers(node)
        if self._created is not None:
            self._created.append(node)
        return node

    def _release(self, node: Node) -> None:
        self.alive[node.slot] = False
        self._by_slot[node.slot] = None
        self.node_bytes[node.slot] = 0.0
        self._free.append(node.slot)

    def _refresh_numbers(self, node: Node) -> None:
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

    def _reference(self) -> bool:
        """Whether any of the Marconi reference code's cache semantics is on."""
        sem = self.semantics
        return bool(
            sem.reference_insert
            or sem.partial_descent
            or sem.whole_input_hit
            or sem.clock != "request"
            or sem.block_estimate
        )

    # ------------------------------------------------------------------ bytes
    @property
    def used_bytes(self) -> int:
        return self.kv_bytes + self.ssm_bytes

    @property
    def free_bytes(self) -> float:
        """Bytes free for KV (and for states, when they share the budget)."""
        if self._states_share:
            return self.capacity - self.kv_bytes - self.ssm_bytes  # hot: no nested property
        return self.capacity - self.kv_bytes

    @property
    def ssm_free(self) -> float:
        """Bytes free for SSM states (their own pool's, or the shared budget's)."""
        if self.ssm_capacity is None:
            return self.free_bytes
        return self.ssm_capacity - self.ssm_bytes

    def _account(self, kv: int, ssm: int) -> None:
        self.kv_bytes += kv
        self.ssm_bytes += ssm

    def _note_peaks(self) -> None:
        """Record peak occupancy; called after every admission (the only growth)."""
        self.peak_kv_bytes = max(self.peak_kv_bytes, self.kv_bytes)
        self.peak_ssm_bytes = max(self.peak_ssm_bytes, self.ssm_bytes)
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    # ------------------------------------------------------------------ matching
    def _walk(self, tokens: np.ndarray) -> tuple[list[Node], int, Node | None]:
        """Longest cached prefix of ``tokens``: (fully matched nodes, length, partial node).

        Whole edges are compared as byte strings; only the edge holding the mismatch is
        compared element-wise (numpy), to find where inside it the match stops. A block pool
        (one id per edge) is matched id by id on a plain list.
        """
        if self.block_nodes:
            found = self._walk_ids(tokens)
            if found is not None:
                return found
        query = tokens.tobytes()
        n = int(tokens.shape[0])
        node, pos = self.root, 0
        path: list[Node] = []
        ids = tokens.data  # a memoryview: its items are Python ints, no numpy scalar per edge
        while pos < n:
            child = node.children.get(ids[pos])
            if child is None:
                return path, pos, None
            length = child.end - child.start
            key = child.key
            if key is None:
                key = child.key = child.tokens.tobytes()
            if (
                pos + length <= n
                and query[_TOKEN_BYTES * pos : _TOKEN_BYTES * (pos + length)] == key
            ):
                path.append(child)
                pos += length
                node = child
                continue
            span = min(length, n - pos)
            diff = np.flatnonzero(child.tokens[:span] != tokens[pos : pos + span])
            pos += int(diff[0]) if diff.size else span
            return path, pos, child
        return path, pos, None

    def _walk_ids(self, tokens: np.ndarray) -> tuple[list[Node], int, None] | None:
        """:meth:`_walk` where every edge holds one id (``block_nodes``): a child found is
        matched whole. None if the walk meets a longer edge (a merge made it; then
        :meth:`_walk` compares edges as usual)."""
        node = self.root
        path: list[Node] = []
        for tok in tokens.tolist():
            child = node.children.get(tok)
            if child is None:
                break
            if child.end - child.start != 1:
                return None
            path.append(child)
            node = child
        return path, len(path), None

    def _walk_descending(self, tokens: np.ndarray) -> Lookup:
        """The Marconi reference code's match with its descent bug
        (``Semantics.partial_descent``): after a mismatch inside an edge the walk enters that
        node and goes on with the rest of the input; the nodes it matches whole are credited
        (``hit``: their total length, the deepest is ``hit_node``), ``matched`` counts every
        matched token, ``partial`` is the first node matched in part, and ``path`` lists
        every node the walk entered, in order (the reference's SGLang+ refreshes them)."""
        n = int(tokens.shape[0])
        node, pos = self.root, 0
        entered: list[Node] = []
        credited: list[Node] = []
        partial: Node | None = None
        while pos < n:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                break
            length = child.end - child.start
            span = min(length, n - pos)
            diff = np.flatnonzero(child.tokens[:span] != tokens[pos : pos + span])
            common = int(diff[0]) if diff.size else span
            pos += common
            entered.append(child)
            if common == length:
                credited.append(child)
            elif partial is None:
                partial = child
            node = child
        limit = n - self._hit_slack
        while credited and sum(c.end - c.start for c in credited) > limit:
            credited.pop()
        hit = sum(c.end - c.start for c in credited)
        return Lookup(pos, hit, credited[-1] if credited else None, entered, partial)

    def lookup(
        self, tokens: np.ndarray, page_size: int | None = None, gpu_only: bool = False
    ) -> Lookup:
        """Match an input and apply the hit rule (no state change; see :meth:`touch`).
        With a host tier the match goes on through host-resident nodes; ``gpu_only`` stops it
        at the first one (the hit a request gets when its host part cannot be loaded)."""
        if self.semantics.partial_descent:
            return self._walk_descending(tokens)
        path, matched, partial = self._walk(tokens)
        if gpu_only and self.host is not None:
            stop = tiers.gpu_prefix(self, path, partial)
            if stop >= 0:
                path = [n for n in path if n.end <= stop]
                matched, partial = stop, None
        limit = int(tokens.shape[0]) - self._hit_slack
        if self.hybrid:
            hit_node, hit = None, 0
            for node in reversed(path):
                if node.ckpt and node.end <= limit:
                    hit_node, hit = node, node.end
                    break
        else:
            page = page_size or self.page_size
            hit = (min(matched, limit) // page) * page
            hit_node = self._node_covering(path, partial, hit)
        return Lookup(matched, hit, hit_node, path, partial)

    @staticmethod
    def _node_covering(path: Sequence[Node], partial: Node | None, pos: int) -> Node | None:
        """Deepest node on the match whose edge contains position ``pos`` (None for 0)."""
        if pos <= 0:
            return None
        for node in path:
            if node.end >= pos:
                return node
        return partial

    def split_at_match(self, lookup: Lookup) -> Lookup:
        """``lookup`` after splitting the edge its match stops inside, when the hit ends in
        that edge (a Transformer's): the hit then lies on whole nodes, so a pin of its node
        covers none of the edge's unmatched tail (SGLang splits there when it matches,
        ``_split_node``). The split is the one an admission of the request makes anyway."""
        partial = lookup.partial
        if partial is None or lookup.hit_node is not partial:
            return lookup
        upper = self._split(partial, lookup.matched)
        return Lookup(lookup.matched, lookup.hit, upper, [*lookup.path, upper], None)

    def split_match(self, lookup: Lookup, limit: int) -> Lookup:
        """``lookup`` after splitting the node its match stops inside, the match limited to
        ``limit`` ids (SGLang matches at most ``len(input) - 1``, ``_split_node``): the upper
        half joins the path (the hit node if the split node was), the lower one is
        ``Lookup.split``. Nothing happens when the (limited) match ends on a node boundary."""
        pos = min(lookup.matched, limit)
        along = [*lookup.path, lookup.partial] if lookup.partial is not None else lookup.path
        i = next((i for i, n in enumerate(along) if n.start < pos < n.end), None)
        if i is None:
            return lookup
        lower = along[i]
        upper = self._split(lower, pos)
        hit_node = upper if lookup.hit_node is lower else lookup.hit_node
        path = [*lookup.path[:i], upper]
        partial = lookup.partial
        if lower is not partial:
            path += lookup.path[i:]
        return Lookup(lookup.matched, lookup.hit, hit_node, path, partial, lower)

    def use_state(self, node: Node | None) -> None:
        """A request resumes from ``node``'s state: only that state counts as recently used
        in the SSM pool's own LRU (SGLang: a hit refreshes only the consumed Mamba node)."""
        if node is not None and node.ckpt:
            self.state_access[node.slot] = self._state_uses(1)

    def _state_uses(self, k: int) -> np.ndarray | float:
        """Stamps for ``k`` state admissions or uses happening now, in order: a separate SSM
        pool evicts its least recently used state first, and SGLang's Mamba LRU is a list, so
        two states used at the same tick of the clock keep the order of their uses."""
        first = self._state_clock + 1
        self._state_clock += k
        return float(first) if k == 1 else np.arange(first, first + k, dtype=np.float64)

    def deepest_cached(self, tokens: np.ndarray) -> Node | None:
        """The deepest node wholly on the cached prefix of ``tokens`` (None if none)."""
        path, _matched, _partial = self._walk(tokens)
        return path[-1] if path else None

    def touch(self, nodes: Sequence[Node]) -> None:
        """Mark nodes as accessed now (recency bookkeeping for eviction policies)."""
        if len(nodes) > _BULK_MIN_NODES:  # a long path: one fancy-indexed assignment
            self.last_access[[node.slot for node in nodes]] = self.now
            return
        last_access, now = self.last_access, self.now
        for node in nodes:
            last_access[node.slot] = now

    # ------------------------------------------------------------------ pins
    def pin(self, node: Node | None) -> None:
        """Protect ``node`` and its ancestors from eviction until :meth:`unpin`."""
        slots = self._path_slots(node)
        if len(slots) > _BULK_MIN_NODES:  # a deep node (a block pool's): one numpy call
            self.pins[slots] += 1  # distinct slots: no repeated index
            return
        pins = self.pins
        for slot in slots:
            pins[slot] += 1

    def unpin(self, node: Node | None) -> None:
        slots = self._path_slots(node)
        pins = self.pins
        if len(slots) > _BULK_MIN_NODES and (pins[slots] > 0).all():
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

    # ------------------------------------------------------------------ insertion
    def insert(
        self,
        seq: np.ndarray,
        ckpts: Sequence[int],
        end: int,
        policy: EvictionPolicy,
        *,
        cuts: Sequence[int] = (),
        held_from: int | None = None,
        stateless_kv: bool = False,
        branch_at_insert: bool = False,
        short: int = 0,
        running_states: int = 0,
        spare: int = 0,
    ) -> InsertResult:
        """Admit ``seq[:end]`` with SSM checkpoints at ``ckpts`` (positions in 1..end) and node
        boundaries at ``cuts`` (see :class:`simlab.cache.contract.Admission`, also for ``held_from``).
        ``short``: tokens ``seq``'s last id lacks (a prompt's short last id, which always ends
        its sequence); counted only with :attr:`exact_tokens` (else the id is whole).
        ``running_states``: with a separate SSM pool, the running request holds this many state
        slots of its own, outside the tree, from its allocation (made room for before its KV)
        on; at its finish one of them becomes its last state and the others are freed
        (SGLang's request Mamba slot, and with ``extra_buffer`` its ping-pong track slots;
        ``cache_finished_req`` donates one), so the finish needs none.
        ``spare``: ids the engine's eviction makes room for beyond the running request's
        allocation (with ``held_from``; SGLang's paged allocator asks for a page more).

        For a hybrid model KV past the last checkpoint is useless and is not admitted. When the
        admission does not fit even after evicting every unpinned candidate, it is truncated to
        the longest prefix that fits (never over capacity; ``truncated`` says so). The policy's
        ``on_admit`` hears of every node it created (split halves too), after its evictions.
        ``branch_at_insert``: a hybrid also checkpoints where ``seq`` diverges inside an edge.
        With ``semantics.reference_insert`` the Marconi reference code's insertion runs instead
        (:meth:`_insert_reference`).
        """
        if policy is not self._admit_policy:  # checked once per policy object
            self._admit_policy, self._admits = policy, overrides(policy, "on_admit", EvictionPolicy)
        self._created = [] if self._admits else None
        try:
            if self.semantics.reference_insert:
                result = self._insert_reference(seq, ckpts, end, policy, branch_at_insert)
            else:
                short = short if self.exact_tokens else 0
                result = self._insert(
                    seq,
                    ckpts,
                    end,
                    policy,
                    cuts,
                    held_from,
                    stateless_kv,
                    branch_at_insert,
                    short,
                    running_states if self.ssm_capacity is not None else 0,
                    spare,
                )
            created = self._created
        finally:
            self._created = None
        if created:
            policy.on_admit(self, created)
        return result

    def _insert(
        self,
        seq: np.ndarray,
        ckpts: Sequence[int],
        end: int,
        policy: EvictionPolicy,
        cuts: Sequence[int],
        held_from: int | None,
        stateless_kv: bool,
        branch_at_insert: bool,
        short: int,
        running_states: int,
        spare: int,
    ) -> InsertResult:
        n = int(seq.shape[0])
        end = min(int(end), n)
        if self.semantics.ticks_per_operation or policy.ticks_on_insert:
            self.now += 1.0
        result = InsertResult()
        saved = short * self.kv_per_unit_token  # bytes a short last id does not hold
        if held_from is not None:
            self._allocate(seq, held_from, saved, running_states, policy, result, spare)
        path, matched, partial = self._walk(seq[:end])
        if self.host is not None and not self._recomputed(path, matched, partial, policy):
            return InsertResult(admitted_end=matched, truncated=True)  # no GPU room for it
        if self.host is not None:
            path, matched, partial = self._walk(seq[:end])  # a split may have changed them
        if policy.refreshes_insert_path:
            self.touch(path if partial is None else [*path, partial])
        wanted = self._wanted(ckpts, end, matched, branch_at_insert and partial is not None)
        plan = plan_admission(self, path, matched, wanted, end, cuts, stateless_kv)
        deepest = partial if partial is not None else (path[-1] if path else None)
        self.pin(deepest)  # the matched path is safe from the evictions below
        try:
            need, states = self._room(plan, n, saved, held_from, running_states, spare)
            if states and states > self.ssm_free:
                path, partial, deepest = self._pin_matched_part(path, matched, partial)
                freed, count = evictor.evict_states(self, states, policy)
                result.evicted_bytes += freed
                result.evicted_nodes += count
            if need > self.free_bytes:
                if self.semantics.ticks_per_operation:
                    self.now += 1.0
                path, partial, deepest = self._pin_matched_part(path, matched, partial)
                freed, count = self.evict(need, policy)
                result.evicted_bytes += freed
                result.evicted_nodes += count
            lacking = need > self.free_bytes or (states and states > self.ssm_free)
            if lacking and not self._fits(plan, self._tail_bytes(plan, n, saved)):
                split = None if self.ssm_capacity is None else self.ssm_free
                plan = truncate(self, plan, self.free_bytes, split)  # whole ids: not the tail
                result.truncated = True
            self._apply(plan, path, partial, seq, result, short if plan.end == n else 0)
            if wanted and self.ssm_capacity is not None:
                self._reuse_state(seq, plan, wanted[-1])
        finally:
            self.unpin(deepest)
        self._note_peaks()
        return result

    def _room(
        self,
        plan: InsertPlan,
        n: int,
        saved: int,
        held_from: int | None,
        running_states: int,
        spare: int = 0,
    ) -> tuple[float, int]:
        """(bytes of the free budget, bytes of the separate SSM pool; 0 without one) that
        ``plan`` needs free, for a sequence of ``n`` ids (see :meth:`insert`)."""
        need, states = plan_bytes(self, plan) - self._tail_bytes(plan, n, saved), 0
        if self.ssm_capacity is not None:  # states come from their own pool
            states = (len(plan.old_ckpts) + len(plan.new_ckpts)) * self.ckpt_bytes
            need -= states
            if states:  # the running request keeps its own slots
                states += running_states * self.ckpt_bytes
        if held_from is not None:  # the running request's whole allocation must fit
            held = (n - held_from + spare) * self.kv_per_token - saved
            need = max(need, held + need - (plan.end - plan.matched) * self.kv_per_token)
        return need, states

    def _allocate(
        self,
        seq: np.ndarray,
        held_from: int,
        saved: int,
        running_states: int,
        policy: EvictionPolicy,
        result: InsertResult,
        spare: int = 0,
    ) -> None:
        """The running request's allocation before its insertion: it holds every id of ``seq``
        from ``held_from`` (its hit) on, ``spare`` ids more of free room, and ``running_states``
        state slots, so the cache
        evicts until they fit (the slots first, as SGLang's ``alloc_req_slots`` precedes
        ``alloc_token_slots``), protecting only the prefix up to ``held_from``. KV matched past
        the hit (a hybrid's prefix without a state) is not protected and may go (SGLang locks
        the request's hit node only, vLLM holds its hit blocks only); the insertion then walks
        the tree afresh."""
        held = (int(seq.shape[0]) - held_from + spare) * self.kv_per_token - saved
        slots = running_states * self.ckpt_bytes
        slot = slots > 0 and slots > self.ssm_free
        if held <= self.free_bytes and not slot:
            return
        path, matched, partial = self._walk(seq[:held_from])
        hit = path[-1] if path else None
        if partial is not None:  # the hit ends inside an edge: pin its matched part only
            hit = self._split(partial, matched)
        with self.pinned(hit):
            if slot:
                freed, count = evictor.evict_states(self, slots, policy)
                result.evicted_bytes += freed
                result.evicted_nodes += count
            freed, count = self.evict(held, policy)
        result.evicted_bytes += freed
        result.evicted_nodes += count

    def _pin_matched_part(
        self, path: list[Node], matched: int, partial: Node | None
    ) -> tuple[list[Node], Node | None, Node | None]:
        """Before an admission evicts, with the walk stopped inside an edge (``partial``
        pinned): split the edge at the match, so that only the matched part stays pinned and
        the rest of the edge, off the request's path, may be evicted like any leaf (SGLang
        splits the edge when it matches, ``_split_node``). Returns the new ``(path, partial,
        deepest pinned node)``; the split is the one :meth:`_apply` makes anyway."""
        deepest = partial if partial is not None else (path[-1] if path else None)
        if partial is None:
            return path, None, deepest
        self.unpin(partial)
        upper = self._split(partial, matched)
        self.pin(upper)
        return [*path, upper], None, upper

    def _recomputed(
        self, path: list[Node], matched: int, partial: Node | None, policy: EvictionPolicy
    ) -> bool:
        """Host tier: the admitted sequence's host-resident nodes (tokens the request
        recomputed past its hit) become GPU-resident without a load, a node the walk stops
        inside split there first (HiCache's ``_insert_helper``); False if the GPU cannot hold
        them (then nothing is admitted)."""
        deepest = partial if partial is not None else (path[-1] if path else None)
        if deepest is None or not self.on_host[deepest.slot]:
            return True  # GPU residency is closed upwards: all of the path is on the GPU
        if partial is not None:
            deepest = self._split(partial, matched)
        return tiers.recompute_path(self, deepest, policy)

    @staticmethod
    def _wanted(ckpts: Sequence[int], end: int, matched: int, branch: bool) -> list[int]:
        """The checkpoint positions to take, sorted and distinct: ``ckpts`` within ``1..end``,
        plus ``matched`` when the sequence branches off there inside an edge and ``branch``
        asks for its state."""
        extra = branch and matched > 0
        usual = not extra and ckpts and ckpts[0] > 0 and ckpts[-1] <= end
        if usual and all(map(operator.lt, ckpts, ckpts[1:])):  # sorted, distinct: as they are
            return list(ckpts)
        wanted = {c for c in ckpts if 0 < c <= end}
        if extra:
            wanted.add(matched)
        return sorted(wanted)

    def _insert_reference(
        self,
        seq: np.ndarray,
        ckpts: Sequence[int],
        end: int,
        policy: EvictionPolicy,
        branch_at_insert: bool,
    ) -> InsertResult:
        """The Marconi reference code's insertion (``radix_cache_hybrid.py`` ``insert``;
        :class:`simlab.cache.contract.Semantics`): the clock ticks for the insertion and for its
        speculative match, which refreshes nodes as a match does (``policy.on_hit``); the bytes
        to free are estimated as one SSM state (two when the sequence ends or diverges inside
        an edge) plus the KV past the match (vLLM+'s: ``Semantics.block_estimate``); the eviction (one more tick) frees that many bytes
        as the policy counts them (:func:`simlab.cache.evictor.evict_counted`); then the sequence is
        inserted whole, whatever the capacity, by a fresh walk (``_insert_helper``) that
        splits the edge it diverges in."""
        end = min(int(end), int(seq.shape[0]))
        tokens = seq[:end]
        if self.semantics.ticks_per_operation:
            self.now += 2.0
        speculative = self.lookup(tokens)
        policy.on_hit(self, speculative)
        block = self.semantics.block_estimate
        if block:  # vLLM+: the root and each whole block matched count one block each
            extra = end - block * (speculative.matched // block + 1)
            need = extra * self.kv_per_token + (extra / block) * self.ckpt_bytes
        else:
            states = (2 if speculative.partial is not None else 1) if self.hybrid else 0
            need = (end - speculative.matched) * self.kv_per_token + states * self.ckpt_bytes
        result = InsertResult()
        if need > self.free_bytes:
            if self.semantics.ticks_per_operation:
                self.now += 1.0
            pin = speculative.deepest if self.semantics.pin_insert else None
            with self.pinned(pin):
                freed, count = evictor.evict_counted(self, need - self.free_bytes, policy)
            result.evicted_bytes, result.evicted_nodes = freed, count
        path, matched, partial = self._walk(tokens)
        if policy.refreshes_insert_path:
            self.touch(path)
        wanted = self._wanted(ckpts, end, matched, branch_at_insert and partial is not None)
        self._apply(plan_admission(self, path, matched, wanted, end), path, partial, seq, result)
        self._note_peaks()
        return result

    @staticmethod
    def _tail_bytes(plan: InsertPlan, n: int, saved: int) -> int:
        """``saved`` when ``plan`` admits the sequence's last id (of ``n``), else 0."""
        return saved if plan.end == n > plan.matched else 0

    def _fits(self, plan: InsertPlan, saved: int = 0) -> bool:
        """Whether ``plan`` fits in the free bytes (``saved``: bytes its short last id lacks)."""
        kv = plan_bytes(self, plan) - saved
        if self.ssm_capacity is None:
            return kv <= self.free_bytes
        states = (len(plan.old_ckpts) + len(plan.new_ckpts)) * self.ckpt_bytes
        return kv - states <= self.free_bytes and states <= self.ssm_free

    def _apply(
        self,
        plan: InsertPlan,
        path: list[Node],
        partial: Node | None,
        seq: np.ndarray,
        result: InsertResult,
        short: int = 0,
    ) -> None:
        """Add ``plan`` to the tree (``short``: tokens the last new id lacks)."""
        along = list(path) + ([partial] if partial is not None else [])
        for c in plan.old_cuts:
            self._node_ending_at(along, c)
        for c in plan.old_ckpts:
            node = self._node_ending_at(along, c)
            self._set_ckpt(node, result)
        result.admitted_end = max(plan.end, plan.matched)
        if plan.end <= plan.matched:
            return
        parent = self._node_ending_at(along, plan.matched) if plan.matched else self.root
        last = self._append_chain(
            parent, seq, plan.matched, plan.end, plan.new_ckpts, plan.new_cuts
        )
        if short:
            last.short = short
            self._refresh_numbers(last)
        kv = self.kv_per_token * (plan.end - plan.matched) - short * self.kv_per_unit_token
        ssm = self.ckpt_bytes * len(plan.new_ckpts)
        self._account(kv, ssm)
        result.kv_bytes += kv
        result.ssm_bytes += ssm
        result.ckpts += len(plan.new_ckpts)

    def _reuse_state(self, seq: np.ndarray, plan: InsertPlan, tail: int) -> None:
        """A separate SSM pool: an admission whose deepest state ``tail`` is cached already
        makes that state the most recently used (SGLang's ``commit_insert_component_data``
        moves an existing Mamba value to the front of the Mamba LRU; the states above it on
        the path keep their place)."""
        if tail <= plan.matched:
            path, _matched, partial = self._walk(seq[:tail])
            if partial is None and path and path[-1].ckpt:
                self.state_access[path[-1].slot] = self._state_uses(1)

    def _append_chain(
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
        hundreds of nodes at a time. Returns the last node."""
        if self.block_nodes:
            stops = list(range(start + 1, end + 1))
        elif cuts:
            stops = sorted({*ckpts, *cuts, end})
        else:  # the common case: ckpts are sorted, distinct, in (start, end]
            stops = [*ckpts[: bisect.bisect_left(ckpts, end)], end]
        held = set(ckpts)
        if len(stops) <= _BULK_MIN_NODES:  # numpy's per-call cost outweighs a short loop
            pos = start
            for stop in stops:
                child = self._new_node(seq[pos:stop], parent, pos, ckpt=stop in held)
                self._attach(parent, child)
                parent, pos = child, stop
            return parent
        k = len(stops)
        while len(self._free) < k:
            self._grow()
        free = self._free
        slots = free[: -k - 1 : -1]  # the slots k pops would give, in that order
        del free[-k:]
        created = self._created
        nid0 = self._next_nid
        self._next_nid += k
        starts = [start, *stops[:-1]]
        bounds = np.asarray([start, *stops], dtype=np.int64)
        lengths = bounds[1:] - bounds[:-1]
        edges = _edge_views(seq, stops, lengths)
        firsts = seq[starts].tolist()
        by_slot = self._by_slot
        flags = self._chain_flags(stops, held, bool(cuts))
        top = parent
        nids = range(nid0, nid0 + k)
        for slot, a, b, edge, first_id, flag, nid in zip(
            slots, starts, stops, edges, firsts, flags, nids, strict=True
        ):
            node = Node(edge, parent, a, b, slot, nid, flag)
            parent.children[first_id] = node
            by_slot[slot] = node
            parent = node
        if created is not None:
            created.extend(cast("list[Node]", [by_slot[slot] for slot in slots]))
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
        self.state_access[idx] = self._state_uses(k)
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

    def _chain_flags(self, stops: list[int], held: set[int], cuts: bool) -> list[bool]:
        """Which of a chain's ``stops`` hold a checkpoint (are in ``held``): without cuts or
        block nodes every stop but the last is one (:meth:`_append_chain`'s common case)."""
        if not held:
            return [False] * len(stops)
        if cuts or self.block_nodes:
            return [stop in held for stop in stops]
        return [True] * (len(stops) - 1) + [stops[-1] in held]

    def _node_ending_at(self, along: list[Node], pos: int) -> Node:
        """The node on the matched path that ends exactly at ``pos``, splitting an edge if needed."""
        for i, node in enumerate(along):
            if node.end == pos:
                return node
            if node.start < pos < node.end:
                upper = self._split(node, pos)
                along.insert(i, upper)
                return upper
        raise AssertionError(f"position {pos} is not on the matched path")

    def _split(self, node: Node, pos: int) -> Node:
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
        self._refresh_numbers(node)
        self._refresh_numbers(upper)
        return upper

    def _set_ckpt(self, node: Node, result: InsertResult) -> None:
        if node.ckpt:
            return
        node.ckpt = True
        self._refresh_numbers(node)
        self.last_access[node.slot] = self.now
        self.state_access[node.slot] = self._state_uses(1)
        self._account(0, self.ckpt_bytes)
        result.ssm_bytes += self.ckpt_bytes
        result.ckpts += 1

    # ------------------------------------------------------------------ eviction
    def evict(self, need: float, policy: EvictionPolicy) -> tuple[int, int]:
        """Evict until ``need`` bytes are free or nothing can go (:func:`simlab.cache.evictor.evict`);
        returns (bytes freed, nodes evicted)."""
        return evictor.evict(self, need, policy)

    def next_victim(self, policy: EvictionPolicy) -> Node | None:
        """The candidate ``policy`` would evict next (:func:`simlab.cache.evictor.next_victim`)."""
        return evictor.next_victim(self, policy)

    def candidates(self, inner: bool) -> np.ndarray:
        """Slots of unpinned nodes that may be evicted: leaves, plus one-child nodes if ``inner``."""
        if self.host is not None:
            return tiers.candidates(self, inner)
        kids, pins = self.n_children, self.pins
        # counts are >= 0: a leaf is unpinned exactly when the bitwise or of the two is 0
        ok = (pins == 0) & (kids <= 1) if inner else (kids | pins) == 0
        mask = self.alive & ok
        mask[self.root.slot] = False
        return mask.nonzero()[0]

    def _is_candidate(self, node: Node, inner: bool) -> bool:
        if self.host is not None:
            return tiers.is_candidate(self, node, inner)
        if node is self.root or self.pins[node.slot] > 0:
            return False
        kids = len(node.children)
        return kids == 0 or (inner and kids == 1)

    def node_at(self, slot: int) -> Node:
        """The live node at ``slot`` (slots come from :meth:`candidates`)."""
        node = self._by_slot[slot]
        assert node is not None, slot
        return node

    def _evict_node(self, node: Node) -> int:
        """Delete a leaf, or merge a one-child node into its child (its KV moves down)."""
        assert self.pins[node.slot] == 0 and node is not self.root and node.parent is not None
        if self.host is not None and self.n_children[node.slot] == 0:
            return tiers.write_back(self, node)  # no GPU child: it goes to the host
        if not node.children:
            return self._drop_leaf(node)
        parent = node.parent
        (child,) = node.children.values()
        child.tokens = np.concatenate((node.tokens, child.tokens))
        child.key = None
        child.start = node.start
        self.last_access[child.slot] = max(
            self.last_access[child.slot], self.last_access[node.slot]
        )
        self._attach(parent, child)
        self._refresh_numbers(child)
        freed_ckpt = self.ckpt_bytes if node.ckpt else 0
        self.ssm_bytes -= freed_ckpt
        self._release(node)
        return freed_ckpt

    def drop_state(self, node: Node) -> int:
        """Free an inner node's SSM state and keep its KV (SGLang's tombstone); the node may
        be pinned as an ancestor, not itself (:meth:`state_pinned`)."""
        assert node.ckpt and not self.state_pinned(node), node
        node.ckpt = False
        self._refresh_numbers(node)
        self.ssm_bytes -= self.ckpt_bytes
        return self.ckpt_bytes

    def _drop_leaf(self, node: Node) -> int:
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
        self._release(node)
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

    # ------------------------------------------------------------------ inspection
    def nodes(self) -> Iterator[Node]:
        """All non-root nodes, depth first."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_invariants(self) -> None:
        """Assert the structural and accounting invariants (for tests; O(tree))."""
        kv = ssm = 0
        for node in self.nodes():
            assert node.end > node.start, node
            assert node.parent is not None and node.parent.end == node.start, node
            assert (self.starts[node.slot], self.ends[node.slot]) == (node.start, node.end), node
            assert node.parent.children[int(node.tokens[0])] is node, node
            kids = len(node.children) if self.host is None else tiers.gpu_kids(self, node)
            assert self.n_children[node.slot] == kids, node
            assert 0 <= node.short < self.unit and not (node.short and node.children), node
            if not self.on_host[node.slot]:
                kv += self.edge_kv(node)
                ssm += self.ckpt_bytes if node.ckpt else 0
            if self.pins[node.slot] > 0 and node.parent is not self.root:
                assert self.pins[node.parent.slot] >= self.pins[node.slot], node
        assert (kv, ssm) == (self.kv_bytes, self.ssm_bytes), (
            kv,
            ssm,
            self.kv_bytes,
            self.ssm_bytes,
        )
        if self.ssm_capacity is None:
            assert (
                self.used_bytes <= self.capacity
                or math.isinf(self.capacity)
                or self.semantics.reference_insert  # inserts whatever the capacity
            )
        else:
            assert self.kv_bytes <= self.capacity and self.ssm_bytes <= self.ssm_capacity
        if self.host is not None:
            tiers.check(self)
