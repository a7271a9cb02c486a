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

Modules. :class:`PrefixCache` is the facade: its settings, free bytes, the hit rule's entry
points and eviction's primitives, over :class:`simlab.cache.tree.NodeTable` (the nodes, their
per-slot arrays, bytes and pins); matching is :mod:`simlab.cache.match`, admission
:mod:`simlab.cache.insertion`, evict-until-fits :mod:`simlab.cache.evictor`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from simlab.cache import evictor, insertion, match
from simlab.cache import host_tier as tiers
from simlab.cache.contract import EvictionPolicy, Semantics, overrides
from simlab.cache.nodes import InsertResult, Lookup, Node
from simlab.cache.tree import BULK_MIN_NODES, NodeTable

if TYPE_CHECKING:
    from simlab.model.spec import ModelSpec

__all__ = ["InsertResult", "Lookup", "Node", "PrefixCache"]


class PrefixCache(NodeTable):
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
        host_capacity_bytes: float | None = None,
        host_bw_bytes: float = math.inf,
        ckpt_states: int = 1,
        block_keys: bool = False,
    ):
        """``host_capacity_bytes``: a host-memory tier below the cache, at ``host_bw_bytes`` per
        second (:mod:`simlab.cache.host_tier`); None: none."""
        if not capacity_bytes > 0:
            raise ValueError(f"cache capacity must be positive, got {capacity_bytes} bytes")
        if page_size < 1 or unit_tokens < 1 or ckpt_states < 1:
            raise ValueError(
                "page_size, unit_tokens and ckpt_states must be >= 1, "
                f"got {page_size}, {unit_tokens}, {ckpt_states}"
            )
        self.hybrid = bool(model.is_hybrid)
        #: SSM states one checkpoint holds (an admission finer than a hash-id trace's id keeps
        #: its states inside the id: AdmissionPolicy.states_per_checkpoint)
        self.ckpt_states = int(ckpt_states) if self.hybrid else 1
        ckpt_bytes = int(model.ssm_state_bytes) * self.ckpt_states if self.hybrid else 0
        host = None
        if host_capacity_bytes is not None:
            host = tiers.HostTier(host_capacity_bytes, host_bw_bytes)
        super().__init__(model, int(unit_tokens), ckpt_bytes, bool(block_nodes), host)
        self.capacity = float(capacity_bytes)  # KV's bytes, and the states' unless separate
        #: None: states count against ``capacity``; else their own pool (SGLang's Mamba pool)
        self.ssm_capacity = None if ssm_capacity_bytes is None else float(ssm_capacity_bytes)
        self._states_share = self.ssm_capacity is None
        self.page_size = int(page_size)
        #: ids are whole blocks of tokens (:class:`simlab.cache.keys.BlockKeys`): a block pool's,
        #: or a radix tree keyed by pages (SGLang's ``--page-size``)
        self.block_keys = bool(block_keys) or self.block_nodes
        self.semantics = semantics or Semantics()
        #: a Transformer's token-keyed tree over ids of many tokens (hash-id traces), simlab's
        #: semantics: a short last id holds its true tokens, and the hit rule leaves one token,
        #: not one id (SGLang's radix tree over the prompt's tokens)
        self.exact_tokens = (
            self.unit > 1 and not self.hybrid and not self.block_keys and not self._reference()
        )
        whole = self.semantics.whole_input_hit or self.exact_tokens
        self.hit_slack = 0 if whole else 1  # ids a hit leaves
        self._admit_policy: EvictionPolicy | None = None  # whose ``on_admit`` override
        self._admits = False  # ... was checked: it has one
        if host is not None and (ssm_capacity_bytes is not None or self._reference()):
            raise ValueError(
                "a host tier needs simlab's own cache semantics and one shared GPU budget "
                "(no policy.compat=reference, no cache.ssm_gb)"
            )

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

    # ------------------------------------------------------------------ bytes and recency
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

    def touch(self, nodes: Sequence[Node]) -> None:
        """Mark nodes as accessed now (recency bookkeeping for eviction policies)."""
        if len(nodes) > BULK_MIN_NODES:  # a long path: one fancy-indexed assignment
            self.last_access[[node.slot for node in nodes]] = self.now
            return
        last_access, now = self.last_access, self.now
        for node in nodes:
            last_access[node.slot] = now

    def use_state(self, node: Node | None) -> None:
        """A request resumes from ``node``'s state: only that state counts as recently used
        in the SSM pool's own LRU (SGLang: a hit refreshes only the consumed Mamba node)."""
        if node is not None and node.ckpt:
            self.state_access[node.slot] = self.stamp_states(1)

    # ------------------------------------------------------------------ matching
    def lookup(
        self, tokens: np.ndarray, page_size: int | None = None, gpu_only: bool = False
    ) -> Lookup:
        """Match an input and apply the hit rule (no state change; see :meth:`touch`).
        With a host tier the match goes on through host-resident nodes; ``gpu_only`` stops it
        at the first one (the hit a request gets when its host part cannot be loaded)."""
        return match.lookup(self, tokens, page_size or self.page_size, gpu_only)

    def deepest_cached(self, tokens: np.ndarray) -> Node | None:
        """The deepest node wholly on the cached prefix of ``tokens`` (None if none)."""
        path, _matched, _partial = match.walk(self, tokens)
        return path[-1] if path else None

    def split_at_match(self, lookup: Lookup) -> Lookup:
        """``lookup`` after splitting the edge its match stops inside, when the hit ends in
        that edge (a Transformer's): the hit then lies on whole nodes, so a pin of its node
        covers none of the edge's unmatched tail (SGLang splits there when it matches,
        ``_split_node``). The split is the one an admission of the request makes anyway."""
        partial = lookup.partial
        if partial is None or lookup.hit_node is not partial:
            return lookup
        upper = self.split(partial, lookup.matched)
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
        upper = self.split(lower, pos)
        hit_node = upper if lookup.hit_node is lower else lookup.hit_node
        path = [*lookup.path[:i], upper]
        partial = lookup.partial
        if lower is not partial:
            path += lookup.path[i:]
        return Lookup(lookup.matched, lookup.hit, hit_node, path, partial, lower)

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
        (:func:`simlab.cache.insertion.insert_reference`).
        """
        if policy is not self._admit_policy:  # checked once per policy object
            self._admit_policy, self._admits = policy, overrides(policy, "on_admit", EvictionPolicy)
        self._created = [] if self._admits else None
        try:
            if self.semantics.reference_insert:
                result = insertion.insert_reference(self, seq, ckpts, end, policy, branch_at_insert)
            else:
                short = short if self.exact_tokens else 0
                result = insertion.insert(
                    self,
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

    def load_host_hit(self, lookup: Lookup, policy: EvictionPolicy) -> tuple[int, int]:
        """Host tier: load the host part of ``lookup``'s hit back to the GPU, evicting with
        ``policy`` for room (:func:`simlab.cache.host_tier.load_hit`). Returns (the hit's ids
        that came from the host, the bytes loaded): (0, 0) when the hit lies on the GPU, (0, -1)
        when the GPU cannot make room (nothing loaded)."""
        frontier = tiers.gpu_prefix(self, lookup.path, lookup.partial)
        if frontier < 0 or lookup.hit <= frontier:
            return 0, 0
        loaded = tiers.load_hit(self, lookup.hit, lookup.hit_node, policy)
        return (lookup.hit - frontier, loaded) if loaded >= 0 else (0, -1)

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

    def is_candidate(self, node: Node, inner: bool) -> bool:
        """:meth:`candidates` for one node."""
        if self.host is not None:
            return tiers.is_candidate(self, node, inner)
        if node is self.root or self.pins[node.slot] > 0:
            return False
        kids = len(node.children)
        return kids == 0 or (inner and kids == 1)

    def drop_state(self, node: Node) -> int:
        """Free an inner node's SSM state and keep its KV (SGLang's tombstone); the node may
        be pinned as an ancestor, not itself (:meth:`state_pinned`)."""
        assert node.ckpt and not self.state_pinned(node), node
        node.ckpt = False
        self.refresh(node)
        self.ssm_bytes -= self.ckpt_bytes
        return self.ckpt_bytes

    def evict_node(self, node: Node) -> int:
        """Evict an unpinned candidate: delete a leaf, or merge a one-child node into its child
        (its KV moves down); with a host tier a node without GPU children is written back.
        Returns the GPU bytes freed."""
        assert self.pins[node.slot] == 0 and node is not self.root and node.parent is not None
        if self.host is not None and self.n_children[node.slot] == 0:
            return tiers.write_back(self, node)  # no GPU child: it goes to the host
        if not node.children:
            return self.drop_leaf(node)
        return self.merge_down(node)

    # ------------------------------------------------------------------ as plain data
    def fields(self) -> dict[str, Any]:
        """:meth:`NodeTable.fields`, without the policy object inserting now (a copy is used
        by other policy objects)."""
        return super().fields() | {"_admit_policy": None, "_admits": False}

    # ------------------------------------------------------------------ inspection
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
