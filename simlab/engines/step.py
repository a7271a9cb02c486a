"""The one request step: what happens to a request against the prefix cache.

Every engine (replay, timed, offline) and the alpha tuner's window replays run a request through
:class:`RequestStep`, and nothing else sequences these calls:

* :meth:`RequestStep.start` (the request is scheduled): advance the cache's logical clock by one
  (the match; with ``Semantics.clock == "operation"`` the insertion ticks it again),
  match the input, let the eviction policy note the hit (``on_hit``), ask the admission policy
  for its checkpoints (``plan``) and pin the reused prefix;
* :meth:`RequestStep.prefilled` (the prefill ended): a plan that publishes the prompt (SGLang's
  and vLLM's rules) admits it;
* :meth:`RequestStep.finish` (the request completed): admit input + output (evicting as needed),
  release the pin, tell the eviction policy and the controllers (``observe``) and build the
  request's :class:`~simlab.engines.records.RequestRecord`, the one place a record of the prefix cache
  is made (vLLM's hybrid pool, :mod:`simlab.engines.block_pool`, makes its own, through the same
  :func:`~simlab.engines.records.request_record`).

Between the two an engine may let time pass (the timed engine prefills and decodes there); the
replay engine and the tuner call them back to back (:meth:`RequestStep.serve`). Invariants: the clock advances once per started request,
so recency is counted in requests on every engine; a started request's reused prefix stays
pinned until it finishes, so it is never evicted under it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from simlab.cache import host_tier as tiers
from simlab.cache.contract import Admission, AdmissionPolicy, EvictionPolicy, Semantics, overrides
from simlab.cache.keys import (
    BlockKeys,
    KeyedRequest,
    KeyScheme,
    TokenKeys,
    key_scheme,
    short_tokens,
)
from simlab.cache.nodes import InsertResult, Lookup, Node
from simlab.cache.prefix import PrefixCache
from simlab.config import ConfigError
from simlab.engines.records import RequestRecord, request_record

if TYPE_CHECKING:
    from simlab.model.spec import ModelSpec
from traces.format import Request


class Controller(Protocol):
    """Engine-level logic that learns from the admitted stream (e.g. ``simlab.engines.tuning``)."""

    def observe(self, step: RequestStep, request: Request, admitted: InsertResult) -> None: ...

    def summary(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class Started:
    """A request between :meth:`RequestStep.start` and :meth:`RequestStep.finish`."""

    req: Request
    seq: np.ndarray  # the ids the request allocates (:class:`simlab.cache.keys.KeyedRequest`)
    lookup: Lookup
    plan: Admission
    hit: int  # tokens whose prefill is skipped
    matched: int  # tokens of the longest cached prefix (checkpoint rule ignored)
    pinned: Node | None  # the node pinned until finish (None: nothing pinned)
    prompt: int = 0  # ids of ``seq`` the prompt fills (:meth:`RequestStep.prefilled`)
    allocated: int = 0  # ids of ``seq`` its prefill allocates (a partial block of it included)
    short: int = 0  # tokens ``seq``'s last id lacks (a hash-id prompt's short last id)
    published: InsertResult | None = None  # what the prefill published
    host_hit: int = 0  # tokens of ``hit`` loaded back from the host tier
    host_loaded: int = 0  # bytes loaded back for them (KV and states)
    pins: bool = False  # started with ``pin``: what it publishes is pinned in turn (a 0 hit too)
    refill: int = 0  # ids past ``prompt`` its prefill computes again (a recompute's outputs)
    #: a plan with ``tracking``: its prefill published the states it tracked up to here (ids)
    states_to: int = 0

    @property
    def fill(self) -> int:
        """Where its prefill ends (ids), and what it publishes then: its prompt, and the
        outputs a recomputed request computes again (SGLang's ``checkpoint`` keys the fill ids)."""
        return self.prompt + self.refill


@dataclass(slots=True)
class Timing:
    """When a timed request passed each stage (simulated seconds)."""

    arrival: float
    scheduled: float
    first_token: float
    finished: float
    prefill_time: float  # cost model: this request's uncached prefill, alone


@dataclass
class RequestStep:
    """One policy's cache, plug-ins and controllers; see the module docstring."""

    cache: PrefixCache
    admission: AdmissionPolicy
    eviction: EvictionPolicy
    policy: str
    controllers: Sequence[Controller] = field(default_factory=tuple)
    #: an engine with vLLM's block pool runs the step there (:mod:`simlab.engines.block_pool`),
    #: not on ``cache``: the route table's choice (``simlab.run.routes``)
    pool: bool = False
    _observes: bool = field(init=False, repr=False)  # the eviction policy overrides observe
    _keys: KeyScheme = field(init=False, repr=False)
    _page: int = field(init=False, repr=False)  # Transformer hits round down to it
    _ids_per_key: int = field(init=False, repr=False)  # trace ids one key stands for
    #: block keys (token keys with short ids): each prepared request's view, used (once) by
    #: its :meth:`start`
    _views: dict[int, tuple[Request, KeyedRequest]] = field(
        init=False, repr=False, default_factory=dict
    )

    @classmethod
    def build(
        cls,
        model: ModelSpec,
        capacity_bytes: float,
        admission: AdmissionPolicy,
        eviction: EvictionPolicy,
        policy: str,
        *,
        page_size: int = 1,
        unit_tokens: int = 1,
        controllers: Sequence[Controller] = (),
        ssm_capacity_bytes: float | None = None,
        semantics: Semantics | None = None,
        host_capacity_bytes: float | None = None,
        host_bw_bytes: float | None = None,
        ckpt_states: int = 1,
    ) -> RequestStep:
        """A step on a fresh cache shaped for the admission's keys (``page_size`` in ids): a
        block-keyed cache counts one id per block, which is its page, one node per block.
        ``ssm_capacity_bytes``: SSM states in a pool of their own (``capacity_bytes`` is then
        KV's). ``semantics``: where the cache follows the Marconi reference code
        (:class:`simlab.cache.contract.Semantics`; default simlab's). ``host_capacity_bytes``: a
        host-memory tier below the cache, at ``host_bw_bytes`` per second
        (:mod:`simlab.cache.host_tier`). ``ckpt_states``: SSM states one checkpoint holds
        (:meth:`simlab.cache.contract.AdmissionPolicy.states_per_checkpoint`)."""
        host = None
        if host_capacity_bytes is not None:
            host = host_tier(host_capacity_bytes, host_bw_bytes, eviction, semantics)
        if ssm_capacity_bytes is not None and semantics is not None and semantics.reference_insert:
            raise ConfigError(
                "cache.ssm_gb: a separate SSM pool is not supported with the Marconi reference "
                "code's insertion (policy.compat=reference / reference_fixed, "
                "policy.semantics.reference_insert): it sizes evictions on one budget"
            )
        admission = admission.for_model(model, unit_tokens)
        block = admission.keys.block_size
        shape = (page_size, unit_tokens) if block is None else (1, unit_tokens * block)
        cache = PrefixCache(
            model,
            capacity_bytes,
            *shape,
            block_nodes=block is not None and not admission.keys.radix,
            block_keys=block is not None,
            ssm_capacity_bytes=ssm_capacity_bytes,
            semantics=semantics,
            host=host,
            ckpt_states=ckpt_states,
        )
        return cls(cache, admission, eviction, policy, tuple(controllers))

    def __post_init__(self) -> None:
        self._observes = overrides(self.eviction, "observe", EvictionPolicy)
        self._keys = key_scheme(self.admission.keys)
        self._ids_per_key = self._keys.block_size if isinstance(self._keys, BlockKeys) else 1
        self._page = math.lcm(self.cache.page_size, self.admission.page_size)

    @property
    def page_size(self) -> int:
        """KV page of this step, in ids: the cache's and the admission's (their lcm)."""
        return self._page

    def prepare(self, requests: Sequence[Request]) -> None:
        """Show the plug-ins the whole run (processing order), before the first request; with
        block keys (or a hash-id prompt's short last id) they see each request's keyed input
        (``input_ids``) instead of its tokens."""
        if isinstance(self._keys, BlockKeys) or any(map(short_tokens, requests)):
            views = [self._keys.view(r) for r in requests]
            self._views = {id(r): (r, v) for r, v in zip(requests, views, strict=True)}
            requests = [
                replace(r, input_ids=v.lookup) for r, v in zip(requests, views, strict=True)
            ]
        self.admission.prepare(requests)
        self.eviction.prepare(requests)

    def serve(self, req: Request) -> RequestRecord:
        """:meth:`start`, :meth:`prefilled` and :meth:`finish` back to back (the replay engine,
        the tuner's window replays): a plan that publishes the prompt admits it first, then the
        whole sequence, as the timed engine does (so at low load both make the same evictions).
        Nothing can happen in between, so the reused prefix is not pinned on its own: each
        insertion pins its matched path while it evicts, which protects the same nodes (the hit
        node is on that path)."""
        started = self.start(req, pin=False)
        self.prefilled(started)
        return self.finish(started)

    def start(self, req: Request, pin: bool = True, refill: int = 0) -> Started:
        """The request is scheduled: tick, match, ``on_hit``, plan, pin the reused prefix (an
        edge the hit ends in is split at the match first: see ``PrefixCache.split_at_match``).
        ``refill``: a recomputed request's sampled outputs, prefilled again with its prompt
        (matched and published with it where :meth:`_fill` says)."""
        cache = self.cache
        keyed = self._view(req)
        ids, refill = self._fill(keyed.lookup, req, refill)
        lookup = self._match(ids)
        host_ids = loaded = 0
        if cache.host is not None:
            lookup, host_ids, loaded = self._load_host_hit(keyed.lookup, lookup)
        if cache.hybrid:
            cache.use_state(lookup.hit_node)
        self.eviction.on_hit(cache, lookup)
        plan = self.admission.plan(lookup, int(keyed.lookup.shape[0]), keyed.cacheable)
        pinned = None
        if pin:  # the pin covers the matched part of a partly matched edge only
            lookup = cache.split_at_match(lookup)
            pinned = lookup.hit_node
            if pinned is not None:
                cache.pin(pinned)
        per_key = self._ids_per_key
        hit = self._hit_tokens(req, lookup.hit * per_key, refill)
        started = Started(
            req,
            keyed.sequence,
            lookup,
            plan,
            hit,
            req.hit_tokens(lookup.matched * per_key),
            pinned,
            keyed.prompt,
            int(keyed.lookup.shape[0]),
            keyed.short,
        )
        started.pins, started.refill = pin, self._refill_ids(req, keyed.prompt, refill)
        if host_ids:
            started.host_hit = hit - self._hit_tokens(req, (lookup.hit - host_ids) * per_key)
            started.host_loaded = loaded
        return started

    def _match(self, ids: np.ndarray, slack: int = 1) -> Lookup:
        """Tick the clock and match ``ids``; the engine's match splits the node it stops
        inside (``splits_at_match``), the match limited to ``len(ids) - slack`` ids."""
        cache = self.cache
        cache.now += 1.0
        lookup = cache.lookup(ids, self._page)
        if self.admission.splits_at_match:
            lookup = cache.split_match(lookup, int(ids.shape[0]) - slack)
        return lookup

    def match_queued(self, req: Request, refill: int = 0) -> tuple[int, Node | None]:
        """A scheduler matches queued ``req`` as it tries to admit it (SGLang's
        ``init_next_round_input``, on every attempt): the clock ticks, the match splits the
        node it stops inside and refreshes the path (``on_match``), so a waiting request's
        prefix stays recent. Returns :meth:`peek_hit`'s pair; no pin, no hit counted. With a
        host tier the match is read-only (:meth:`peek_hit`): its load happens at start."""
        if self.cache.host is not None:
            return self.peek_hit(req)
        ids, refill = self._fill(self._keys.lookup_ids(req), req, refill)
        lookup = self._queued_match(ids)
        return self._hit_tokens(req, lookup.hit * self._ids_per_key, refill), lookup.hit_node

    def touch_queued(self, req: Request, refill: int = 0) -> None:
        """SGLang's periodic refresh of a queued request's prefix (``touch_waiting_prefix``):
        its whole input is matched, the node the match stops inside split there and the path
        refreshed (``on_match``); nothing else changes. A no-op with a host tier."""
        if self.cache.host is None:
            self._queued_match(self._fill(self._keys.lookup_ids(req), req, refill)[0], slack=0)

    def _fill(self, ids: np.ndarray, req: Request, refill: int) -> tuple[np.ndarray, int]:
        """The ids a request is matched with and the outputs among them: ``ids`` (its
        prompt's lookup) followed by the ``refill`` outputs a recomputed request prefills again,
        on a tree of tokens (SGLang keys a retracted request by its fill ids,
        ``origin_input_ids + output_ids``, as it matches, refreshes and publishes it; a hybrid's
        publish keeps the state at the fill's end, :meth:`_prefill_states`); elsewhere the
        prompt's alone."""
        cache = self.cache
        if refill <= 0:
            return ids, 0
        if self._pages_of_tokens:  # the fill ids' pages (``RadixKey.page_aligned``)
            assert isinstance(self._keys, BlockKeys)
            return self._keys.lookup_ids(req, refill), refill
        if not (isinstance(self._keys, TokenKeys) and cache.unit == 1):
            return ids, 0
        return np.concatenate((ids, req.output_ids[:refill])), refill

    def _refill_ids(self, req: Request, prompt: int, refill: int) -> int:
        """Ids of the sequence past its ``prompt`` ids that a recompute's ``refill`` outputs
        fill: the outputs themselves on a tree of tokens; on a tree of pages, the full pages
        the input and those outputs make past the prompt's (what its publish caches)."""
        if refill <= 0 or not self._pages_of_tokens:
            return refill
        return (req.input_len + refill) // self._ids_per_key - prompt

    def _queued_match(self, ids: np.ndarray, slack: int = 1) -> Lookup:
        """A queued request's match (:meth:`match_queued`, :meth:`touch_queued`): the path
        refreshed (``on_match``) and, on a hybrid, the state it would resume from too (SGLang's
        ``MATCH_END`` refresh puts the best match's Mamba value at the front of the Mamba LRU
        on every match, not only on an admitted one)."""
        lookup = self._match(ids, slack)
        if self.cache.hybrid:
            self.cache.use_state(lookup.hit_node)
        self.eviction.on_match(self.cache, lookup)
        return lookup

    def _hit_tokens(self, req: Request, ids: int, refill: int = 0) -> int:
        """Tokens a hit of ``ids`` trace ids reuses: with ``cache.exact_tokens`` (ids of many
        tokens, a Transformer's token-keyed tree) the hit rule leaves one token, as SGLang's
        radix tree over the prompt's tokens does, not one id. With ``refill`` (ids are tokens)
        the hit may run into the recomputed outputs, up to the last one."""
        if refill > 0:
            return min(ids, req.input_tokens + refill - 1)
        tokens = req.hit_tokens(ids)
        return min(tokens, req.input_tokens - 1) if self.cache.exact_tokens else tokens

    def _load_host_hit(self, ids: np.ndarray, lookup: Lookup) -> tuple[Lookup, int, int]:
        """Host tier: load the host part of ``lookup``'s hit back to the GPU
        (:func:`simlab.cache.host_tier.load_hit`). Returns the lookup after the load, the hit's ids that
        came from the host and the bytes loaded; when the GPU cannot make room, the lookup of
        the GPU part alone and no host hit."""
        cache = self.cache
        frontier = tiers.gpu_prefix(cache, lookup.path, lookup.partial)
        if frontier < 0 or lookup.hit <= frontier:
            return lookup, 0, 0  # the hit lies on the GPU
        loaded = tiers.load_hit(cache, lookup.hit, lookup.hit_node, self.eviction)
        if loaded < 0:
            return cache.lookup(ids, self._page, gpu_only=True), 0, 0
        after = cache.lookup(ids, self._page)  # the load may have split the hit's node
        assert after.hit == lookup.hit, (after.hit, lookup.hit)
        return after, lookup.hit - frontier, loaded

    def _view(self, req: Request) -> KeyedRequest:
        """``req`` as the cache sees it: the view :meth:`prepare` made, the first time (block
        ids depend on content only, so a fresh view would differ only in the partial tail
        block's id, which matches nothing and is never cached), else a fresh one."""
        if self._views:
            entry = self._views.pop(id(req), None)
            if entry is not None and entry[0] is req:
                return entry[1]
        return self._keys.view(req)

    def peek(self, req: Request) -> tuple[int, int]:
        """``(matched, hit)`` tokens ``req`` would get if it started now, read-only: no clock
        tick, no ``on_hit``, no pin, no key assigned (a router's view of this cache; the
        cache's and the plug-ins' state are unchanged)."""
        ids = self._keys.lookup_ids(req)
        lookup = self.cache.lookup(ids, self._page)
        per_key = self._ids_per_key
        return req.hit_tokens(lookup.matched * per_key), self._hit_tokens(req, lookup.hit * per_key)

    def peek_hit(self, req: Request) -> tuple[int, Node | None]:
        """:meth:`peek`'s hit tokens and the node holding the reused prefix (None: no hit),
        read-only (a shared KV pool pins the node while it evicts to admit ``req``)."""
        lookup = self.cache.lookup(self._keys.lookup_ids(req), self._page)
        return self._hit_tokens(req, lookup.hit * self._ids_per_key), lookup.hit_node

    def admission_bytes(self, req: Request) -> int:
        """Bytes admitting ``req``'s input would take in a cache holding none of it: the KV of
        the ids the plan admits plus its planned SSM states (an upper bound when the cache
        already holds part of it). Read-only: plans are pure and no key is assigned."""
        n = int(self._keys.lookup_ids(req).shape[0])
        plan = self.admission.plan(Lookup(0, 0, None, [], None), n, n)
        end = min(plan.end, n)
        cache = self.cache
        states = sum(1 for c in set(plan.ckpts) if 0 < c <= end) if cache.hybrid else 0
        return end * cache.kv_per_token + states * cache.ckpt_bytes

    def abort(self, started: Started) -> None:
        """The started request was preempted (recompute): release its pin; nothing is
        admitted and nothing observed (it starts again later, with a fresh :meth:`start`)."""
        if started.pinned is not None:
            self.cache.unpin(started.pinned)
            started.pinned = None

    def prefilled(self, started: Started, keep_room: bool = True) -> None:
        """The request's prefill ended (timed engines; the replay calls it right after
        :meth:`start`). A plan that ``publishes_prompt`` admits the prompt now, so requests
        scheduled from now on can hit it, and the request's pin moves to the published prompt
        (SGLang moves its lock there). ``keep_room``: the publish first makes room in the cache
        for the request's whole allocation (``held_from``: every id past its hit, and with a
        separate SSM pool a state slot of its own), as the engines allocate it when the request
        starts; False when the engine counts running requests' memory itself (the timed
        engine's shared KV pool). A plan with ``tracking`` publishes only the states its
        extends tracked since its last publish, KV up to the last, and nothing (no walk, no
        refresh) when they tracked none (SGLang's ``cache_len`` 0)."""
        plan, cache = started.plan, self.cache
        if not plan.publishes_prompt or started.prompt <= 0:
            return
        seq, held_from = started.seq, None
        end, ckpts = started.fill, self._prefill_states(started)
        if plan.tracking is not None:  # the states its extends tracked, not yet published
            ckpts = [c for c in ckpts if c > started.states_to]
            end = started.states_to = max(ckpts, default=0)
        if keep_room and plan.held_from is not None:
            seq, held_from = seq[: started.allocated], plan.held_from
        published = started.published  # what a chunked prefill published between chunks
        started.published = cache.insert(
            seq,
            ckpts,
            end,
            self.eviction,
            cuts=self._publish_cuts(started, end),
            held_from=held_from,
            stateless_kv=plan.stateless_kv,
            short=started.short,
            running_states=self.admission.running_state_slots if held_from is not None else 0,
            spare=self.spare_ids(started, decoding=False),
        )
        if published is not None:
            started.published = merged(published, started.published)
        if plan.held_from is not None:  # the published prompt's slots are the tree's now
            started.plan = replace(plan, held_from=self._held_after_publish(started))
        if started.pins and end > 0:
            self._move_pin(
                started, self._published_node(started.seq, end // self._page * self._page)
            )

    def _published_node(self, seq: np.ndarray, ids: int) -> Node | None:
        """The deepest node on the cached prefix of ``seq[:ids]``, a cached edge running past
        it split there first (SGLang's insertion splits where its key ends: another request
        may have published a longer edge over the same ids meanwhile, e.g. a chunked prompt
        stashed before this one's publish under the overlap scheduler)."""
        cache, prefix = self.cache, seq[:ids]
        cache.split_match(cache.lookup(prefix), ids)
        return cache.deepest_cached(prefix)

    def _prefill_states(self, started: Started) -> list[int]:
        """States a prefill has published by its end: with ``tracking`` those its extends
        tracked; else the plan's within the prompt, a recomputed hybrid's at its fill's end
        instead of its prompt's (its one extend ran through the sampled outputs: SGLang's
        ``checkpoint`` up to ``extend_end`` keeps the state there, and a later turn of the
        conversation hits it)."""
        plan, prompt, fill = started.plan, started.prompt, started.fill
        if plan.tracking is not None:
            return [c for c in plan.ckpts if c <= fill]
        states = [c for c in plan.ckpts if c <= prompt]
        if fill > prompt and self.cache.hybrid:
            return [*(c for c in states if c < prompt), fill]
        return states

    @staticmethod
    def _publish_cuts(started: Started, end: int) -> list[int]:
        """Node boundaries of a publish up to ``end``: the plan's within the prompt, and the
        prompt's end where the publish goes past it (SGLang's ``split_prompt``)."""
        prompt = started.prompt
        cuts = [c for c in started.plan.cuts if c <= min(prompt, end)]
        return [*cuts, prompt] if end > prompt else cuts

    def publishes_chunks(self, started: Started) -> bool:
        """Whether a prefill cut into chunks publishes what it computed between them
        (:meth:`checkpoint`): a plan that publishes its prompt, on a cache whose ids are tokens
        or a radix tree's pages of tokens (a hash id stands for many tokens), a hybrid's only
        with a state at each chunk's end (``chunk_states``) or at the state each chunk tracked
        (``tracking``): a hybrid's KV is cached only up to a state."""
        cache, plan = self.cache, started.plan
        return (
            plan.publishes_prompt
            and (plan.chunk_states or plan.tracking is not None or not cache.hybrid)
            and (self._tokens_are_ids or self._pages_of_tokens)
        )

    @property
    def _tokens_are_ids(self) -> bool:
        return self._ids_per_key == 1 and self.cache.unit == 1

    @property
    def _pages_of_tokens(self) -> bool:
        """A radix tree keyed by pages of a token trace (SGLang's ``--page-size``): a key is
        ``cache.unit`` tokens."""
        cache = self.cache
        return cache.block_keys and not cache.block_nodes and cache.unit == self._ids_per_key

    def tracks_runs(self, started: Started) -> bool:
        """Whether an engine that runs ``started``'s extends and decode steps itself places its
        states (:meth:`track_extend`, :meth:`track_decode`): a plan with ``tracking``, on a
        cache whose ids are tokens. If so the plan's states, those of one whole-prompt extend
        and undisturbed decoding, are dropped now, before the engine's first extend."""
        if started.plan.tracking is None or not self._tokens_are_ids:
            return False
        started.plan = replace(started.plan, ckpts=[])
        return True

    def track_extend(self, started: Started, start: int, end: int) -> int | None:
        """A prefill extend of positions ``[start, end)`` ran: the state it tracked (None if
        none) joins the plan's, where the prefill publish (:meth:`checkpoint` between chunks,
        :meth:`prefilled` at its end) takes it; one past the ids its prefill publishes (its
        fill, :meth:`_fill`) is not kept. Requires :meth:`tracks_runs`."""
        plan = started.plan
        assert plan.tracking is not None
        state = plan.tracking.extend(start, end)
        if state is None or state > started.fill:
            return None
        started.plan = replace(plan, ckpts=[*plan.ckpts, state])
        return state

    def track_decode(self, started: Started, start: int, end: int) -> None:
        """Decode steps grew the sequence from ``start`` to ``end`` ids: the last state they
        tracked replaces the one an earlier decode step tracked (SGLang's ping-pong buffer
        keeps the latest; the finish publishes it). Requires :meth:`tracks_runs`."""
        plan = started.plan
        assert plan.tracking is not None
        state = plan.tracking.decode(start, end)
        if state is not None:
            prefill = [c for c in plan.ckpts if c <= started.fill]
            started.plan = replace(plan, ckpts=[*prefill, state])

    def checkpoint(self, started: Started, tokens: int) -> int:
        """A prefill cut into chunks publishes its first ``tokens`` (whole pages) between
        them, as at its end (:meth:`prefilled` without making room: SGLang's
        ``checkpoint_kv_cache`` of its chunked request), and its pin moves there (a cached edge
        running past them is split there first, as SGLang's insertion splits it). Returns the
        tokens of the prompt now cached on its path. Requires :meth:`publishes_chunks`."""
        plan, cache = started.plan, self.cache
        per_key = cache.unit  # tokens per id: 1, or a page's (:attr:`_pages_of_tokens`)
        ids = min(tokens // per_key, started.fill) // self._page * self._page
        if plan.tracking is not None:
            started.states_to = ids
        if ids > 0:
            result = cache.insert(
                started.seq,
                [ids] if cache.hybrid else [],
                ids,
                self.eviction,
                cuts=self._publish_cuts(started, ids),
                stateless_kv=plan.stateless_kv,
            )
            published = started.published
            started.published = result if published is None else merged(published, result)
        deepest = self._published_node(started.seq, ids)
        if deepest is None:
            return 0
        if started.pins:
            self._move_pin(started, deepest)
        return deepest.end * per_key

    def _move_pin(self, started: Started, node: Node | None) -> None:
        """The request's pin moves to ``node``, what it published (SGLang's
        ``cache_unfinished_req`` moves the request's lock to its new last node, the root's
        lock of a request that hit nothing included): a running request's published prompt is
        never evicted under it."""
        cache = self.cache
        cache.pin(node)
        cache.unpin(started.pinned)
        started.pinned = node

    def own_from(self, started: Started) -> int | None:
        """Where the tokens the request holds itself start (``plan.held_from`` in tokens, at
        most its input's, or past it by the recomputed outputs it published: ``Started.fill``);
        None when the plan does not say."""
        held_from = started.plan.held_from
        if held_from is None:
            return None
        past = min(max(held_from - started.prompt, 0), started.refill)
        per_key = self._ids_per_key  # the outputs' keys are whole pages of tokens, or tokens
        return started.req.hit_tokens((held_from - past) * per_key) + past * per_key

    @property
    def _holds_whole_blocks(self) -> bool:
        """A Transformer's block pool (vLLM): a request keeps the blocks it recomputed though
        they were cached (:meth:`_held_after_publish`). Hybrid pools keep the plain rule: no
        real-engine case checks their duplicates yet. SGLang's paged tree frees them when it
        publishes (``_insert_cache``)."""
        return self.cache.block_nodes and not self.cache.hybrid

    def _held_after_publish(self, started: Started) -> int:
        """Where the request's own slots start once its prompt is published: past the prompt,
        except that a block pool (vLLM) keeps the blocks it recomputed though they were cached
        (the hit stops at ``len - 1``): vLLM allocates fresh blocks for every position past the
        hit and never de-duplicates them against the cached ones, so they hold memory until the
        request finishes (real vLLM 0.33 ``KVCacheManager``: ``tests/test_production.py``).
        Hybrid pools keep the plain rule: no real-engine case checks their duplicates yet.
        A hybrid whose KV is cached only up to a state published the prompt's KV up to its last
        state in the prompt, and holds the rest itself (SGLang's ``extra_buffer`` checkpoints
        the prompt at its tracked state, ``cache_unfinished_req``).
        Invariant: ``plan.held_from <= result``."""
        plan, prompt = started.plan, started.prompt
        assert plan.held_from is not None
        published = started.fill
        if self.cache.hybrid and not plan.stateless_kv:
            published = max(self._prefill_states(started), default=0)
        held_from = max(plan.held_from, published)
        if self._holds_whole_blocks:
            recomputed = min(started.lookup.matched, prompt) - plan.held_from
            held_from -= max(0, recomputed)
        return held_from

    @staticmethod
    def _finish_cuts(started: Started) -> list[int]:
        """The plan's node boundaries, a cut at the input's end (its lookup ids) put at the
        end of the prompt's full blocks: with block keys a prompt's partial last block is
        never cached, so a paged tree splits where its cached prompt ends (SGLang's
        ``split_prompt`` on the page-aligned prompt key)."""
        cuts, prompt, lookup = started.plan.cuts, started.prompt, started.allocated
        if prompt == lookup:
            return list(cuts)
        return [prompt if c == lookup else c for c in cuts]

    def spare_ids(self, started: Started, decoding: bool) -> int:
        """Keys of free room the engine's eviction keeps beyond the request's allocation
        (``Admission.spare_page``; a key is a page). SGLang's paged allocator: before the
        prefill extend, one page more than it takes (``alloc_paged_token_slots_extend``); before
        each decode step, one free page (``alloc_paged_token_slots_decode``), which at the last
        step (feeding token ``C - 1`` of the ``C`` it leaves) is the page it takes when that
        token starts one, else one more. A request without decode steps (one output) has none."""
        if not started.plan.spare_page:
            return 0
        if not decoding:
            return 1
        req = started.req
        left = req.input_len + req.output_ids.shape[0] - 1  # C: the committed tokens
        if left <= req.input_len:
            return 0
        return 0 if (left - 1) % self._ids_per_key == 0 else 1

    def finish(self, started: Started, timing: Timing | None = None) -> RequestRecord:
        """The request completed: admit input + output, unpin, ``observe``, the record. A plan
        with ``tracking`` admits only the last state its decode steps tracked, and KV up to it
        (SGLang's ``_select_finished_checkpoint``), or nothing."""
        cache, req = self.cache, started.req
        plan = started.plan
        ckpts, end = plan.ckpts, plan.end
        if plan.tracking is not None:  # the last state its decode steps tracked, if any
            ckpts = [c for c in plan.ckpts if c > started.fill][-1:]
            end = max(ckpts, default=0)
        admitted = cache.insert(
            started.seq,
            ckpts,
            end,
            self.eviction,
            cuts=self._finish_cuts(started),
            held_from=plan.held_from,
            stateless_kv=plan.stateless_kv,
            branch_at_insert=plan.branch_at_insert,
            short=started.short,
            spare=self.spare_ids(started, decoding=True),
        )
        if started.pinned is not None:
            cache.unpin(started.pinned)
        if started.published is not None:
            admitted = merged(started.published, admitted)
        if self._observes:
            self.eviction.observe(cache, req, admitted)
        for controller in self.controllers:
            controller.observe(self, req, admitted)
        record = self._record(started, admitted)
        if timing is not None:
            add_timing(record, timing)
        return record

    def summary(self) -> dict[str, Any]:
        """The plug-ins' and controllers' items for the policy's summary."""
        items = dict(self.eviction.summary())
        for controller in self.controllers:
            items |= controller.summary()
        if self.cache.host is not None:
            items |= self.cache.host.summary()
        return items

    def _record(self, started: Started, admitted: InsertResult) -> RequestRecord:
        req, cache, hit = started.req, self.cache, started.hit
        record = request_record(
            self.policy,
            req,
            cache.model,
            started.matched,
            hit,
            kv_bytes_admitted=admitted.kv_bytes,
            ssm_bytes_admitted=admitted.ssm_bytes,
            ckpts_admitted=admitted.ckpts * cache.ckpt_states,
            bytes_evicted=admitted.evicted_bytes,
            nodes_evicted=admitted.evicted_nodes,
            admission_truncated=admitted.truncated,
            cache_kv_bytes=cache.kv_bytes,
            cache_ssm_bytes=cache.ssm_bytes,
        )
        if cache.host is not None:  # the host tier's columns
            record.host_hit_tokens = started.host_hit
            record.host_loaded_bytes = started.host_loaded
        return record


def host_tier(
    capacity: float, bandwidth: float | None, eviction: EvictionPolicy, semantics: Semantics | None
) -> tiers.HostTier:
    """A host tier for a step (``cache.host_gb``); the policy must break ties by age and run
    simlab's own cache semantics (the reference code's orders are not defined on two tiers)."""
    if bandwidth is None:
        raise ConfigError("cache.host_bw_gbps: a host tier (cache.host_gb) needs its bandwidth")
    if eviction.ties != "oldest" or (semantics is not None and semantics != Semantics()):
        raise ConfigError(
            "cache.host_gb: a host tier is not supported with the Marconi reference code's "
            "semantics (policy.compat=reference / reference_fixed, eviction.ties=dfs|heap)"
        )
    return tiers.HostTier(capacity, bandwidth)


def merged(first: InsertResult, second: InsertResult) -> InsertResult:
    """A request's two admissions (prompt at prefill, the rest at finish) as one."""
    return InsertResult(
        kv_bytes=first.kv_bytes + second.kv_bytes,
        ssm_bytes=first.ssm_bytes + second.ssm_bytes,
        ckpts=first.ckpts + second.ckpts,
        admitted_end=second.admitted_end,
        truncated=first.truncated or second.truncated,
        evicted_bytes=first.evicted_bytes + second.evicted_bytes,
        evicted_nodes=first.evicted_nodes + second.evicted_nodes,
    )


def add_timing(record: RequestRecord, t: Timing) -> None:
    """Fill a record's latency columns (TTFT = first token - arrival, so queueing counts); a
    timed request arrives when its session submitted it."""
    out = record.output_tokens
    record.arrival = t.arrival
    record.scheduled, record.first_token, record.finished = t.scheduled, t.first_token, t.finished
    record.ttft = t.first_token - t.arrival
    record.queue_delay = t.scheduled - t.arrival
    record.tpot = (t.finished - t.first_token) / (out - 1) if out > 1 else math.nan
    record.e2e = t.finished - t.arrival
    record.prefill_time = t.prefill_time
