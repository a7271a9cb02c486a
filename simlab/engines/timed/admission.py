"""FCFS admission into the timed engine's shared KV pool (``engine.kv_pool=shared``): whole
requests, or SGLang's ``PrefillAdder`` with its new token ratio under
``engine.request_admission=sglang`` (:mod:`simlab.engines.timed.new_token_ratio`). A request is
admitted when its KV fits the pool (:class:`simlab.engines.timed.kv_pool.KVPool`) and starts on
the prefix tree (:class:`simlab.engines.timed.tree.TreeJobs`)."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

from simlab.engines.timed.jobs import Job, clipped_max_new
from simlab.engines.timed.new_token_ratio import (
    CLIP_MAX_NEW_TOKENS,
    WAITING_PREFIX_MAX,
    WAITING_PREFIX_REFRESH_INTERVAL,
)

if TYPE_CHECKING:
    from simlab.engines.timed.kv_pool import KVPool
    from simlab.engines.timed.tree import TreeJobs
    from simlab.engines.timed.world import TimedWorld


class Admission:
    """Who of ``world``'s queue starts, and the prompt memory they then hold in ``kv``."""

    def __init__(self, world: TimedWorld, kv: KVPool, tree: TreeJobs):
        self.world, self.kv, self.tree = world, kv, tree
        self.step, self.cache, self.model = world.step, world.cache, world.model
        self.settings, self.pool = world.settings, world.pool

    def schedule(self) -> None:
        """FCFS admission into the shared pool. A request is admitted when its whole KV (input
        beyond its hit, output, one SSM state) could fit in the free and evictable bytes (its
        own hit protected); it then holds its prompt's KV at once (cached entries evicted for
        it in the policy's order) and its output's token by token
        (:meth:`Preemption.reserve_decode`). Otherwise it waits; with nothing running it is
        admitted whatever its hit (cached entries evicted for its whole KV, the hit's included
        if need be). With a separate SSM pool its state is not in the KV budget: it takes its
        slots there (:meth:`KVPool.hold_slots`), and the running requests are capped as SGLang
        caps them (:meth:`KVPool.open`).
        ``engine.request_admission=sglang``: it must fit beside what the running requests and
        those admitted in this pass are expected to still write (:meth:`expected_bytes`);
        each candidate is matched (:meth:`RequestStep.match_queued`), the one that does not
        fit included, before the pass evicts for the prompts it admitted, all at once
        (SGLang's ``PrefillAdder`` loop, then ``prepare_for_extend``); the pass admits nobody
        once the step's prefill chunks fill its token budget (:meth:`continue_prompts`), the
        last one admitted perhaps only in part (the next chunked request), or spend
        ``engine.max_prefill_tokens`` (``rem_input_tokens``; without chunked prefill a prompt
        that reaches what is left of it waits unless it is the first: :meth:`_under_input_cap`)."""
        world = self.world
        sglang = self.settings.request_admission == "sglang"
        if sglang and not self._sglang_pass_opens():
            return
        expected = self.expected_bytes() if sglang else 0.0
        mixed = len(world.batch_members()) if sglang and self.settings.batching == "mixed" else 0
        room = world.budget - mixed if sglang else math.inf
        spent, chunk_bytes, added, ask = (
            self.continue_prompts(expected, room) if sglang else (0, 0.0, 0.0, 0.0)
        )
        room -= spent
        cap = self.settings.max_prefill_tokens
        inputs = math.inf if cap is None else cap - mixed - spent  # ``rem_input_tokens``
        expected += added
        world.batch.admission_passes += 1
        batch: list[Job] = []  # sglang: admitted in this pass, their prompts not held yet
        admitted: list[Job] = []
        while world.waiting and not self._admission_stops(sglang, min(room, inputs)):
            job = world.waiting[0]
            if not world.feeder.ready(job):
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
                world.batch.full = True  # ``budget_state``: NO_TOKEN
                break
        if sglang and self.pool.ssm_budget is not None:  # prepare_for_extend's alloc_req_slots
            for job in admitted:
                self.kv.hold_slots(job, self.pool.slots_per_request - job.slots)
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
            if self.world.running:
                self.world.batch.full = sglang
                self.world.stats.stalled.add(job.req.request_id)
                return False
            self.kv.make_room(self.kv.whole_bytes(job))
            return True
        page = self.kv.page
        return not sglang or -(-(job.input_tokens - hit) // page) * page <= room or room >= page

    def _under_input_cap(self, job: Job, hit: int, inputs: float) -> bool:
        """Whether the pass, chunked prefill off (``engine.token_budget=null``), admits the
        queue's head beside the requests it admitted: only if its page-ceiled extend is below
        the ``inputs`` tokens left of ``engine.max_prefill_tokens`` (SGLang's
        ``_select_prefill_admission``; the first one is admitted whatever its length). With
        chunks the cap only ends the pass once spent (:meth:`_admission_stops`)."""
        if not math.isinf(self.world.budget):
            return True
        page = self.kv.page
        return -(-(job.input_tokens - hit) // page) * page < inputs

    def _room_left(self, expected: float, batch: list[Job], chunks: float) -> bool:
        """Whether the pool still has room after this pass's admissions (SGLang's
        ``budget_state`` after ``add_one_req``: free and evictable tokens beyond what the pass
        charged). The check found room for the request's raw extend and the outputs it has
        left (:meth:`_sglang_need`); the pass charges its page-ceiled extend and, for a
        retracted request, every output it may sample (:func:`clipped_max_new`), so the room
        can run out with the last one admitted: SGLang's batch is then full."""
        pending = sum(j.reserved for j in batch) + chunks
        return self.cache.free_bytes + self.kv.evictable() - pending - expected > 0

    def _admission_stops(self, sglang: bool, room: float) -> bool:
        """Whether the pass admits nobody more: the step's token budget or SGLang's
        ``engine.max_prefill_tokens`` is spent (``room``: the fewer tokens either leaves;
        ``budget_state``: OTHER), ``max_running`` is reached (with ``sglang`` the batch is then
        full), or SGLang's batch is full (a prefill-only step kept the flag: its chunk goes
        on)."""
        if room <= 0:
            return True
        if len(self.world.running) >= self.world.max_running:
            self.world.batch.full = sglang
            return True
        return sglang and self.world.batch.full

    def continue_prompts(self, expected: float, room: float) -> tuple[int, float, float, float]:
        """``engine.request_admission=sglang``: the prompts the budget cut take their next
        chunk first (``add_chunked_req``): as many tokens as the step's budget leaves
        (``room``: less one per decoding request with mixed batching) and, when that is above
        zero, the pool's room beside ``expected``. Returns the tokens charged to the step's
        budgets (``rem_chunk_tokens`` and ``rem_input_tokens``: the chunks page-ceiled), the
        chunks' bytes (held with the pass's admissions; on a paged pool with the rest of
        their last page), the bytes they add to the expected writes (the page-ceiled chunk and
        one page each, and the outputs of a prompt the chunk ends, less what they hold) and
        what their allocation asks free (the chunk and a page each)."""
        kv, page = self.model.kv_bytes_per_token, self.kv.page
        spent = 0
        hold = added = ask = 0.0
        for job in self.world.running:
            if job.held_to >= job.input_tokens:
                continue
            left = job.input_tokens - job.prefilled
            free = int(
                (self.cache.free_bytes + self.kv.evictable() - expected - added - hold) // kv
            )
            take = int(min(left, room, free) if min(room, free) > 0 else min(left, room))
            if take <= 0:
                continue
            job.held_to += take
            job.reserved += take * kv
            grown = take * kv + self.kv.repad(job, job.held_to)
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
        chunk) and goes on in the next steps (:meth:`continue_prompts`). On a paged pool its
        extend is charged page-ceiled, a cut one ends on a page (SGLang's
        ``_select_prefill_admission``; the hit is whole pages) and a whole one holds the rest
        of its last page. Returns the budget it charged, the bytes the pass reserves for it
        beyond what it holds (one page, and its outputs unless the prompt was cut:
        ``_update_prefill_budget``) and what its allocation asks free (its extend and a page,
        ``alloc_paged_token_slots_extend``)."""
        kv, page = self.model.kv_bytes_per_token, self.kv.page
        extend = job.input_tokens - job.hit
        whole = -(-extend // page) * page
        if whole <= room:
            self.kv.repad(job, job.input_tokens)
            return whole, (clipped_max_new(job) + page) * kv, (extend + page) * kv
        take = int(max(room, 0)) // page * page
        job.held_to = job.hit + take
        job.reserved -= (extend - take) * kv
        return take, page * kv, (take + page) * kv

    def _fits(self, job: Job, expected: float, pending: float) -> tuple[bool, int]:
        """Whether queued ``job`` fits the free and evictable bytes less ``pending`` (prompts
        admitted in this pass, not held yet), its own hit pinned meanwhile; without
        ``engine.request_admission=sglang`` the room for its prompt is then made. Returns that
        and its hit (tokens)."""
        kv, state = self.model.kv_bytes_per_token, self.kv.state_in_kv
        sglang = self.settings.request_admission == "sglang"
        if sglang:
            hit, node = self.step.match_queued(job.req, job.refill)
        else:
            hit, node = self.step.peek_hit(job.req)
        self.cache.pin(node)
        if sglang and hit > 0:
            self.kv.free_state_slot()
        room = self.cache.free_bytes + self.kv.evictable() - pending
        if sglang:
            fits = self._sglang_need(job, hit) < room - expected
        else:
            fits = self.kv.whole_bytes(job) - hit * kv <= room
            if fits:
                self.kv.make_room((job.input_tokens - hit) * kv + state)
        self.cache.unpin(node)
        return fits, hit

    def _slots_at_admission(self, job: Job) -> int:
        """State slots admitted ``job`` takes at once: all of them, but with
        ``engine.request_admission=sglang`` only the copy of its hit's state (taken as it was
        matched, :meth:`KVPool.free_state_slot`); SGLang allocates the others for the whole pass
        after it (``prepare_for_extend``: ``alloc_req_slots``), every hit of the pass locked
        and every match's state refreshed first."""
        if self.settings.request_admission != "sglang":
            return self.pool.slots_per_request
        return 1 if job.hit > 0 else 0

    def _admit_head(self, job: Job, index: int) -> None:
        """The queue's head starts (``index``: its place among this pass's admissions)."""
        self.world.note_queue()
        self.world.waiting.popleft()
        scheduled, first = job.scheduled, job.order < 0
        job.batch_rank = self.world.batch.rank(index)
        self.tree.start(job, job.input_tokens * self.model.kv_bytes_per_token + self.kv.state_in_kv)
        if self.pool.ssm_budget is not None:
            self.kv.hold_slots(job, self._slots_at_admission(job))
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
        if not self.world.batch_members():  # SGLang's running batch is empty
            self.world.batch.full = False
        prefilling = self.world.prefilling()
        if (self.world.batch.full or not self.world.waiting) and not prefilling:
            return False
        if len(self.world.running) >= self.world.max_running and not prefilling:
            self.world.batch.full = True
            return False
        if self.world.waiting:
            if self.world.batch.passes % WAITING_PREFIX_REFRESH_INTERVAL == 0:
                for job in reversed(list(itertools.islice(self.world.waiting, WAITING_PREFIX_MAX))):
                    self.step.touch_queued(job.req, job.refill)
            self.world.batch.passes += 1
        return True

    def _hold_prompts(self, jobs: list[Job], chunks: float = 0.0, ask: float = 0.0) -> None:
        """Newly started ``jobs`` hold their prompts' KV (and running prompts their next
        ``chunks`` bytes), cached entries evicted for all of them at once (their hits are
        pinned since they started). On SGLang's paged pool the eviction first asks ``ask``
        free, every extend and one page per request (``alloc_paged_token_slots_extend``)."""
        need = sum(job.reserved for job in jobs) + chunks
        if not need:
            return
        if self.kv.page > 1:
            self.kv.evict_for(ask)
        if not self.kv.make_room(need):
            who = jobs[-1] if jobs else self.world.running[0]
            raise RuntimeError(
                f"engine.kv_pool=shared: request {who.req.request_id} needs "
                f"{need / 1e9:.4g} GB and nothing running or cached can free it "
                "(cache.size_gb + engine.running_memory_gb too small)"
            )
        self.kv.hold(need)

    def _sglang_need(self, job: Job, hit: int) -> float:
        """Bytes SGLang's ``add_one_req`` asks free for a queued request with ``hit`` tokens
        cached: its uncached input, its clipped output, one page (``per_req_token_overhead``)
        and its state where the KV budget holds it."""
        tokens = job.input_tokens - hit + min(job.outputs_left, CLIP_MAX_NEW_TOKENS)
        return (tokens + self.kv.page) * self.model.kv_bytes_per_token + self.kv.state_in_kv

    def expected_bytes(self) -> float:
        """KV the decoding requests are expected to still write (``PrefillAdder``'s running
        offset): each its clipped outputs left times the new token ratio (1 with
        ``engine.ignore_eos``), plus, with mixed batching, its next step's token (SGLang's
        ``num_mixed_decode_tokens`` with ``--enable-mixed-chunk``). A prompt still being
        prefilled is not in SGLang's running batch: its next chunk charges it
        (:meth:`continue_prompts`)."""
        ratio = 1.0 if self.settings.ignore_eos else self.world.batch.ratio.current
        mixed = self.settings.batching == "mixed"
        expected = 0.0
        for job in self.world.running:
            if job.prefilled >= job.input_tokens:
                expected += min(job.outputs_left, CLIP_MAX_NEW_TOKENS) * ratio + mixed
        return expected * self.model.kv_bytes_per_token
