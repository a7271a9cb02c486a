"""The timed engine on vLLM's hybrid pool, block by block: ``engine=timed`` with the hybrid
``policy=vllm`` runs where the replay engine does (:mod:`simlab.vllm_pool`), so at low load
both engines give every request the same hit, evictions and cached bytes.

vLLM has one pool for running requests and the cache: ``cache.size_gb`` (plus
``engine.running_memory_gb`` with ``engine.kv_pool=shared``), so ``running_memory_gb`` does
not limit a separate pool here. Each iteration, in the running order (vLLM's ``Scheduler``):

* every decoder's step takes its blocks (a new running block per Mamba group and a KV block
  when it crosses a block boundary), then prefilling requests take their chunk's: the
  iteration's token budget (``min(engine.token_budget, max_num_batched_tokens)``) less one
  token per decoder, cut as :meth:`simlab.vllm_pool.HybridPool.chunk` cuts it;
* a step the free queue cannot serve preempts the last running request (recompute, vLLM's
  ``self.running.pop()``; LIFO only), which frees all its blocks, until it can; a request
  that cannot run alone is an error naming ``cache.size_gb``. A preempted request resumes by
  prefilling its prompt and the outputs it sampled (:meth:`simlab.timed_jobs.Job.resume`), looked
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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import simpy

from simlab.config import ConfigError
from simlab.costmodel import CostModel
from simlab.records import RequestRecord
from simlab.step import RequestStep, Timing, add_timing
from simlab.timed import Job, TimedSettings, TimedWorld
from simlab.vllm_pool import (
    Peaks,
    PoolFull,
    PoolRun,
    PoolShape,
    committed_tokens,
    pool_record,
    step_pool,
    too_small,
)
from traces.format import Request

log = logging.getLogger(__name__)


class PoolWorld(TimedWorld):
    """A timed world whose memory is vLLM's hybrid pool (see the module docstring)."""

    def __init__(
        self,
        requests: Sequence[Request],
        step: RequestStep,
        cost: CostModel,
        s: TimedSettings,
        shape: PoolShape,
        env: simpy.Environment | None = None,  # a cluster's replicas share one
    ):
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
        super().__init__(requests, step, cost, s, env)
        self.shared = False  # the pool holds running requests: no budget split to keep
        self.hybrid, self.committed = step_pool(step, shape)
        self.shape = shape
        assert s.token_budget is not None  # chunked prefill off is SGLang's (TimedSettings)
        self._budget = min(s.token_budget, self.hybrid.max_tokens)
        self._keys: dict[int, list[int]] = {}  # queued request id -> its block keys
        self._chunks: list[tuple[Job, int]] = []  # this step's prefill chunks
        self._planned: list[Job] = []  # this step's decoders
        self._preempted_now = False  # this step preempted a request (so scheduled none)
        self._first: dict[int, tuple[int, int]] = {}  # request id -> its first lookup
        self.peaks = Peaks()  # cached bytes at each finish (the replay's peaks)
        self.pool.budget = shape.blocks * shape.block_bytes
        log.info("%s: vLLM's hybrid pool block by block, timed (%s)", step.policy, shape)

    def peek(self, req: Request) -> tuple[int, int]:
        """``(matched, hit)`` tokens in the pool, read-only (the lookup touches nothing)."""
        run = self.hybrid.open_request(req, self.committed)
        return run.matched_tokens, run.hit_tokens

    def cache_peaks(self) -> dict[str, float]:
        return self.peaks.extras()

    def _open_pool(self, requests: Sequence[Request]) -> None:
        """The hybrid pool is the one budget already (see the module docstring)."""

    @property
    def preempts(self) -> bool:
        return True

    # ------------------------------------------------------------------ scheduler steps
    def _schedule(self) -> None:
        """vLLM's scheduler step (:meth:`_plan_step`): the GPU loop then runs it as a mixed
        iteration when it has prefill chunks (:meth:`_any_prefill`), else as a decode span."""
        self._plan_step()

    def _any_prefill(self) -> bool:
        return bool(self._prefill_chunks(0))

    def _plan_step(self) -> None:
        """Every running request's step takes its blocks, in the running order (a decoder's
        one token, a prefilling request's chunk within the budget left); then, unless that
        preempted a request, queued requests are scheduled (:meth:`_admit`)."""
        preemptions = self.pool.preemptions
        self.hybrid.fresh.clear()
        decoders = self._decoders()
        budget = int(self._budget) - len(decoders)  # finite: vLLM always chunks
        self._chunks = []
        for job in list(self.running):
            run = job.pool_run
            if run is None:  # preempted in this loop
                continue
            if job.prefilled < job.input_tokens:
                if budget > 0:
                    budget -= self._prefill_step(job, budget)
            elif job.decoded < job.decode_end:
                n = job.input_tokens + job.decoded
                if not run.idle(n + 1):
                    self._step(job, n, n + 1)
        self._planned = [j for j in decoders if j.pool_run is not None]
        self._preempted_now = self.pool.preemptions > preemptions
        if not self._preempted_now:
            self._admit(budget)

    def _admit(self, budget: int) -> None:
        """FCFS: the queue's head is scheduled, and its first chunk's blocks taken, when
        they and its hit's blocks in the free queue are free; with nothing running, always."""
        queue = self.hybrid.pool
        while self.waiting and budget > 0 and len(self.running) < self.settings.max_running:
            job = self.waiting[0]
            if not self._feeder.ready(job):
                return
            run = self._open(job)
            if run.hits_fresh_state() or not run.first_chunk(budget):
                return
            free = len(queue.queue)
            if (
                self.running
                and queue.finite
                and (run.full_need() > free or run.first_need(budget) > free)
            ):
                return
            self._note_queue()
            self.waiting.popleft()
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
        job.ckpt_tokens = sorted({c for c in (run.checkpoint, run.junction) if c > job.hit})
        if self.settings.radix_mlp:
            job.seq = job.req.full_sequence()
        if job.order < 0:  # a recomputed request keeps its first scheduling (and its hit)
            self._first[job.req.request_id] = (run.matched_tokens, run.hit_tokens)
            job.order, self.pool.started = self.pool.started, self.pool.started + 1
            job.scheduled = self.env.now
        else:
            self.resume_hits.setdefault(job.req.request_id, []).append(run.hit_tokens)
        self.running.append(job)

    # ------------------------------------------------------------------ steps
    def _step(self, job: Job, start: int, end: int, checkpoint: int = 0) -> bool:
        """``job``'s step takes its blocks, preempting the last running requests until the
        free queue serves it. False when ``job`` itself was preempted."""
        run = job.pool_run
        assert run is not None
        while True:
            try:
                run.step(start, end, checkpoint)
            except PoolFull:
                if not self.running or self.running == [job]:
                    raise too_small(self.shape, job.req) from None
                victim_is_job = self.running[-1] is job
                self._preempt()
                if victim_is_job:
                    return False
                continue
            self._note_held()
            return True

    def _note_held(self) -> None:
        queue = self.hybrid.pool
        held = (queue.made - len(queue.queue)) * self.shape.block_bytes
        self.pool.held = held
        self.pool.peak_held = max(self.pool.peak_held, held)

    def _release(self, victim: Job) -> None:
        """A preempted request frees all its blocks (cached ones stay cached)."""
        assert victim.pool_run is not None
        victim.pool_run.finish()
        victim.pool_run = None

    def _iteration_decoders(self) -> list[Job]:
        return self._planned

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

    def _prefill_chunks(self, budget: float) -> list[tuple[Job, int]]:
        return [(job, take) for job, take in self._chunks if job.pool_run is not None]

    def _prompt_done(self, job: Job) -> None:
        """Nothing to publish: the pool cached the prompt's blocks as they were computed."""

    def _span_plan(self) -> tuple[list[Job], int]:
        """The planned decoders (their first step's blocks taken) and the span's steps: up to
        the first request's end, before the next step in which a decoder crosses a block
        boundary (it takes blocks), before the next step that retires a Mamba block when a
        queued request could be scheduled in the room it frees (vLLM frees it in that step's
        running pass, then schedules the queue), on a Transformer likewise before the next
        step that fills a KV block (its running pass caches the block, which a queued
        request's hit may then reach), one step when a request still prefills (it got no
        tokens in this one) or when this step preempted one (it scheduled none)."""
        size, decoders = self.shape.block, self._planned
        firsts = [j.input_tokens + j.decoded for j in decoders]
        steps = min(j.decode_end - j.decoded for j in decoders)
        steps = min(steps, *(size - n % size for n in firsts))
        if self.waiting and len(self.running) < self.settings.max_running:
            steps = min(steps, *((1 - n) % size or size for n in firsts))
            if not self.shape.state_groups:  # a Transformer: a filled block is a longer hit
                steps = min(steps, *((size - 1 - n) % size or size for n in firsts))
        if any(j.prefilled < j.input_tokens for j in self.running) or (
            self._preempted_now and self.waiting
        ):
            steps = 1
        return decoders, steps

    def _span_ran(self, decoders: list[Job], done: int) -> None:
        """Steps 1 .. ``done - 1`` of the span, in order: those that retire a Mamba block or
        fill a KV block (the others change nothing; none takes a block)."""
        size = self.shape.block
        events = []
        for rank, job in enumerate(decoders):
            first = job.input_tokens + job.decoded - done
            for k in range(1, done):
                if (first + k) % size in (1, size - 1):
                    events.append((k, rank, first + k))
        for _, rank, n in sorted(events):
            run = decoders[rank].pool_run
            assert run is not None
            run.step(n, n + 1)

    # ------------------------------------------------------------------ completion
    def _finish(self, job: Job) -> None:
        run = job.pool_run
        assert run is not None
        req = job.req
        job.finished = self.env.now
        for n in range(
            job.input_tokens + max(job.decoded, 0), committed_tokens(req, self.committed)
        ):
            self._step(job, n, n + 1)  # the last sampled token's KV (``committed`` off)
        run.finish()
        del self._keys[req.request_id]
        self._preempted_counts[req.request_id] = job.preemptions
        matched, hit = self._first.pop(req.request_id)
        record = pool_record(req, self.model, self.step.policy, self.hybrid, run, matched, hit)
        add_timing(
            record,
            Timing(
                arrival=job.arrival,
                scheduled=job.scheduled,
                first_token=job.first_token,
                finished=job.finished,
                prefill_time=self.cost.prefill_time(hit, req.input_tokens - hit),
            ),
        )
        self._note_held()
        self.peaks.note(record)
        if self._feeder.finished(job, record):
            self.records.append(record)
            if self._progress is not None:
                self._progress.update()
        stats = self.stats
        stats.last_departure = max(stats.last_departure, job.finished)
        stats.occupancy.append((job.finished, record.cache_kv_bytes, record.cache_ssm_bytes))
        stats.prefill_tokens += job.input_tokens - job.hit
        job.done.succeed()

    def collect(self) -> list[RequestRecord]:
        records = super().collect()
        self.pool.evicted_bytes = self.hybrid.pool.evicted * self.shape.block_bytes
        return records
