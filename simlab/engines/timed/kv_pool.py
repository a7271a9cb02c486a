"""The timed engine's shared KV pool (``engine.kv_pool=shared``): one budget for the prefix
cache and the running sequences, and beside it SGLang's separate SSM pool (``cache.ssm_gb``).
FCFS admission (whole requests, or SGLang's ``PrefillAdder`` with its new token ratio under
``engine.request_admission=sglang``), the output reserved token by token, preemption or
retraction when a decode step does not fit, and the cache's capacity following what the running
sequences hold. :class:`SharedPoolScheduling` is a part of :class:`simlab.engines.timed.world.TimedWorld`
(its methods run on the world); the invariant it keeps is :meth:`_check_pool`'s."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache import evictor
from simlab.config import ConfigError
from simlab.engines.timed.jobs import Job, clipped_max_new
from simlab.engines.timed.new_token_ratio import (
    CLIP_MAX_NEW_TOKENS,
    RETRACT_DECODE_STEPS,
    WAITING_PREFIX_MAX,
    WAITING_PREFIX_REFRESH_INTERVAL,
)
from traces.format import Request

if TYPE_CHECKING:
    from collections import deque

    from simlab.cache.prefix import PrefixCache
    from simlab.engines.step import RequestStep
    from simlab.engines.timed.jobs import PoolStats
    from simlab.engines.timed.new_token_ratio import NewTokenRatio
    from simlab.engines.timed.world import Feeder, TimedSettings
    from simlab.model.spec import ModelSpec


class SharedPoolScheduling:
    """The shared KV pool's admission, reservation and preemption, mixed into
    :class:`simlab.engines.timed.world.TimedWorld`: what it reads of the world is declared here."""

    step: RequestStep
    cache: PrefixCache
    model: ModelSpec
    settings: TimedSettings
    pool: PoolStats
    waiting: deque[Job]
    running: list[Job]
    max_running: int
    _feeder: Feeder
    _budget: float
    _kv_page: int
    _ratio: NewTokenRatio
    _retracted: bool
    _batch_full: bool
    _decode_skipped: bool
    _passes: int
    _admission_passes: int

    if TYPE_CHECKING:  # the world's own steps

        def _any_prefill(self) -> bool: ...
        def _decoders(self) -> list[Job]: ...
        def _batch_members(self) -> list[Job]: ...
        def _note_queue(self) -> None: ...
        def _rank(self, index: int) -> tuple[int, int]: ...
        def _refill(self, job: Job) -> int: ...
        def _start(self, job: Job, need: float) -> None: ...

    def _open_pool(self, requests: Sequence[Request]) -> None:
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
            self._kv_page = cache.unit  # a key is a page
        if page > 0:
            self.pool.budget = self.pool.budget // page * page
        cache.capacity = self.pool.budget
        if requests:
            longest = max(r.input_tokens + r.output_len for r in requests)
            need = longest * model.kv_bytes_per_token + self._state_in_kv
            if need > self.pool.budget:
                raise ConfigError(
                    f"engine.kv_pool=shared: the pool (cache.size_gb + engine.running_memory_gb "
                    f"= {self.pool.budget / 1e9:.4g} GB) cannot hold the longest request "
                    f"({longest} tokens, {need / 1e9:.4g} GB)"
                )

    @property
    def _state_in_kv(self) -> float:
        """A running request's SSM state bytes in the KV budget: none with a separate SSM pool
        (its slots are held there, :meth:`_hold_slots`)."""
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
        pool.max_running = self.max_running = min(self.max_running, slots // ratio)

    def _hold_slots(self, job: Job, slots: int) -> None:
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
        self._check_pool()

    def _schedule_shared(self) -> None:
        """FCFS admission into the shared pool. A request is admitted when its whole KV (input
        beyond its hit, output, one SSM state) could fit in the free and evictable bytes (its
        own hit protected); it then holds its prompt's KV at once (cached entries evicted for
        it in the policy's order) and its output's token by token (:meth:`_reserve_decode`).
        Otherwise it waits; with nothing running it is admitted whatever its hit (cached
        entries evicted for its whole KV, the hit's included if need be). With a separate SSM
        pool its state is not in the KV budget: it takes its slots there (:meth:`_hold_slots`),
        and the running requests are capped as SGLang caps them (:meth:`_open_state_pool`).
        ``engine.request_admission=sglang``: it must fit beside what the running requests and
        those admitted in this pass are expected to still write (:meth:`_expected_bytes`);
        each candidate is matched (:meth:`RequestStep.match_queued`), the one that does not
        fit included, before the pass evicts for the prompts it admitted, all at once
        (SGLang's ``PrefillAdder`` loop, then ``prepare_for_extend``); the pass admits nobody
        once the step's prefill chunks fill its token budget (:meth:`_continue_prompts`), the last
        one admitted perhaps only in part (the next chunked request), or spend
        ``engine.max_prefill_tokens`` (``rem_input_tokens``; without chunked prefill a prompt
        that reaches what is left of it waits unless it is the first: :meth:`_under_input_cap`)."""
        sglang = self.settings.request_admission == "sglang"
        if sglang and not self._sglang_pass_opens():
            return
        expected = self._expected_bytes() if sglang else 0.0
        mixed = len(self._batch_members()) if sglang and self.settings.batching == "mixed" else 0
        room = self._budget - mixed if sglang else math.inf
        spent, chunk_bytes, added, ask = (
            self._continue_prompts(expected, room) if sglang else (0, 0.0, 0.0, 0.0)
        )
        room -= spent
        cap = self.settings.max_prefill_tokens
        inputs = math.inf if cap is None else cap - mixed - spent  # ``rem_input_tokens``
        expected += added
        self._admission_passes += 1
        batch: list[Job] = []  # sglang: admitted in this pass, their prompts not held yet
        admitted: list[Job] = []
        while self.waiting and not self._admission_stops(sglang, min(room, inputs)):
            job = self.waiting[0]
            if not self._feeder.ready(job):
                break
            fits, hit = self._fits(job, expected, sum(j.reserved for j in batch) + chunk_bytes)
            if not self._admits(job, fits, hit, room) or (
                fits and admitted and not self._under_input_cap(job, hit, inputs)
            ):
                break
            self._admit_head(job, len(batch))
            admitted.append(job)
            if not sglang:
                self._hold_prompts([job])
                continue
            charged, reserved, job_ask = self._first_chunk(job, room)
            room -= charged
            inputs -= charged
            expected += reserved
            if not fits:
                self._hold_prompts([job], ask=job_ask)
                continue
            batch.append(job)
            ask += job_ask
            if not self._room_left(expected, batch, chunk_bytes):
                self._batch_full = True  # ``budget_state``: NO_TOKEN
                break
        if sglang and self.pool.ssm_budget is not None:  # prepare_for_extend's alloc_req_slots
            for job in admitted:
                self._hold_slots(job, self.pool.slots_per_request - job.slots)
        self._hold_prompts(batch, chunk_bytes, ask)

    def _admits(self, job: Job, fits: bool, hit: int, room: float) -> bool:
        """Whether the pass admits the queue's head, ``fits`` or not (:meth:`_fits`; ``hit``:
        its hit's tokens), with ``room`` tokens of the step's budget left. One that does not
        fit waits while others run (SGLang's batch is then full) and is admitted alone
        otherwise, the room for its whole KV made. SGLang admits one that fits if its
        page-ceiled extend fits the budget or the budget holds a page of it (a cut prompt's
        chunk ends on a page; else ``AddReqResult.OTHER``, ``_select_prefill_admission``)."""
        sglang = self.settings.request_admission == "sglang"
        if not fits:
            if self.running:
                self._batch_full = sglang
                return False
            self._make_room(self._whole_bytes(job))
            return True
        page = self._kv_page
        return not sglang or -(-(job.input_tokens - hit) // page) * page <= room or room >= page

    def _under_input_cap(self, job: Job, hit: int, inputs: float) -> bool:
        """Whether the pass, chunked prefill off (``engine.token_budget=null``), admits the
        queue's head beside the requests it admitted: only if its page-ceiled extend is below
        the ``inputs`` tokens left of ``engine.max_prefill_tokens`` (SGLang's
        ``_select_prefill_admission``; the first one is admitted whatever its length). With
        chunks the cap only ends the pass once spent (:meth:`_admission_stops`)."""
        if not math.isinf(self._budget):
            return True
        page = self._kv_page
        return -(-(job.input_tokens - hit) // page) * page < inputs

    def _room_left(self, expected: float, batch: list[Job], chunks: float) -> bool:
        """Whether the pool still has room after this pass's admissions (SGLang's
        ``budget_state`` after ``add_one_req``: free and evictable tokens beyond what the pass
        charged). The check found room for the request's raw extend and the outputs it has
        left (:meth:`_sglang_need`); the pass charges its page-ceiled extend and, for a
        retracted request, every output it may sample (:func:`clipped_max_new`), so the room
        can run out with the last one admitted: SGLang's batch is then full."""
        pending = sum(j.reserved for j in batch) + chunks
        return self.cache.free_bytes + self._evictable() - pending - expected > 0

    def _admission_stops(self, sglang: bool, room: float) -> bool:
        """Whether the pass admits nobody more: the step's token budget or SGLang's
        ``engine.max_prefill_tokens`` is spent (``room``: the fewer tokens either leaves;
        ``budget_state``: OTHER), ``max_running`` is reached (with ``sglang`` the batch is then
        full), or SGLang's batch is full (a prefill-only step kept the flag: its chunk goes
        on)."""
        if room <= 0:
            return True
        if len(self.running) >= self.max_running:
            self._batch_full = sglang
            return True
        return sglang and self._batch_full

    def _continue_prompts(self, expected: float, room: float) -> tuple[int, float, float, float]:
        """``engine.request_admission=sglang``: the prompts the budget cut take their next
        chunk first (``add_chunked_req``): as many tokens as the step's budget leaves
        (``room``: less one per decoding request with mixed batching) and, when that is above
        zero, the pool's room beside ``expected``. Returns the tokens charged to the step's
        budgets (``rem_chunk_tokens`` and ``rem_input_tokens``: the chunks page-ceiled), the
        chunks' bytes (held with the pass's admissions; on a paged pool with the rest of
        their last page), the bytes they add to the expected writes (the page-ceiled chunk and
        one page each, and the outputs of a prompt the chunk ends, less what they hold) and
        what their allocation asks free (the chunk and a page each)."""
        kv, page = self.model.kv_bytes_per_token, self._kv_page
        spent = 0
        hold = added = ask = 0.0
        for job in self.running:
            if job.held_to >= job.input_tokens:
                continue
            left = job.input_tokens - job.prefilled
            free = int((self.cache.free_bytes + self._evictable() - expected - added - hold) // kv)
            take = int(min(left, room, free) if min(room, free) > 0 else min(left, room))
            if take <= 0:
                continue
            job.held_to += take
            job.reserved += take * kv
            grown = take * kv + self._repad(job, job.held_to)
            hold += grown
            charged = -(-take // page) * page
            room -= charged
            spent += charged
            outputs = clipped_max_new(job) if take == left else 0
            added += (outputs + page + charged) * kv - grown
            ask += (take + page) * kv
        return spent, hold, added, ask

    def _first_chunk(self, job: Job, room: float) -> tuple[int, float, float]:
        """Admitted ``job`` computes its prompt's first ``room`` tokens in this step at most;
        a longer prompt holds only them (SGLang allocates a chunked request's KV chunk by
        chunk) and goes on in the next steps (:meth:`_continue_prompts`). On a paged pool its
        extend is charged page-ceiled, a cut one ends on a page (SGLang's
        ``_select_prefill_admission``; the hit is whole pages) and a whole one holds the rest
        of its last page. Returns the budget it charged, the bytes the pass reserves for it
        beyond what it holds (one page, and its outputs unless the prompt was cut:
        ``_update_prefill_budget``) and what its allocation asks free (its extend and a page,
        ``alloc_paged_token_slots_extend``)."""
        kv, page = self.model.kv_bytes_per_token, self._kv_page
        extend = job.input_tokens - job.hit
        whole = -(-extend // page) * page
        if whole <= room:
            self._repad(job, job.input_tokens)
            return whole, (clipped_max_new(job) + page) * kv, (extend + page) * kv
        take = int(max(room, 0)) // page * page
        job.held_to = job.hit + take
        job.reserved -= (extend - take) * kv
        return take, page * kv, (take + page) * kv

    def _repad(self, job: Job, end: int) -> float:
        """``job``'s allocation now ends at token ``end``: on SGLang's paged pool it holds the
        rest of its last page too (``Job.pad``, counted in ``Job.reserved``). Returns the bytes
        that adds (negative: frees); the caller holds them."""
        page = self._kv_page
        if page == 1:
            return 0.0
        pad = -end % page
        delta = (pad - job.pad) * self.model.kv_bytes_per_token
        job.pad = pad
        job.reserved += delta
        return delta

    def _fits(self, job: Job, expected: float, pending: float) -> tuple[bool, int]:
        """Whether queued ``job`` fits the free and evictable bytes less ``pending`` (prompts
        admitted in this pass, not held yet), its own hit pinned meanwhile; without
        ``engine.request_admission=sglang`` the room for its prompt is then made. Returns that
        and its hit (tokens)."""
        kv, state = self.model.kv_bytes_per_token, self._state_in_kv
        sglang = self.settings.request_admission == "sglang"
        if sglang:
            hit, node = self.step.match_queued(job.req, self._refill(job))
        else:
            hit, node = self.step.peek_hit(job.req)
        self.cache.pin(node)
        if sglang and hit > 0:
            self._free_state_slot()
        room = self.cache.free_bytes + self._evictable() - pending
        if sglang:
            fits = self._sglang_need(job, hit) < room - expected
        else:
            fits = self._whole_bytes(job) - hit * kv <= room
            if fits:
                self._make_room((job.input_tokens - hit) * kv + state)
        self.cache.unpin(node)
        return fits, hit

    def _slots_at_admission(self, job: Job) -> int:
        """State slots admitted ``job`` takes at once: all of them, but with
        ``engine.request_admission=sglang`` only the copy of its hit's state (taken as it was
        matched, :meth:`_free_state_slot`); SGLang allocates the others for the whole pass
        after it (``prepare_for_extend``: ``alloc_req_slots``), every hit of the pass locked
        and every match's state refreshed first."""
        if self.settings.request_admission != "sglang":
            return self.pool.slots_per_request
        return 1 if job.hit > 0 else 0

    def _free_state_slot(self) -> None:
        """With a separate SSM pool, a queued request matched with a hit gets a slot for its
        copy of the hit's state there and then (SGLang's ``init_next_round_input``: Mamba
        copy-on-write, ``evict_mamba`` with the hit locked when no slot is free), admitted or
        not: a request that does not fit gives the slot back, the evictions stay."""
        cache = self.cache
        if self.pool.ssm_budget is not None and cache.ckpt_bytes > cache.ssm_free:
            freed, _ = evictor.evict_states(cache, cache.ckpt_bytes, self.step.eviction)
            self.pool.evicted_bytes += freed

    def _whole_bytes(self, job: Job) -> float:
        """``job``'s whole KV (input, outputs) and its state where the KV budget holds it."""
        return (job.input_tokens + job.decode_end + 1) * self.model.kv_bytes_per_token + (
            self._state_in_kv
        )

    def _admit_head(self, job: Job, index: int) -> None:
        """The queue's head starts (``index``: its place among this pass's admissions)."""
        self._note_queue()
        self.waiting.popleft()
        scheduled, first = job.scheduled, job.order < 0
        job.batch_rank = self._rank(index)
        self._start(job, job.input_tokens * self.model.kv_bytes_per_token + self._state_in_kv)
        if self.pool.ssm_budget is not None:
            self._hold_slots(job, self._slots_at_admission(job))
        if first:
            job.order, self.pool.started = self.pool.started, self.pool.started + 1
        else:  # recomputed: the request was scheduled once already
            job.scheduled = scheduled

    def _sglang_pass_opens(self) -> bool:
        """Whether SGLang's scheduler tries to admit now (``_get_new_batch_prefill_raw``):
        not while its batch is full (since a request did not fit or ``max_running`` was
        reached, until a request leaves), unless a prompt is still being prefilled (its
        chunked request goes on). A pass with requests queued refreshes the first
        ``WAITING_QUEUE_PREFIX_MATCH_MAX`` queued prefixes, the head last, every
        ``WAITING_PREFIX_REFRESH_INTERVAL``-th time (``_touch_waiting_prefixes``, on by
        default with LRU and FCFS: ``SGLANG_ENABLE_WAITING_PREFIX_REFRESH``)."""
        if not self._batch_members():  # SGLang's running batch is empty
            self._batch_full = False
        prefilling = self._any_prefill()
        if (self._batch_full or not self.waiting) and not prefilling:
            return False
        if len(self.running) >= self.max_running and not prefilling:
            self._batch_full = True
            return False
        if self.waiting:
            if self._passes % WAITING_PREFIX_REFRESH_INTERVAL == 0:
                for job in reversed(list(itertools.islice(self.waiting, WAITING_PREFIX_MAX))):
                    self.step.touch_queued(job.req, self._refill(job))
            self._passes += 1
        return True

    def _hold_prompts(self, jobs: list[Job], chunks: float = 0.0, ask: float = 0.0) -> None:
        """Newly started ``jobs`` hold their prompts' KV (and running prompts their next
        ``chunks`` bytes), cached entries evicted for all of them at once (their hits are
        pinned since they started). On SGLang's paged pool the eviction first asks ``ask``
        free, every extend and one page per request (``alloc_paged_token_slots_extend``)."""
        need = sum(job.reserved for job in jobs) + chunks
        if not need:
            return
        if self._kv_page > 1:
            self._evict_for(ask)
        if not self._make_room(need):
            who = jobs[-1] if jobs else self.running[0]
            raise RuntimeError(
                f"engine.kv_pool=shared: request {who.req.request_id} needs "
                f"{need / 1e9:.4g} GB and nothing running or cached can free it "
                "(cache.size_gb + engine.running_memory_gb too small)"
            )
        self._hold(need)

    def _sglang_need(self, job: Job, hit: int) -> float:
        """Bytes SGLang's ``add_one_req`` asks free for a queued request with ``hit`` tokens
        cached: its uncached input, its clipped output, one page (``per_req_token_overhead``)
        and its state where the KV budget holds it."""
        tokens = job.input_tokens - hit + min(job.outputs_left, CLIP_MAX_NEW_TOKENS)
        return (tokens + self._kv_page) * self.model.kv_bytes_per_token + self._state_in_kv

    def _expected_bytes(self) -> float:
        """KV the decoding requests are expected to still write (``PrefillAdder``'s running
        offset): each its clipped outputs left times the new token ratio (1 with
        ``engine.ignore_eos``), plus, with mixed batching, its next step's token (SGLang's
        ``num_mixed_decode_tokens`` with ``--enable-mixed-chunk``). A prompt still being
        prefilled is not in SGLang's running batch: its next chunk charges it
        (:meth:`_continue_prompts`)."""
        ratio = 1.0 if self.settings.ignore_eos else self._ratio.current
        mixed = self.settings.batching == "mixed"
        expected = 0.0
        for job in self.running:
            if job.prefilled >= job.input_tokens:
                expected += min(job.outputs_left, CLIP_MAX_NEW_TOKENS) * ratio + mixed
        return expected * self.model.kv_bytes_per_token

    def _reserve_decode(self, limit: int | None) -> int:
        """Hold the KV of the next decode steps of every decoding request: evict cached
        entries, and when they cannot make room for one step, preempt running requests
        (``engine.preemption``) until it fits; SGLang's ``check_decode_mem`` first evicts what
        it can, in vain or not (:meth:`_evict_for`). Returns the steps held (>= 1; at most ``limit``,
        None: up to the first request's end): those the free bytes hold once the first step
        evicted what it lacked (an engine allocates step by step and evicts only then)."""
        kv = self.model.kv_bytes_per_token
        sglang = self.settings.preemption == "sglang"
        self._retracted = self._decode_skipped = False
        while True:
            decoders = self._decoders()
            if not decoders:
                return limit or 0
            per_step = self._step_need(decoders)
            if self._evict_for(per_step) if sglang else self._make_room(per_step):
                break
            if self.settings.overlap and len(decoders) < len(self._batch_members()):
                # a finishing request's queued result frees its KV at this step's end: the
                # decode sits the step out rather than retract (``update_running_batch``)
                self._decode_skipped, self._batch_full = True, False
                return 0
            self._retracted = True
            if sglang and len(decoders) > 1:
                self._retract(decoders)
            else:
                self._preempt()
        if self._retracted:  # what the kept requests show becomes the ratio
            self._ratio.retracted(
                [j.req.output_len - j.outputs_left for j in decoders],
                [j.req.output_len for j in decoders],
            )
        steps = min(j.decode_left for j in decoders) if limit is None else limit
        if self._kv_page > 1:
            return self._hold_paged_steps(decoders, steps)
        if steps > 1:  # the steps the free bytes hold; the next evicts when it must
            steps = max(1, min(steps, int(self.cache.free_bytes // per_step)))
        for job in decoders:
            job.reserved += steps * kv
        self._hold(per_step * steps)
        return steps

    def _step_need(self, decoders: list[Job]) -> float:
        """Bytes the next decode step of ``decoders`` takes: a token each, or on SGLang's paged
        pool a page for each whose token starts one (``new_tokens_required_next_decode``)."""
        kv, page = self.model.kv_bytes_per_token, self._kv_page
        if page == 1:
            return len(decoders) * kv
        return sum(1 for j in decoders if j.pad == 0) * page * kv

    def _hold_paged_steps(self, decoders: list[Job], steps: int) -> int:
        """SGLang's paged pool: after its decode memory check, each step's allocation asks a
        page free per decoding request (``alloc_paged_token_slots_decode``), evicting when the
        free pages are fewer. Holds the first step and those after it that find that many
        free (the next evicts when it must), at most ``steps``; returns how many."""
        kv, page = self.model.kv_bytes_per_token, self._kv_page
        spare = len(decoders) * page
        self._evict_for(spare * kv)
        ends = np.array([j.input_tokens + j.decoded for j in decoders])
        free = int(self.cache.free_bytes // kv)
        held = 0
        for step in range(steps):
            if step and free - held < spare:
                break
            held += page * int(np.count_nonzero((ends + step) % page == 0))
        else:
            step = steps
        grown = 0.0
        for job, end in zip(decoders, ends, strict=True):
            job.reserved += step * kv
            grown += step * kv + self._repad(job, int(end) + step)
        self._hold(grown)
        return step

    def _preempt(self) -> None:
        """Preempt one running request (recompute): its progress is dropped, its memory freed
        and it goes back to the front of the queue (preempted requests in their first
        scheduling order). LIFO: the most recently scheduled; FIFO: the earliest; ``sglang``
        (:meth:`_retract`) with at most one request decoding: LIFO."""
        if len(self.running) <= 1:
            raise RuntimeError(
                "engine.kv_pool=shared: one running request does not fit the pool "
                "(cache.size_gb + engine.running_memory_gb too small)"
            )
        victim = self.running.pop(0 if self.settings.preemption == "fifo" else -1)
        self._drop_progress(victim)
        i = 0
        while (
            i < len(self.waiting)
            and self.waiting[i].preemptions
            and self.waiting[i].order < victim.order
        ):
            i += 1
        self.waiting.insert(i, victim)

    def _retract(self, decoders: list[Job]) -> None:
        """SGLang's ``retract_decode`` (``engine.preemption=sglang``): decoding requests are
        retracted, the fewest outputs first (ties: the longest prompt, then the latest in the
        batch), at least one and then until the rest fit their next step (``check_decode_mem``),
        one always kept; after each, cached entries are evicted toward
        ``RETRACT_DECODE_STEPS`` steps of the rest (``release_req``). Retracted requests free
        their KV uncached (``release_kv_cache(is_insert=False)``) and join the back of the
        queue (``_add_request_to_queue`` under FCFS). The batch keeps the rest in the order
        they were sorted in (``filter_batch(keep_indices=...)``): the most outputs first."""
        kv = self.model.kv_bytes_per_token
        order = sorted(
            sorted(decoders, key=lambda j: j.batch_rank),  # ties: the batch's order
            key=lambda j: (  # its outputs (``len(output_ids)``: the queued token not yet)
                j.input_tokens - j.req.input_tokens + j.decoded + 1 - j.in_flight,
                -j.req.input_tokens,
            ),
            reverse=True,
        )
        first = True
        while len(order) > 1 and (first or not self._evict_for(self._step_need(order))):
            first = False
            victim = order.pop()
            self._batch_full = False  # the batch shrank
            self.running.remove(victim)
            self._drop_progress(victim)
            self.waiting.append(victim)
            self._evict_for(len(order) * RETRACT_DECODE_STEPS * kv)  # ``release_req``
        for index, job in enumerate(order):  # the batch keeps them in this order
            job.batch_rank = self._rank(index)

    def _evict_for(self, need: float) -> bool:
        """Whether ``need`` bytes are free after evicting cached entries until they are or
        nothing unpinned is left (SGLang's ``evict_from_tree_cache``; :meth:`_make_room`
        evicts nothing when it cannot make the whole room)."""
        cache = self.cache
        if need > cache.free_bytes:
            freed, _ = cache.evict(need, self.step.eviction)
            self.pool.evicted_bytes += freed
        return need <= cache.free_bytes

    def _drop_progress(self, victim: Job) -> None:
        """A preempted (retracted) request, out of the running set: its progress is counted as
        recomputed and dropped, its pin and memory given back."""
        pool = self.pool
        pool.preemptions += 1
        pool.preempted.add(victim.req.request_id)
        pool.recomputed_tokens += victim.prefilled - victim.hit + victim.decoded
        victim.preemptions += 1
        self._release(victim)
        victim.resume()
        self._note_queue()

    def _release(self, victim: Job) -> None:
        """A preempted request gives back its pin and its memory."""
        assert victim.started is not None
        self.step.abort(victim.started)
        self._hold(-victim.reserved)
        victim.reserved, victim.pad, victim.started = 0.0, 0, None
        if victim.slots:
            self._hold_slots(victim, -victim.slots)

    def _published(self, job: Job, released: float, earlier: float) -> None:
        """A prompt published at prefill end now lies in the (pinned) cache, its ``released``
        KV bytes (positions ``published_to`` to the input's end) no longer held by the job.
        The job holds back what is still its own: past where its own slots start once
        published (:meth:`RequestStep.own_from`; SGLang frees the duplicates of what another
        request published meanwhile, ``_insert_cache``), or without that rule what the cache
        did not take beside the ``earlier`` bytes its chunks published. Nothing past what was
        published moves: a recomputed request's sampled outputs (prefilled again with its
        prompt, :meth:`Job.resume`) are published with it on a tree of tokens, a hybrid's with
        the state at their end (:meth:`_refill`), and stay its own elsewhere, its last chunk's
        too."""
        assert job.started is not None
        published = job.started.published
        own_from = self.step.own_from(job.started)
        kv = self.model.kv_bytes_per_token
        if published is None:
            moved = 0.0
        elif own_from is None:
            moved = min(float(published.kv_bytes) - earlier, released)
        else:
            moved = min(max(own_from - max(job.hit, job.published_to), 0) * kv, released)
        # the insertion may have filled the room with a state of its own: make it again
        self._make_room(released - moved)
        job.reserved += released - moved
        self._hold(released - moved)

    def _make_room(self, need: float) -> bool:
        """Whether ``need`` bytes are free in the pool, after evicting cached entries in the
        eviction policy's order (:meth:`PrefixCache.evict`); nothing is evicted when even all
        unpinned entries would not make the room."""
        cache = self.cache
        if need <= cache.free_bytes:
            return True
        if need > cache.free_bytes + self._evictable():
            return False
        freed, _ = cache.evict(need, self.step.eviction)
        self.pool.evicted_bytes += freed
        return need <= cache.free_bytes

    def _evictable(self) -> float:
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

    def _hold(self, delta: float) -> None:
        """Running sequences hold ``delta`` more bytes; the cache's capacity is the rest."""
        pool = self.pool
        pool.held += delta
        pool.peak_held = max(pool.peak_held, pool.held)
        self.cache.capacity = pool.budget - pool.held
        self._check_pool()

    def _check_pool(self) -> None:
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
