"""The plug-in contract: admission (which SSM checkpoints to take) and eviction (what goes first).

A policy is a small object behind one of these classes and never owns the tree: the cache
(:class:`simlab.cache.prefix.PrefixCache`) owns nodes, bytes, pins and evict-until-fits, and shows a
policy only what :class:`CacheView` lists. Adding a policy touches two files: its module and its
``configs/admission|eviction/*.yaml`` (``_target_``), which the contract tests read.

Every hook an engine or the cache calls is declared here, with a no-op default, so a policy
overrides only what it needs and nothing is probed with ``getattr``:

* ``prepare(requests)``: once per run, before the first request, with the whole request sequence
  in processing order (a clairvoyant bound reads the future from it);
* ``on_hit(cache, lookup)``: a request's input was matched (recency bookkeeping);
* ``on_admit(cache, nodes)``: the cache created ``nodes`` (an admission's new tail, or the upper
  half of a split edge);
* ``on_evict(cache, nodes)``: the cache evicted ``nodes`` (or merged a one-child node into its
  child); emitted by every eviction path, after the nodes left the tree, before their slots are
  reused;
* ``observe(cache, request, admitted)``: a request's sequence was admitted (after ``on_evict``);
* ``summary()``: extra items for the policy's entry in ``summary.json``;
* ``set_alpha(alpha)`` (:class:`Tunable`): the weight an alpha tuner (``simlab.engines.tuning``) sets.

A plug-in also declares what can serve it, never named by its class: an eviction its ``order``
(:data:`ORDERS`), an admission its ``kind`` (:data:`KINDS`) and whether vLLM's block pool models
it (``pools_blocks``), both their switches under each ``policy.compat`` preset
(``reference_switches``). The route table (``simlab.run.routes``) picks a run's code path from
these alone, so a renamed or subclassed plug-in keeps its fast paths by declaring them.

This module imports nothing from ``simlab`` at run time: the simulator depends on the contract,
never the other way round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from simlab.cache.units import Tokens, in_units, token_fields

if TYPE_CHECKING:
    from simlab.cache.prefix import InsertResult, Lookup, Node
    from simlab.cache.state_pool import StatePool
    from simlab.model.spec import ModelSpec
    from traces.format import Request


class CacheView(Protocol):
    """What a policy may read of the cache (and the one thing it may do: :meth:`touch`).

    Per-node arrays are indexed by ``node.slot``; a slot is reused after its node is evicted, so
    per-slot state a policy keeps is validated by ``nids[slot]``.
    """

    model: ModelSpec
    now: float  # the engine's logical clock (one tick per request)
    hybrid: bool
    page_size: int
    unit: int  # tokens per id
    kv_per_token: int  # KV bytes per id
    ckpt_bytes: int  # bytes of one SSM checkpoint (0 for a pure Transformer)
    root: Node
    last_access: np.ndarray  # clock of the last touch (or creation)
    nids: np.ndarray  # creation id of the node in each slot
    alive: np.ndarray  # bool: the slot holds a node
    pins: np.ndarray  # in-flight requests using the node
    n_children: np.ndarray
    node_bytes: np.ndarray  # KV of the node's edge plus its checkpoint
    saved_flops: np.ndarray  # FLOPs that reusing the node saves beyond its parent
    starts: np.ndarray  # token position where the node's edge starts (``Node.start``)
    ends: np.ndarray  # ... and ends (``Node.end``)

    def touch(self, nodes: Sequence[Node]) -> None: ...

    def node_at(self, slot: int) -> Node: ...


@dataclass(frozen=True, slots=True)
class Tracking:
    """How an engine that tracks a hybrid's states as it runs places them (SGLang's
    ``extra_buffer``, ``schedule_batch.py`` ``_mamba_radix_cache_v2_req_prepare_for_extend``
    and ``prepare_for_decode``): positions in ids, which must be tokens.

    A prefill extend of positions ``[start, end)`` (a whole prompt, or one chunk of it) tracks
    one state when it runs ``grid`` tokens or more: at ``start + floor((end - start) / grid) *
    grid``, on the grid counted from the extend's start, not from 0; or at ``branch`` (where the
    input's KV match branches off inside a node, on the absolute grid) when that lies inside the
    extend on the same relative grid. A decode step tracks one when the sequence it leaves is a
    multiple of ``every``. Invariant: a tracked state lies inside what its extend or decode
    steps computed."""

    grid: int
    every: int
    branch: int = 0  # 0: the match branches nowhere worth a state

    def extend(self, start: int, end: int) -> int | None:
        """The state a prefill extend of ``[start, end)`` tracks, or None."""
        length = end - start
        if length < self.grid:
            return None
        branch = self.branch
        if start < branch < end and (branch - start) % self.grid == 0:
            return branch
        return start + length // self.grid * self.grid

    def decode(self, start: int, end: int) -> int | None:
        """The last state decode steps track as the sequence grows from ``start`` to ``end``
        ids (each step leaves one more), or None."""
        last = end // self.every * self.every
        return last if last > start else None


@dataclass(frozen=True, slots=True)
class Admission:
    """What a request leaves in the cache. ``ckpts``: SSM checkpoint positions (1..end, sorted;
    ignored for a pure Transformer); ``end``: how many ids of the sequence to admit; ``cuts``:
    positions that become node boundaries without a state (a production radix tree splits its
    nodes where a request's match, prompt and committed sequence end, so eviction frees a
    request's output before its prompt); ``held_from``: when set, the running request holds
    every id of its sequence from this position on (a production engine allocates all of them:
    those the tree already holds are duplicates, and a block pool's partial tail block is never
    cached), so eviction makes room for all of them, not only for the admitted tail;
    ``publishes_prompt``: the prompt's KV (and its states) enter the cache when the prefill
    ends, not when the request finishes (SGLang's ``checkpoint_kv_cache``; vLLM caches each
    block once it is computed), so a timed engine's later requests can hit it while this one
    still decodes."""

    ckpts: list[int]
    end: int
    cuts: Sequence[int] = ()
    held_from: int | None = None
    stateless_kv: bool = False  # hybrids: KV past the last checkpoint is cached too (vLLM)
    publishes_prompt: bool = False
    #: hybrids: a state is also taken where the admitted sequence branches off inside an
    #: existing edge, found when it is inserted (the Marconi reference code's
    #: ``_insert_helper`` split), instead of a branch point planned from the input's match
    branch_at_insert: bool = False
    #: hybrids: a prompt the step's budget cuts into chunks publishes a state at each chunk's
    #: end with the KV computed so far (SGLang's ``no_buffer``: the chunked request's
    #: ``cache_unfinished_req`` copies its running state into the tree)
    chunk_states: bool = False
    #: hybrids: the engine tracks states as its extends and decode steps run (SGLang's
    #: ``extra_buffer``); ``ckpts`` then holds those of one whole-prompt extend and undisturbed
    #: decoding, and a timed engine that cuts the prompt into chunks or mixes decode steps into
    #: them replaces them as it runs (:meth:`simlab.engines.step.RequestStep.track_extend`)
    tracking: Tracking | None = None
    #: the engine's eviction keeps a KV page free beyond the running request's allocation
    #: (SGLang's paged allocator: an extend asks for one page more than its tokens, a decode
    #: step for one free page before it takes one; :meth:`simlab.engines.step.RequestStep.spare_ids`)
    spare_page: bool = False


CLOCKS = ("request", "operation")


@dataclass(frozen=True, slots=True)
class Semantics:
    """How the cache runs a request where the Marconi reference code (github
    ``ruipeterpan/marconi``, ``radix_cache_hybrid.py``; ``../shared/notes/marconi_reference.md``)
    differs from simlab. The defaults are simlab's (the paper's text); ``policy.compat=reference``
    (:mod:`simlab.run.compat`) sets all of them to the reference's.

    ``clock``: ``request``, the logical clock ticks once per request; ``operation``, it ticks on
    every cache operation as the reference's ``logical_ts`` does (the match, the insertion, the
    insertion's speculative match, an eviction: 3-4 per request). ``pin_insert``: an insertion
    pins the path it matched while it evicts (the reference pins nothing, so an eviction may
    take a node of the request's own path; off only with ``reference_insert``). ``reference_insert``: the insertion sizes its
    eviction with the reference's estimate (one SSM state, two when the sequence diverges
    inside an edge, plus the KV past the longest match), evicts that many bytes as the policy
    counts them, then inserts regardless of capacity (the tree may exceed it), checkpointing
    where the whole sequence branches off inside an edge (``_insert_helper``'s split), not where
    the input does. ``whole_input_hit``: a hit may cover the whole input (the reference credits
    every fully matched node), not at most ``len(input) - 1`` tokens. ``partial_descent`` (a
    bug of the reference, ``_match_prefix_helper`` lines 360-362): after a mismatch inside an
    edge, the match goes on into that node's children with the rest of the input, and credits
    the ones it matches whole as reusable although they are not on the input's prefix.
    ``block_estimate`` (with ``reference_insert``; 0: off): the reference vLLM+'s estimate
    instead (``radix_cache_vllm.py`` ``insert``): the sequence's tokens past ``block_estimate``
    times (the whole blocks matched + 1, the root counted as a node), plus one state per
    ``block_estimate`` of them.
    """

    clock: str = "request"
    pin_insert: bool = True
    reference_insert: bool = False
    whole_input_hit: bool = False
    partial_descent: bool = False
    block_estimate: int = 0

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"policy.semantics.clock must be one of {CLOCKS}, got {self.clock!r}")
        if not self.pin_insert and not self.reference_insert:
            raise ValueError(
                "policy.semantics.pin_insert=false needs reference_insert=true (only the "
                "reference's insertion walks the tree again after evicting)"
            )
        block = self.block_estimate
        if isinstance(block, bool) or not isinstance(block, int) or block < 0:
            raise ValueError(f"policy.semantics.block_estimate must be an int >= 0, got {block!r}")
        if block and not self.reference_insert:
            raise ValueError("policy.semantics.block_estimate needs reference_insert=true")
        for name in ("pin_insert", "reference_insert", "whole_input_hit", "partial_descent"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"policy.semantics.{name} must be true or false, got {getattr(self, name)!r}"
                )

    @property
    def ticks_per_operation(self) -> bool:
        return self.clock == "operation"


@dataclass(frozen=True, slots=True)
class Keys:
    """How requests are keyed in the cache (``simlab.cache.keys`` builds the keys).

    ``block_size``: None, the radix tree is keyed by token (by id, for hash-id traces); an
    integer B, by blocks of B ids, each identified by its content under its parent (vLLM's hash
    chain), one node per block, only full blocks cached; with ``radix`` a node spans any number
    of blocks, split only where requests part or end (SGLang's paged radix tree, whose keys
    compare page by page). ``committed``: the sequence a request
    leaves is ``input + output - 1`` tokens (a production engine never feeds back the last
    sampled token, so its KV and state are never computed), not ``input + output``.
    ``whole_last_id`` (blocks, hash-id traces): a prompt's last id counts as a whole block even
    when it holds fewer tokens than its block (kvcache-simulator's rule: an id is a block);
    by default it is the partial block it is, held while the request runs and never cached
    (vLLM hashes full blocks only).
    """

    block_size: int | None = None
    committed: bool = False
    whole_last_id: bool = False
    radix: bool = False


#: Eviction orders a plug-in may declare (:attr:`EvictionPolicy.order`): ``recency``, leaves by
#: last access, a hit refreshing its matched path (``policies.lru``); ``sglang_recency``, the same
#: with SGLang's refreshes; ``free_queue``, vLLM's free queue (a hit refreshes its hit chain);
#: ``fifo``, leaves by admission; ``next_use``, Belady's farthest next use on whole ids;
#: ``flop_aware``, Marconi's utility with the paper's terms; ``custom``, anything else.
ORDERS = ("recency", "sglang_recency", "free_queue", "fifo", "next_use", "flop_aware", "custom")
#: The orders that rank leaves by their last access alone.
RECENCY_ORDERS = ("recency", "sglang_recency", "free_queue")
#: Admission kinds a plug-in may declare (:attr:`AdmissionPolicy.kind`): ``judicious``,
#: Marconi's on its input, unpaged; ``fine_grained``, a state every block (vLLM+); ``blocks``,
#: every full block of the sequence, one node per block; ``custom``, anything else.
KINDS = ("judicious", "fine_grained", "blocks", "custom")
#: A plug-in's switches under each ``policy.compat`` preset: preset -> field -> value.
Switches = dict[str, dict[str, Any]]


class AdmissionPolicy:
    """Decides which SSM states of a request are checkpointed into the cache (subclasses are
    dataclasses; their :data:`Tokens` fields are converted to the trace's units)."""

    #: its fields under each ``policy.compat`` preset (the Marconi reference code's counterpart)
    reference_switches: ClassVar[Switches] = {}

    @property
    def kind(self) -> str:
        """What the admission checkpoints, as the fast paths know it (:data:`KINDS`)."""
        return "custom"

    def pools_blocks(self, hybrid: bool) -> bool:
        """Whether vLLM's block pool (``simlab.engines.block_pool``) models this admission, on
        a hybrid or on a Transformer (where the engine runs one)."""
        return False

    def pool_only(self, hybrid: bool) -> str | None:
        """Why a run must take vLLM's pool (a setting only it models: an error naming the key
        on any other route); None: any route."""
        return None

    def hit_grid(self) -> int | None:
        """The finest grid its hits land on, in its keys' units (None: its keys' block)."""
        return None

    def caveats(self, hybrid: bool) -> tuple[str, ...]:
        """One line per setting that disables reuse (logged; ``summary.json``'s ``caveats``)."""
        return ()

    def tree_caveats(self, hybrid: bool) -> tuple[str, ...]:
        """:meth:`caveats` of settings that only vLLM's pool models, when the tree runs it."""
        return ()

    def engine_model(self, model: ModelSpec) -> ModelSpec:
        """``model`` as the emulated engine keeps it (its state dtypes); most keep it as is."""
        return model

    def state_pool(self, model: ModelSpec, capacity_bytes: float) -> StatePool | None:
        """The engine's split of a hybrid's cache when ``cache.ssm_gb`` is unset (None: shared)."""
        return None

    def geometry(self, model: ModelSpec, unit: int, pool: StatePool | None) -> dict[str, Any]:
        """The engine's cache layout for ``model`` (``summary.json``'s ``engine_geometry``)."""
        return {}

    @classmethod
    def reference_semantics(cls, options: Any) -> dict[str, Any]:
        """Cache semantics its reference counterpart sets over a preset's (``options``: keys)."""
        return {}

    #: a request's match splits the node it stops inside (at most ``len(input) - 1`` ids in)
    #: when it starts, not when it is admitted (SGLang's ``_split_node`` in the match; the
    #: eviction policy's ``on_hit`` sees the lower half as ``Lookup.split``): its own
    #: allocation may then evict the unmatched half alone
    splits_at_match: bool = False

    @property
    def page_size(self) -> int:
        """KV paging granularity this admission implies; Transformer hits round down to it."""
        return 1

    @property
    def allocates_pages(self) -> bool:
        """Whether the engine hands a running request its KV a page (one key of the cache) at a
        time, its partial last page held whole (SGLang's ``PagedTokenToKVPoolAllocator``);
        False: token by token."""
        return False

    @property
    def running_state_slots(self) -> int:
        """State slots a running request of a hybrid holds outside the tree, in a separate SSM
        pool (:meth:`state_pool`): SGLang's request Mamba slot."""
        return 1

    @property
    def slots_per_running_request(self) -> int:
        """Mamba slots per running request that cap the running requests (``slots // this``;
        SGLang's ``resolve_max_num_reqs``): its own, its locked hit's and its prompt's states."""
        return self.running_state_slots + 2

    @property
    def keys(self) -> Keys:
        """How the requests are keyed in the cache (tokens, input + output, by default)."""
        return Keys()

    def for_model(self, model: ModelSpec, unit_tokens: int = 1) -> AdmissionPolicy:
        """This admission as configured for ``model`` (ids of ``unit_tokens`` tokens); most
        admissions do not depend on the model."""
        return self

    def paged(self, page: int, model: ModelSpec) -> AdmissionPolicy:
        """This admission on a KV pool of ``page``-id pages (``cache.page_size``) when it keys
        the tree by pages itself (its :attr:`keys` then name the block size); most admissions
        keep token keys and round their hits down to the page."""
        return self

    def states_per_checkpoint(self, unit_tokens: int) -> int:
        """SSM states one checkpoint holds on a trace of ids of ``unit_tokens`` tokens, asked in
        tokens (before :func:`in_units`): 1, but for an admission that checkpoints finer than
        an id, whose every id then holds its states inside it too (never hit, but held: the
        memory they take is the point of the paper's vLLM+)."""
        return 1

    def prepare(self, requests: Sequence[Request]) -> None:
        """Called once with every request, in processing order, before the first."""

    def plan(self, lookup: Lookup, input_len: int, seq_len: int) -> Admission:
        """Checkpoints for a request whose input matched ``lookup`` and whose full sequence
        (input + output) has ``seq_len`` tokens. Positions <= input_len are taken during
        prefill, the others at the end of decoding."""
        raise NotImplementedError


class EvictionPolicy:
    """Scores a candidate set; the cache evicts the lowest score and goes on until it fits.

    ``evicts_inner_nodes``: False, only leaves are candidates; True, nodes with at most one
    child too (evicting one merges its KV into the child and frees its checkpoint).

    ``scores_depend_on_candidates``: True when a node's score depends on the other candidates
    (e.g. min-max normalisation); the cache then re-scores the whole set after every eviction.
    False promises static scores: a node's score changes only when it is hit, admitted into or
    split, never because other nodes (its only child included) are evicted; the cache then
    keeps a heap and scores a chain of one-child ancestors in one call (checked against full
    re-scoring in ``tests/test_policies.py`` for every shipped policy).
    """

    evicts_inner_nodes: bool = False
    scores_depend_on_candidates: bool = False
    #: True: an insertion refreshes (``touch``) every node its walk passes, the one it stops
    #: inside included (SGLang's ``_insert_helper``); False: only ``on_hit`` refreshes.
    refreshes_insert_path: bool = False
    #: True: an insertion ticks the clock before it walks, so what it refreshes or creates is
    #: newer than every node touched before it (SGLang stamps each access from one global
    #: counter, ``get_and_increase_time_counter``: a publish at a prefill's or a request's end
    #: is later than the step's earlier matches); False: it takes the last match's clock.
    ticks_on_insert: bool = False
    #: Which of equally scored candidates goes first: ``oldest`` (smallest creation id) or
    #: ``dfs`` (the first in depth-first pre-order, children in insertion order: the Marconi
    #: reference code's ``_collect_leaf_and_single_child_nodes`` then ``min``) or ``heap``
    #: (leaf-only policies: the depth-first leaves ``heapq``-ed by score alone, the order of
    #: the reference's SGLang+ ``evict_v1``; :func:`simlab.cache.evictor.heap_victims`).
    ties: str = "oldest"
    #: With ``Semantics.reference_insert``: the eviction loop counts a deleted leaf's KV as the
    #: last candidate's edge, not the victim's (the reference's bug at
    #: ``radix_cache_hybrid.py:555``), so it stops early or late.
    miscounts_freed_bytes: bool = False
    #: its fields under each ``policy.compat`` preset (the Marconi reference code's counterpart)
    reference_switches: ClassVar[Switches] = {}

    @property
    def order(self) -> str:
        """What orders its evictions, as the fast paths know it (:data:`ORDERS`)."""
        return "custom"

    def prepare(self, requests: Sequence[Request]) -> None:
        """Called once with every request, in processing order, before the first."""

    def on_hit(self, cache: CacheView, lookup: Lookup) -> None:
        """A request's input has been matched (before its admission is planned)."""

    def on_match(self, cache: CacheView, lookup: Lookup) -> None:
        """A queued request's input has been matched by a scheduler that tries to admit it
        (SGLang matches the queue's head on every attempt, ``init_next_round_input``): it
        refreshes the path's recency whatever the policy; no hit (the request may still wait)."""
        partial = lookup.partial
        cache.touch(lookup.path if partial is None else [*lookup.path, partial])

    def on_admit(self, cache: CacheView, nodes: Sequence[Node]) -> None:
        """The cache created ``nodes``."""

    def on_evict(self, cache: CacheView, nodes: Sequence[Node]) -> None:
        """The cache evicted (or merged away) ``nodes``; their slots are not reused yet."""

    def observe(self, cache: CacheView, request: Request, admitted: InsertResult) -> None:
        """A request's sequence has been admitted."""

    def summary(self) -> dict[str, Any]:
        """Extra items for this policy's entry in ``summary.json``."""
        return {}

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        """One score per candidate slot; the lowest is evicted first (ties: oldest node)."""
        raise NotImplementedError


@runtime_checkable
class Tunable(Protocol):
    """An eviction policy with a weight an alpha tuner may set between requests."""

    alpha: float

    def set_alpha(self, alpha: float) -> None: ...


def overrides(policy: object, hook: str, base: type) -> bool:
    """Whether ``policy`` has a ``hook`` other than ``base``'s no-op one (callers skip the
    call otherwise)."""
    method = getattr(policy, hook, None)
    return method is not None and getattr(method, "__func__", None) is not getattr(base, hook)


__all__ = [
    "KINDS",
    "ORDERS",
    "RECENCY_ORDERS",
    "Admission",
    "AdmissionPolicy",
    "CacheView",
    "EvictionPolicy",
    "Keys",
    "Semantics",
    "Switches",
    "Tokens",
    "Tunable",
    "in_units",
    "overrides",
    "token_fields",
]
