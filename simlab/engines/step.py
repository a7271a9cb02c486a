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

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from simlab.cache.contract import Admission, AdmissionPolicy, EvictionPolicy, Semantics, overrides
from simlab.cache.keys import key_scheme
from simlab.cache.nodes import InsertResult, Lookup, Node
from simlab.cache.prefix import PrefixCache
from simlab.cache.state_pool import StatePool
from simlab.config import ConfigError
from simlab.engines import publish
from simlab.engines.keying import StepKeys
from simlab.engines.publish import merged
from simlab.engines.records import RequestRecord, request_record

if TYPE_CHECKING:
    from simlab.model.spec import ModelSpec
from traces.format import Request

log = logging.getLogger(__name__)


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
    #: the hybrid's separate state pool (``cache.ssm_gb`` or the engine's split; None: shared)
    state_pool: StatePool | None = None
    #: what the run's settings make this step do unlike the engine (``summary.json`` caveats)
    notes: list[str] = field(default_factory=list)
    #: how requests are keyed against the cache, ids counted as tokens
    keys: StepKeys = field(init=False, repr=False)
    _observes: bool = field(init=False, repr=False)  # the eviction policy overrides observe
    _page: int = field(init=False, repr=False)  # Transformer hits round down to it

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
        state_pool: StatePool | None = None,
        semantics: Semantics | None = None,
        host_capacity_bytes: float | None = None,
        host_bw_bytes: float | None = None,
        ckpt_states: int = 1,
    ) -> RequestStep:
        """A step on a fresh cache shaped for the admission's keys (``page_size`` in ids): a
        block-keyed cache counts one id per block, which is its page, one node per block.
        ``state_pool``: SSM states in a pool of their own (``capacity_bytes`` is then KV's). ``semantics``: where the cache follows the Marconi reference code
        (:class:`simlab.cache.contract.Semantics`; default simlab's). ``host_capacity_bytes``: a
        host-memory tier below the cache, at ``host_bw_bytes`` per second
        (:mod:`simlab.cache.host_tier`). ``ckpt_states``: SSM states one checkpoint holds
        (:meth:`simlab.cache.contract.AdmissionPolicy.states_per_checkpoint`)."""
        if host_capacity_bytes is not None:
            check_host_tier(host_bw_bytes, eviction, semantics)
        if state_pool is not None and semantics is not None and semantics.reference_insert:
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
            ssm_capacity_bytes=None if state_pool is None else state_pool.ssm_bytes,
            semantics=semantics,
            host_capacity_bytes=host_capacity_bytes,
            host_bw_bytes=host_bw_bytes if host_bw_bytes is not None else math.inf,
            ckpt_states=ckpt_states,
        )
        return cls(cache, admission, eviction, policy, tuple(controllers), state_pool=state_pool)

    def __post_init__(self) -> None:
        self._observes = overrides(self.eviction, "observe", EvictionPolicy)
        self.keys = StepKeys(key_scheme(self.admission.keys), self.cache)
        self._page = math.lcm(self.cache.page_size, self.admission.page_size)

    @property
    def page_size(self) -> int:
        """KV page of this step, in ids: the cache's and the admission's (their lcm)."""
        return self._page

    def prepare(self, requests: Sequence[Request]) -> None:
        """Show the plug-ins the whole run (processing order), before the first request; with
        block keys (or a hash-id prompt's short last id) they see each request's keyed input
        (``input_ids``) instead of its tokens."""
        requests = self.keys.prepare(requests)
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
        (matched and published with it where :meth:`simlab.engines.keying.StepKeys.fill` says)."""
        cache = self.cache
        keyed = self.keys.view(req)
        ids, refill = self.keys.fill(keyed.lookup, req, refill)
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
        per_key = self.keys.per_key
        hit = self.keys.hit_tokens(req, lookup.hit * per_key, refill)
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
        started.pins, started.refill = pin, self.keys.refill_ids(req, keyed.prompt, refill)
        if host_ids:
            started.host_hit = hit - self.keys.hit_tokens(req, (lookup.hit - host_ids) * per_key)
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
        ids, refill = self.keys.fill(self.keys.lookup_ids(req), req, refill)
        lookup = self._queued_match(ids)
        return self.keys.hit_tokens(req, lookup.hit * self.keys.per_key, refill), lookup.hit_node

    def touch_queued(self, req: Request, refill: int = 0) -> None:
        """SGLang's periodic refresh of a queued request's prefix (``touch_waiting_prefix``):
        its whole input is matched, the node the match stops inside split there and the path
        refreshed (``on_match``); nothing else changes. A no-op with a host tier."""
        if self.cache.host is None:
            ids = self.keys.fill(self.keys.lookup_ids(req), req, refill)[0]
            self._queued_match(ids, slack=0)

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

    def _load_host_hit(self, ids: np.ndarray, lookup: Lookup) -> tuple[Lookup, int, int]:
        """Host tier: load the host part of ``lookup``'s hit back to the GPU
        (:meth:`simlab.cache.prefix.PrefixCache.load_host_hit`). Returns the lookup after the
        load, the hit's ids that came from the host and the bytes loaded; when the GPU cannot
        make room, the lookup of the GPU part alone and no host hit."""
        cache = self.cache
        host_ids, loaded = cache.load_host_hit(lookup, self.eviction)
        if loaded < 0:
            return cache.lookup(ids, self._page, gpu_only=True), 0, 0
        if not host_ids:
            return lookup, 0, 0  # the hit lies on the GPU
        after = cache.lookup(ids, self._page)  # the load may have split the hit's node
        assert after.hit == lookup.hit, (after.hit, lookup.hit)
        return after, host_ids, loaded

    def peek(self, req: Request) -> tuple[int, int]:
        """``(matched, hit)`` tokens ``req`` would get if it started now, read-only: no clock
        tick, no ``on_hit``, no pin, no key assigned (a router's view of this cache; the
        cache's and the plug-ins' state are unchanged)."""
        lookup = self.cache.lookup(self.keys.lookup_ids(req), self._page)
        per_key = self.keys.per_key
        hit = self.keys.hit_tokens(req, lookup.hit * per_key)
        return req.hit_tokens(lookup.matched * per_key), hit

    def peek_hit(self, req: Request) -> tuple[int, Node | None]:
        """:meth:`peek`'s hit tokens and the node holding the reused prefix (None: no hit),
        read-only (a shared KV pool pins the node while it evicts to admit ``req``)."""
        lookup = self.cache.lookup(self.keys.lookup_ids(req), self._page)
        return self.keys.hit_tokens(req, lookup.hit * self.keys.per_key), lookup.hit_node

    def admission_bytes(self, req: Request) -> int:
        """Bytes admitting ``req``'s input would take in a cache holding none of it: the KV of
        the ids the plan admits plus its planned SSM states (an upper bound when the cache
        already holds part of it). Read-only: plans are pure and no key is assigned."""
        n = int(self.keys.lookup_ids(req).shape[0])
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

    # ------------------------------------------------------------------ publishes
    def prefilled(self, started: Started, keep_room: bool = True) -> None:
        """The request's prefill ended: :func:`simlab.engines.publish.prefilled`."""
        publish.prefilled(self, started, keep_room)

    def publishes_chunks(self, started: Started) -> bool:
        """:func:`simlab.engines.publish.publishes_chunks`."""
        return publish.publishes_chunks(self, started)

    def checkpoint(self, started: Started, tokens: int) -> int:
        """A chunked prefill's publish between chunks: :func:`simlab.engines.publish.checkpoint`."""
        return publish.checkpoint(self, started, tokens)

    def tracks_runs(self, started: Started) -> bool:
        """:func:`simlab.engines.publish.tracks_runs`."""
        return publish.tracks_runs(self, started)

    def track_extend(self, started: Started, start: int, end: int) -> int | None:
        """:func:`simlab.engines.publish.track_extend`."""
        return publish.track_extend(started, start, end)

    def track_decode(self, started: Started, start: int, end: int) -> None:
        """:func:`simlab.engines.publish.track_decode`."""
        publish.track_decode(started, start, end)

    def own_from(self, started: Started) -> int | None:
        """:func:`simlab.engines.publish.own_from`."""
        return publish.own_from(self, started)

    def spare_ids(self, started: Started, decoding: bool) -> int:
        """:func:`simlab.engines.publish.spare_ids`."""
        return publish.spare_ids(self, started, decoding)

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
            cuts=publish.finish_cuts(started),
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
        items |= self.engine_items()
        hybrid = self.cache.hybrid
        tree = () if self.pool else self.admission.tree_caveats(hybrid)
        for line in tree:
            log.warning("%s: %s", self.policy, line)
        caveats = [*self.admission.caveats(hybrid), *tree, *self.notes, *items.pop("caveats", [])]
        return items | {"caveats": caveats} if caveats else items

    def engine_items(self) -> dict[str, Any]:
        """The emulated engine's layout (``engine_geometry``) and the settings it chose that
        the user did not set (``engine_defaults``); none for a policy that emulates none."""
        cache = self.cache
        unit = cache.unit // (self.admission.keys.block_size or 1)  # tokens per trace id
        geometry = self.admission.geometry(cache.model, unit, self.state_pool)
        defaults = geometry.pop("defaults", None)
        items = {"engine_geometry": geometry} if geometry else {}
        return items | ({"engine_defaults": defaults} if defaults else {})

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


def check_host_tier(
    bandwidth: float | None, eviction: EvictionPolicy, semantics: Semantics | None
) -> None:
    """Whether a step may have a host tier (``cache.host_gb``): it needs its bandwidth, and the
    policy must break ties by age and run simlab's own cache semantics (the reference code's
    orders are not defined on two tiers)."""
    if bandwidth is None:
        raise ConfigError("cache.host_bw_gbps: a host tier (cache.host_gb) needs its bandwidth")
    if eviction.ties != "oldest" or (semantics is not None and semantics != Semantics()):
        raise ConfigError(
            "cache.host_gb: a host tier is not supported with the Marconi reference code's "
            "semantics (policy.compat=reference / reference_fixed, eviction.ties=dfs|heap)"
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
