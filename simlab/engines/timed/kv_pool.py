"""The timed engine's shared KV pool (``engine.kv_pool=shared``): one budget for the prefix
cache and the running sequences, and beside it SGLang's separate SSM pool (``cache.ssm_gb``).
:class:`KVPool` keeps the budget: what the running sequences hold (:meth:`KVPool.hold`,
:meth:`KVPool.hold_slots`), the cache's capacity following the rest, and the room made by
evicting cached entries (:meth:`KVPool.make_room`, :meth:`KVPool.evict_for`); the invariant it
keeps is :meth:`KVPool.check`'s. Who is admitted and preempted is
:mod:`simlab.engines.timed.admission`'s and :mod:`simlab.engines.timed.preemption`'s, their
strategy :class:`simlab.engines.timed.shared.SharedMemory`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache import evictor
from simlab.config import ConfigError
from simlab.engines.timed.jobs import Job
from traces.format import Request

if TYPE_CHECKING:
    from simlab.engines.step import RequestStep
    from simlab.engines.timed.jobs import PoolStats
    from simlab.engines.timed.settings import TimedSettings


class KVPool:
    """The shared pool's budget over ``step``'s cache; ``pool``: the run's counters (the
    world's :class:`PoolStats`). ``page``: tokens per page of the pool (SGLang's paged
    allocator under ``engine.request_admission=sglang``, else 1)."""

    def __init__(self, step: RequestStep, settings: TimedSettings, pool: PoolStats):
        self.step, self.cache, self.model = step, step.cache, step.cache.model
        self.settings, self.pool = settings, pool
        self.page = 1

    def open(self, requests: Sequence[Request]) -> None:
        """``engine.kv_pool=shared``: one budget, ``cache.size_gb + engine.running_memory_gb``,
        for the prefix cache and the running sequences; the cache's capacity follows what the
        running sequences hold (``budget - held``). The budget is whole pages of KV, as an
        engine sizes its token pool (SGLang's ``max_total_num_tokens``): a fraction of a token
        never admits a request."""
        cache, model = self.cache, self.model
        if self.settings.overlap and model.is_hybrid:
            self._check_overlap_tracking()
        if cache.ssm_capacity is not None:
            self._open_state_pool()
        if cache.host is not None:
            raise ConfigError(
                "engine.kv_pool=shared: not supported with a host tier (cache.host_gb); "
                "use engine.kv_pool=separate"
            )
        self.pool.budget = cache.capacity + self.settings.running_memory_gb * 1e9
        if not math.isfinite(self.pool.budget):
            raise ConfigError(
                "engine.kv_pool=shared: the pool (cache.size_gb + engine.running_memory_gb) "
                "must be finite; use engine.kv_pool=separate for an infinite cache"
            )
        page = model.kv_bytes_per_token * cache.unit * self.step.page_size
        if self.settings.request_admission == "sglang" and self.step.admission.allocates_pages:
            self.page = cache.unit  # a key is a page
        if page > 0:
            self.pool.budget = self.pool.budget // page * page
        cache.capacity = self.pool.budget
        if requests:
            longest = max(r.input_tokens + r.output_len for r in requests)
            need = longest * model.kv_bytes_per_token + self.state_in_kv
            if need > self.pool.budget:
                raise ConfigError(
                    f"engine.kv_pool=shared: the pool (cache.size_gb + engine.running_memory_gb "
                    f"= {self.pool.budget / 1e9:.4g} GB) cannot hold the longest request "
                    f"({longest} tokens, {need / 1e9:.4g} GB)"
                )

    @property
    def state_in_kv(self) -> float:
        """A running request's SSM state bytes in the KV budget: none with a separate SSM pool
        (its slots are held there, :meth:`hold_slots`)."""
        return 0.0 if self.pool.ssm_budget is not None else self.model.ssm_state_bytes

    def _check_overlap_tracking(self) -> None:
        """A hybrid under ``engine.overlap``: SGLang runs its overlap scheduler only with
        ``extra_buffer`` (``validate_mamba_no_buffer``: "no_buffer do not support overlap
        schedule"), whose ping-pong buffer then has two track slots
        (``get_mamba_tracking_slots``)."""
        admission = self.step.admission
        mamba = getattr(admission, "mamba", None)
        tracking = getattr(admission, "tracking_slots", None)
        if mamba != "extra_buffer" or tracking != 2:
            extra = mamba == "extra_buffer"
            got = f"policy.mamba={mamba!r}" + (f", tracking_slots={tracking}" if extra else "")
            raise ConfigError(
                "engine.overlap: SGLang runs a hybrid model under its overlap scheduler only "
                "with policy.mamba=extra_buffer and its two tracking slots "
                f"(policy.admission.tracking_slots=2); got {got}"
            )

    def _open_state_pool(self) -> None:
        """``cache.ssm_gb`` beside the shared KV pool (SGLang's two pools): the Mamba pool holds
        the running requests' state slots (``running_state_slots`` each, from scheduling to
        finish) and the cached states, which get what running requests do not hold. SGLang caps
        the running requests at ``slots // slots_per_running_request``
        (``resolve_max_num_reqs``), so every scheduled request finds its slots free or
        evictable."""
        cache, pool = self.cache, self.pool
        assert cache.ssm_capacity is not None
        pool.ssm_budget = cache.ssm_capacity
        pool.slots_per_request = self.step.admission.running_state_slots
        slots = int(pool.ssm_budget // cache.ckpt_bytes)
        ratio = self.step.admission.slots_per_running_request
        if slots < ratio:
            raise ConfigError(
                f"cache.ssm_gb: with engine.kv_pool=shared the SSM pool must hold {ratio} states "
                f"of {self.model.name} per running request (SGLang's mamba ratio: its own "
                f"slot(s), its hit's and its prompt's); it holds {slots}"
            )
        pool.max_running = min(self.settings.running_cap, slots // ratio)

    def hold_slots(self, job: Job, slots: int) -> None:
        """``job`` takes (``slots`` > 0) or gives back (< 0) state slots of the separate SSM
        pool; taking them first evicts cached states (SGLang's ``alloc_req_slots`` calls
        ``evict_mamba``), the request's hit protected by its pin. The cached states' capacity
        is what running requests do not hold."""
        cache, pool = self.cache, self.pool
        nbytes = slots * cache.ckpt_bytes
        if slots > 0 and nbytes > cache.ssm_free:
            freed, _ = evictor.evict_states(cache, nbytes, self.step.eviction)
            pool.evicted_bytes += freed
            if nbytes > cache.ssm_free:
                raise RuntimeError(
                    f"cache.ssm_gb: request {job.req.request_id} needs {slots} state slot(s) and "
                    "the SSM pool cannot free them"
                )
        job.slots += slots
        pool.held_slots += slots
        pool.peak_held_slots = max(pool.peak_held_slots, pool.held_slots)
        assert pool.ssm_budget is not None
        cache.ssm_capacity = pool.ssm_budget - pool.held_slots * cache.ckpt_bytes
        self.check()

    def hold(self, delta: float) -> None:
        """Running sequences hold ``delta`` more bytes; the cache's capacity is the rest."""
        pool = self.pool
        pool.held += delta
        pool.peak_held = max(pool.peak_held, pool.held)
        self.cache.capacity = pool.budget - pool.held
        self.check()

    def check(self) -> None:
        """The invariant: cache bytes + running bytes <= the budget (KV, and with a separate
        SSM pool its cached states + running requests' slots <= its bytes)."""
        cache, pool = self.cache, self.pool
        if pool.ssm_budget is not None and (
            cache.ssm_bytes + pool.held_slots * cache.ckpt_bytes > pool.ssm_budget + 1.0
        ):
            raise RuntimeError(
                f"SSM pool over budget: cached states {cache.ssm_bytes} B + "
                f"{pool.held_slots} running slots > {pool.ssm_budget:.0f} B"
            )
        cached = cache.used_bytes if pool.ssm_budget is None else cache.kv_bytes
        if cached > pool.budget - pool.held + 1.0 and not (
            cache.semantics.reference_insert  # the Marconi reference inserts past capacity
        ):
            raise RuntimeError(
                f"shared KV pool over budget: cache {cached} B + running "
                f"{pool.held:.0f} B > {pool.budget:.0f} B"
            )

    def evictable(self) -> float:
        """KV bytes of unpinned cached entries (pins cover a node's ancestors, so eviction can
        free all of them, leaves first)."""
        cache = self.cache
        unpinned = float(cache.node_bytes[cache.alive & (cache.pins == 0)].sum())
        if self.pool.ssm_budget is None:
            return unpinned
        # their states live in the SSM pool: only the unpinned nodes' KV counts here
        pinned = np.flatnonzero(cache.alive & (cache.pins > 0))
        pinned_states = sum(1 for slot in pinned if cache.node_at(int(slot)).ckpt)
        return unpinned - (cache.ssm_bytes - pinned_states * cache.ckpt_bytes)

    def make_room(self, need: float) -> bool:
        """Whether ``need`` bytes are free in the pool, after evicting cached entries in the
        eviction policy's order (:meth:`PrefixCache.evict`); nothing is evicted when even all
        unpinned entries would not make the room."""
        cache = self.cache
        if need <= cache.free_bytes:
            return True
        if need > cache.free_bytes + self.evictable():
            return False
        freed, _ = cache.evict(need, self.step.eviction)
        self.pool.evicted_bytes += freed
        return need <= cache.free_bytes

    def evict_for(self, need: float) -> bool:
        """Whether ``need`` bytes are free after evicting cached entries until they are or
        nothing unpinned is left (SGLang's ``evict_from_tree_cache``; :meth:`make_room`
        evicts nothing when it cannot make the whole room)."""
        cache = self.cache
        if need > cache.free_bytes:
            freed, _ = cache.evict(need, self.step.eviction)
            self.pool.evicted_bytes += freed
        return need <= cache.free_bytes

    def step_need(self, decoders: list[Job]) -> float:
        """Bytes the next decode step of ``decoders`` takes: a token each, or on SGLang's paged
        pool a page for each whose token starts one (``new_tokens_required_next_decode``)."""
        kv, page = self.model.kv_bytes_per_token, self.page
        if page == 1:
            return len(decoders) * kv
        return sum(1 for j in decoders if j.pad == 0) * page * kv

    def repad(self, job: Job, end: int) -> float:
        """``job``'s allocation now ends at token ``end``: on SGLang's paged pool it holds the
        rest of its last page too (``Job.pad``, counted in ``Job.reserved``). Returns the bytes
        that adds (negative: frees); the caller holds them."""
        page = self.page
        if page == 1:
            return 0.0
        pad = -end % page
        delta = (pad - job.pad) * self.model.kv_bytes_per_token
        job.pad = pad
        job.reserved += delta
        return delta

    def whole_bytes(self, job: Job) -> float:
        """``job``'s whole KV (input, outputs) and its state where the KV budget holds it."""
        return (job.input_tokens + job.decode_end + 1) * self.model.kv_bytes_per_token + (
            self.state_in_kv
        )

    def free_state_slot(self) -> None:
        """With a separate SSM pool, a queued request matched with a hit gets a slot for its
        copy of the hit's state there and then (SGLang's ``init_next_round_input``: Mamba
        copy-on-write, ``evict_mamba`` with the hit locked when no slot is free), admitted or
        not: a request that does not fit gives the slot back, the evictions stay."""
        cache = self.cache
        if self.pool.ssm_budget is not None and cache.ckpt_bytes > cache.ssm_free:
            freed, _ = evictor.evict_states(cache, cache.ckpt_bytes, self.step.eviction)
            self.pool.evicted_bytes += freed
