"""The timed engine on vLLM's hybrid pool, block by block: the timed world's
:class:`simlab.engines.timed.memory.Memory` where ``engine=timed`` with the hybrid
``policy=vllm`` runs where the replay engine does (:mod:`simlab.engines.block_pool`), so at low load
both engines give every request the same hit, evictions and cached bytes.

vLLM has one pool for running requests and the cache: ``cache.size_gb`` (plus
``engine.running_memory_gb`` with ``engine.kv_pool=shared``), so ``running_memory_gb`` does
not limit a separate pool here. Each iteration, in the running order (vLLM's ``Scheduler``):

* every decoder's step takes its blocks (a new running block per Mamba group and a KV block
  when it crosses a block boundary), then prefilling requests take their chunk's: the
  iteration's token budget (``engine.token_budget``, or ``policy.admission.
  max_num_batched_tokens`` where that is set and smaller) less one token per decoder, cut as
  :meth:`simlab.engines.block_pool.HybridPool.chunk` cuts it;
* a step the free queue cannot serve preempts the last running request (recompute, vLLM's
  ``self.running.pop()``; LIFO only), which frees all its blocks, until it can; a request
  that cannot run alone is an error naming ``cache.size_gb``. A preempted request resumes by
  prefilling its prompt and the outputs it sampled (:meth:`simlab.engines.timed.jobs.Job.resume`), looked
  up again; its record keeps the hit of its first scheduling (vLLM's ``num_cached_tokens``);
* unless the step preempted, queued requests are scheduled (FCFS) while their first chunk
  is not empty, the blocks of their whole prefill and of their first chunk (with their hit's
  blocks that sit in the free queue) are free (``allocate_slots`` with
  ``scheduler_reserve_full_isl``), and their hit's state was not cached in this same step
  (``cached_blocks_this_step``); with nothing running, always.

``python -m simlab.crosscheck_load`` checks these rules request by request against vLLM's own
scheduler under load (``crosscheck/vllm_concurrent.py``).

A decode-only span is cut before the first step in which a decoder crosses a block boundary,
so every take happens at a span's first step, before its time passes; within a span only
retirements and full KV blocks change the pool, applied step by step in the running order.

``engine.overlap=true`` is vLLM's async scheduling, its default (``AsyncScheduler``: each step
is scheduled before the last one's output is processed, ``step_with_batch_queue``):

* a request whose last token is in flight is skipped, yet holds its blocks and its running
  slot; its output is processed, and its blocks freed, once the next step is planned (with
  nothing else to schedule, at once, and the step is planned again);
* a step frees Mamba blocks behind the state its request's previous step started from
  (``remove_skipped_blocks`` counts the computed tokens less those in flight), and keys KV
  blocks up to the tokens whose values are known: a decode step's own token is the last
  step's placeholder, so the block it fills is keyed by the next step, or at completion;
* a preempted request's in-flight token is delivered (it resumes with it); a finishing
  request preempted frees its blocks and completes when its last token arrives.

``python -m simlab.crosscheck_load`` checks both loops (the ``*_async`` cases for this one).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from simlab.config import ConfigError
from simlab.engines.block_pool import (
    Peaks,
    PoolFull,
    PoolRun,
    PoolShape,
    committed_tokens,
    pool_record,
    step_pool,
    too_small,
)
from simlab.engines.step import Timing, add_timing
from simlab.engines.timed.jobs import Job
from simlab.engines.timed.preemption import drop_progress, requeue
from simlab.engines.timed.settings import TimedSettings
from traces.format import Request

if TYPE_CHECKING:
    from simlab.engines.timed.memory import MemoryFactory
    from simlab.engines.timed.world import TimedWorld

log = logging.getLogger(__name__)


def check_settings(s: TimedSettings) -> None:
    """vLLM's scheduler preempts the last running request, schedules a request when its first
    chunk's blocks fit and runs prefill chunks beside the decodes."""
    if s.preemption != "lifo":
        raise ConfigError(
            "engine.preemption: vLLM's block pool (policy=vllm) preempts the last running "
            f"request (lifo), got {s.preemption!r} (policy.admission.block_pool=false: the "
            "prefix tree, which takes any)"
        )
    if s.request_admission != "whole":
        raise ConfigError(
            "engine.request_admission: vLLM's block pool (policy=vllm) schedules a request "
            f"when its first chunk's blocks fit (whole), got {s.request_admission!r} "
            "(policy.admission.block_pool=false: the prefix tree, which takes any)"
        )
    if s.batching != "mixed":
        raise ConfigError(
            "engine.batching: vLLM's block pool (policy=vllm) runs prefill chunks beside "
            f"the decodes (mixed), got {s.batching!r} (policy.admission.block_pool=false: "
            "the prefix tree, which takes any)"
        )


class VllmMemory:
    """A timed world's memory that is vLLM's hybrid pool (see the module docstring); a world
    gets it through :meth:`factory`."""

    preempts = True

    def __init__(self, world: TimedWorld, shape: PoolShape):
        s = world.settings
        check_settings(s)
        self.world, self.step, self.settings = world, world.step, s
        self.hybrid, self.committed = step_pool(world.step, shape, s.token_budget)
        self.shape = shape
        assert s.token_budget is not None  # chunked prefill off is SGLang's (TimedSettings)
        world.budget = min(s.token_budget, self.hybrid.max_tokens)
        self._keys: dict[int, list[int]] = {}  # queued request id -> its block keys
        self._chunks: list[tuple[Job, int]] = []  # this step's prefill chunks
        self._planned: list[Job] = []  # this step's decoders
        self._preempted_now = False  # this step preempted a request (so scheduled none)
        #: this step deferred the queue's head: its hit's state was cached in this step
        self._deferred = False
        self._first: dict[int, tuple[int, int]] = {}  # request id -> its first lookup
        #: engine.overlap: vLLM's async scheduling (the module docstring)
        self._async = s.overlap
        #: async: request id -> start of its step in the last scheduler step (still in flight
        #: while the next one is planned), and that map as the step under way found it
        self._in_flight: dict[int, int] = {}
        self._prev: dict[int, int] = {}
        #: async: finishing requests preempted in this step (their last token is in flight)
        self._dropped: list[Job] = []
        self.peaks = Peaks()  # cached bytes at each finish (the replay's peaks)
        world.pool.budget = shape.blocks * shape.block_bytes
        log.info("%s: vLLM's hybrid pool block by block, timed (%s)", world.step.policy, shape)

    @staticmethod
    def factory(shape: PoolShape) -> MemoryFactory:
        """The world's ``memory`` argument for vLLM's pool of ``shape``."""
        return lambda world, requests: VllmMemory(world, shape)

    def peek(self, req: Request) -> tuple[int, int]:
        """``(matched, hit)`` tokens in the pool, read-only (the lookup touches nothing)."""
        run = self.hybrid.open_request(req, self.committed)
        return run.matched_tokens, run.hit_tokens

    def cache_peaks(self) -> dict[str, float]:
        return self.peaks.extras()

    def ended(self) -> None:
        self.world.pool.evicted_bytes = self.hybrid.pool.evicted * self.shape.block_bytes

    # ------------------------------------------------------------------ scheduler steps
    def prefills(self) -> bool:
        return bool(self.prefill_chunks(0))

    def prefill_chunks(self, budget: float) -> list[tuple[Job, int]]:
        """This step's planned chunks, of the requests it did not preempt since."""
        return [(job, take) for job, take in self._chunks if job.pool_run is not None]

    def iteration_decoders(self) -> list[Job]:
        return self._planned

    def decode_fits(self, decoders: list[Job]) -> bool:
        return True  # SGLang's check (request_admission=sglang), which vLLM's pool refuses

    def prompt_done(self, job: Job) -> None:
        """Nothing to publish: the pool cached the prompt's blocks as they were computed."""

    def checkpoint(self, job: Job) -> None:
        """Nothing to publish (see :meth:`prompt_done`)."""

    def schedule(self) -> None:
        """vLLM's scheduler step: every running request's step takes its blocks, in the
        running order (a decoder's one token, a prefilling request's chunk within the budget
        left); then, unless that preempted a request, queued requests are scheduled
        (:meth:`_admit`). The GPU loop then runs it as a mixed iteration when it has prefill
        chunks (:meth:`prefills`), else as a decode span."""
        preemptions = self.world.pool.preemptions
        self.hybrid.fresh.clear()
        self._deferred = False
        self._prev, self._in_flight = self._in_flight, {}
        decoders = self.world.decoders()
        budget = int(self.world.budget) - len(decoders)  # finite: vLLM always chunks
        self._chunks = []
        asynchronous = self._async
        for job in list(self.world.running):
            run = job.pool_run
            if run is None:  # preempted in this loop (or, async, finishing)
                continue
            if job.prefilled < job.input_tokens:
                if budget > 0:
                    budget -= self._prefill_step(job, budget)
            elif job.decoded < job.decode_end:
                n = job.input_tokens + job.decoded
                # ``not run.idle(n + 1, known)``, inlined: async, its token (n) is in flight
                if n >= run.idle_end or (n if asynchronous else n + 1) > run.idle_upto:
                    self._step(job, n, n + 1, known=n if asynchronous else None)
        self._planned = [j for j in decoders if j.pool_run is not None]
        self._preempted_now = self.world.pool.preemptions > preemptions
        if not self._preempted_now:
            self._admit(budget)
        self.hybrid.release()  # the step's copies of partial blocks have run
        self._launch(self.prefill_chunks(0))

    def _launch(self, chunks: list[tuple[Job, int]]) -> None:
        """The planned step's ``chunks`` and decoders go in flight (async: their starts, for
        the next step); a step with none is an error, unless (async) requests finishing
        complete and the step is planned again."""
        if self._async:
            self._in_flight = {j.req.request_id: j.prefilled for j, _ in chunks}
            for job in self._planned:
                self._in_flight[job.req.request_id] = job.input_tokens + job.decoded
        empty = self.world.running and not chunks and not self._planned
        if empty and not (self._async and self._completions_due()):
            raise RuntimeError(
                f"vLLM's block pool: {len(self.world.running)} requests running, none scheduled"
            )

    def _admit(self, budget: int) -> None:
        """FCFS: the queue's head is scheduled, and its first chunk's blocks taken, when
        they and its hit's blocks in the free queue are free; with nothing running, always."""
        queue = self.hybrid.pool
        while (
            self.world.waiting
            and budget > 0
            and len(self.world.running) < self.settings.running_cap
        ):
            job = self.world.waiting[0]
            if not self.world.feeder.ready(job):
                return
            run = self._open(job)
            if run.hits_fresh_state():
                self._deferred = True
                return
            if not run.first_chunk(budget):
                return
            free = len(queue.queue)
            if (
                self.world.running
                and queue.finite
                and (run.full_need() > free or run.first_need(budget) > free)
            ):
                self.world.stats.stalled.add(job.req.request_id)
                return
            self.world.note_queue()
            self.world.waiting.popleft()
            self._start_run(job, run)
            budget -= self._prefill_step(job, budget)

    def _open(self, job: Job) -> PoolRun:
        req = job.req
        keys = self._keys.get(req.request_id)
        if keys is None:
            run = self.hybrid.open_request(req, self.committed)
            self._keys[req.request_id] = run.keys
            return run
        return PoolRun(self.hybrid, keys, req.input_tokens, job.input_tokens)  # resumed

    def _start_run(self, job: Job, run: PoolRun) -> None:
        run.acquire()
        job.pool_run = run
        job.hit = job.prefilled = run.hit_tokens
        job.ckpt_tokens = sorted({c for c in (run.prompt_checkpoint, run.junction) if c > job.hit})
        if self.settings.radix_mlp:
            job.seq = job.req.full_sequence()
        if job.order < 0:  # a recomputed request keeps its first scheduling (and its hit)
            self._first[job.req.request_id] = (run.matched_tokens, run.hit_tokens)
            job.order, self.world.pool.started = (
                self.world.pool.started,
                self.world.pool.started + 1,
            )
            job.scheduled = self.world.env.now
        else:
            self.world.resume_hits.setdefault(job.req.request_id, []).append(run.hit_tokens)
        self.world.running.append(job)

    # ------------------------------------------------------------------ steps

    def _step(
        self, job: Job, start: int, end: int, checkpoint: int = 0, known: int | None = None
    ) -> bool:
        """``job``'s step takes its blocks, preempting the last running requests until the
        free queue serves it. False when ``job`` itself was preempted. Async: its step in
        flight, if any, is not processed yet (:meth:`PoolRun.step`'s ``processed``), and only
        the ``known`` tokens key blocks."""
        run = job.pool_run
        assert run is not None
        processed = self._prev.get(job.req.request_id, start) if self._async else None
        while True:
            try:
                run.step(start, end, checkpoint, processed, known)
            except PoolFull:
                if not self.world.running or self.world.running == [job]:
                    raise too_small(self.shape, job.req) from None
                victim_is_job = self.world.running[-1] is job
                self._preempt()
                if victim_is_job:
                    return False
                continue
            self._note_held()
            return True

    def _note_held(self) -> None:
        queue = self.hybrid.pool
        held = (queue.made - len(queue.queue)) * self.shape.block_bytes
        self.world.pool.held = held
        self.world.pool.peak_held = max(self.world.pool.peak_held, held)

    def _release(self, victim: Job) -> None:
        """A preempted request frees all its blocks (cached ones stay cached)."""
        assert victim.pool_run is not None
        victim.pool_run.finish()
        victim.pool_run = None

    def _preempt(self) -> None:
        """The last running request is preempted (:func:`drop_progress`, :func:`requeue`).
        Async: a finishing one (its last token in flight, so no step scheduled it) frees its
        blocks, unkeyed ones uncached, and completes when that token is processed: vLLM
        delivers a preempted request's stale output, and its last token stops it in the
        queue."""
        running = self.world.running
        victim = running.pop()
        if not (self._async and self._finishing(victim)):
            drop_progress(self.world, victim, self._release)
            requeue(self.world.waiting, victim)
            return
        assert victim.pool_run is not None
        victim.pool_run.finish()
        victim.preemptions += 1
        pool = self.world.pool
        pool.preemptions += 1
        pool.preempted.add(victim.req.request_id)
        self._dropped.append(victim)

    @staticmethod
    def _finishing(job: Job) -> bool:
        """Whether ``job`` sampled its last token (async: in the step still in flight)."""
        return job.decoded >= job.decode_end and job.prefilled >= job.input_tokens

    def _prefill_step(self, job: Job, budget: int) -> int:
        """``job``'s next prefill chunk within ``budget``, its blocks taken; its tokens."""
        run = job.pool_run
        assert run is not None
        start = job.prefilled
        end, checkpoint = self.hybrid.chunk(
            start, job.req.input_tokens, run.junction, budget, job.input_tokens
        )
        if end <= start or not self._step(job, start, end, checkpoint):
            return 0
        self._chunks.append((job, end - start))
        return end - start

    def span_plan(self) -> tuple[list[Job], int]:
        """The planned decoders (their first step's blocks taken) and the span's steps: up to
        the first request's end, before the next step in which a decoder crosses a block
        boundary (it takes blocks), before the next step that retires a Mamba block when a
        queued request could be scheduled in the room it frees (vLLM frees it in that step's
        running pass, then schedules the queue), on a Transformer likewise before the next
        step that fills a KV block (its running pass caches the block, which a queued
        request's hit may then reach), one step when a request still prefills (it got no
        tokens in this one), when this step preempted one (it scheduled none) or when it
        deferred the queue's head, whose hit's state it cached (the next step schedules it)."""
        size, decoders = self.shape.block, self._planned
        firsts = [j.input_tokens + j.decoded for j in decoders]
        steps = min(j.decode_end - j.decoded for j in decoders)
        steps = min(steps, *(size - n % size for n in firsts))
        if self.world.waiting and self._async and self._completions_due():
            steps = 1  # they free blocks and slots before the next step is scheduled
        elif self.world.waiting and len(self.world.running) < self.settings.running_cap:
            retire = 2 if self._async else 1  # async: a step behind (its basis is processed)
            steps = min(steps, *((retire - n) % size or size for n in firsts))
            if self._async and self.shape.state_groups and self._basis_jumps(decoders):
                steps = 1
            if not self.shape.state_groups and not self._async:
                # a Transformer: a filled block is a longer hit (async: keyed once its last
                # token is known, in the step that takes the next block: a span's first)
                steps = min(steps, *((size - 1 - n) % size or size for n in firsts))
        if (
            any(j.prefilled < j.input_tokens for j in self.world.running)
            or (self._preempted_now and self.world.waiting)
            or self._deferred
        ):
            steps = 1
        return decoders, steps

    def _completions_due(self) -> bool:
        """Async: whether requests finished in the last step complete after this one was
        planned (:meth:`_complete_finished`)."""
        return bool(self._dropped) or any(self._finishing(j) for j in self.world.running)

    def _basis_jumps(self, decoders: list[Job]) -> bool:
        """Async: whether a decoder's processed tokens jump by more than one token at the
        span's second step (the first step ran after a prefill chunk, not a decode step)."""
        first = self._prev.get
        return any(
            first(j.req.request_id, n) < n - 1
            for j, n in ((j, j.input_tokens + j.decoded) for j in decoders)
        )

    def span_ran(self, decoders: list[Job], done: int) -> None:
        """Steps 1 .. ``done - 1`` of the span, in order: those that retire a Mamba block or
        fill a KV block (the others change nothing; none takes a block)."""
        lag = self._async
        for _, rank, n in sorted(self._span_events(decoders, done)):
            run = decoders[rank].pool_run
            assert run is not None
            if lag:
                run.step(n, n + 1, processed=n - 1, known=n)
            else:
                run.step(n, n + 1)
        if lag:  # each decoder's last step is in flight
            for job in decoders:
                self._in_flight[job.req.request_id] = job.input_tokens + job.decoded - 1

    def _span_events(self, decoders: list[Job], done: int) -> list[tuple[int, int, int]]:
        """``(step, decoder rank, position)`` of the span's steps 1 .. ``done - 1`` that change
        the pool: synchronously those retiring a Mamba block (position 1 past a boundary) or
        filling a KV block; async those retiring one a step later (position 2), and a
        decoder's second step when its first followed a prefill chunk (its processed tokens
        jump); a Transformer's async steps here key nothing (its keys wait for a take)."""
        size, events = self.shape.block, list[tuple[int, int, int]]()
        if self._async and not self.shape.state_groups:
            return events
        for rank, job in enumerate(decoders):
            first = job.input_tokens + job.decoded - done
            if not self._async:
                hits = [k for k in range(1, done) if (first + k) % size in (1, size - 1)]
            else:
                jump = self._prev.get(job.req.request_id, first) < first - 1
                hits = [k for k in range(1, done) if (first + k) % size == 2 or (jump and k == 1)]
            events += [(k, rank, first + k) for k in hits]
        return events

    # ------------------------------------------------------------------ completion

    # ------------------------------------------------------------------ completion
    def complete(self, finished: list[Job]) -> None:
        """The requests done complete in running order; async: then the finishing ones this
        step preempted (the last in the step they finished in)."""
        for job in finished:
            self._finish(job)
        dropped, self._dropped = self._dropped, []
        for job in reversed(dropped):
            assert job.pool_run is not None
            job.finished = self.world.env.now
            self._record(job, job.pool_run)

    def _finish(self, job: Job) -> None:
        run = job.pool_run
        assert run is not None
        req = job.req
        job.finished = self.world.env.now
        if self._async:  # its last step's tokens are known now (``update_from_output``)
            run.key(job.input_tokens + job.decoded)
        for n in range(
            job.input_tokens + max(job.decoded, 0), committed_tokens(req, self.committed)
        ):
            self._step(job, n, n + 1)  # the last sampled token's KV (``committed`` off)
        run.finish()
        self._record(job, run)

    def _record(self, job: Job, run: PoolRun) -> None:
        """``job`` completed, its blocks freed: its record."""
        req, world = job.req, self.world
        del self._keys[req.request_id]
        world.preempted_counts[req.request_id] = job.preemptions
        matched, hit = self._first.pop(req.request_id)
        record = pool_record(req, world.model, self.step.policy, self.hybrid, run, matched, hit)
        add_timing(
            record,
            Timing(
                arrival=job.arrival,
                scheduled=job.scheduled,
                first_token=job.first_token,
                finished=job.finished,
                prefill_time=world.cost.prefill_time(hit, req.input_tokens - hit),
            ),
        )
        self._note_held()
        self.peaks.note(record)
        world.complete(job, record, (record.cache_kv_bytes, record.cache_ssm_bytes))
