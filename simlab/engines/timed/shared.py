"""The timed engine's memory with ``engine.kv_pool=shared`` (:class:`SharedMemory`): the
running sequences and the prefix cache share one budget (:class:`KVPool`), requests are admitted
into it (:class:`Admission`) and preempted for their decode steps (:class:`Preemption`); their
prompts pass to the cache as their prefill ends (chunk by chunk under
``engine.request_admission=sglang``), and their whole KV as they finish."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from simlab.engines.timed.admission import Admission
from simlab.engines.timed.jobs import Job
from simlab.engines.timed.kv_pool import KVPool
from simlab.engines.timed.preemption import Preemption
from simlab.engines.timed.tree import TreeJobs
from traces.format import Request

if TYPE_CHECKING:
    from simlab.engines.timed.world import TimedWorld


class SharedMemory:
    """A :class:`simlab.engines.timed.memory.Memory` on the prefix tree with one budget for
    ``world``'s cache and running requests (see the module docstring); running requests can be
    preempted."""

    preempts = True

    def __init__(self, world: TimedWorld, requests: Sequence[Request]):
        self.world, self.step, self.model = world, world.step, world.model
        self.settings = world.settings
        self.kv = KVPool(world.step, world.settings, world.pool)
        self.tree = TreeJobs(world)
        self.admission = Admission(world, self.kv, self.tree)
        self.preemption = Preemption(world, self.kv)
        self._span_fit = 0  # the decode steps the last span's memory was held for
        self.kv.open(requests)
        if world.pool.ssm_budget is not None:  # the SSM pool caps the running requests
            world.max_running = world.pool.max_running

    def schedule(self) -> None:
        self.admission.schedule()

    def prefills(self) -> bool:
        return self.world.prefilling()

    def prefill_chunks(self, budget: float) -> list[tuple[Job, int]]:
        return self.tree.prefill_chunks(budget)

    def iteration_decoders(self) -> list[Job]:
        """The decoders of a mixed iteration, their step's memory held. The new token ratio
        does not decay: SGLang decays it in ``update_running_batch``, which a step that runs a
        prefill never calls."""
        if not self.preemption.reserve_decode(1):
            return []
        return self.world.decoders()

    def decode_fits(self, decoders: list[Job]) -> bool:
        return self.kv.evict_for(self.kv.step_need(decoders))

    def prompt_done(self, job: Job) -> None:
        """``job``'s prefill ended: the request step publishes its prompt, whose KV passes from
        the running part to the cache: it is released before the insertion, so the insertion
        fills the job's own room and evicts nothing for it (SGLang's
        ``RadixCache.checkpoint`` never evicts), and what the cache did not take stays held
        (:meth:`_published`)."""
        assert job.started is not None
        prompt_kv = (job.input_tokens - job.published_to) * self.model.kv_bytes_per_token
        job.reserved -= prompt_kv
        self.kv.hold(-prompt_kv)
        earlier = job.started.published  # what its chunks published (:meth:`checkpoint`)
        self.step.prefilled(job.started, keep_room=False)
        self._published(job, prompt_kv, 0.0 if earlier is None else float(earlier.kv_bytes))

    def _published(self, job: Job, released: float, earlier: float) -> None:
        """A prompt published at prefill end now lies in the (pinned) cache, its ``released``
        KV bytes (positions ``published_to`` to the input's end) no longer held by the job.
        The job holds back what is still its own: past where its own slots start once
        published (:meth:`RequestStep.own_from`; SGLang frees the duplicates of what another
        request published meanwhile, ``_insert_cache``), or without that rule what the cache
        did not take beside the ``earlier`` bytes its chunks published. Nothing past what was
        published moves: a recomputed request's sampled outputs (prefilled again with its
        prompt, :meth:`Job.resume`) are published with it on a tree of tokens, a hybrid's with
        the state at their end (``Job.refill``), and stay its own elsewhere, its last chunk's
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
        self.kv.make_room(released - moved)
        job.reserved += released - moved
        self.kv.hold(released - moved)

    def checkpoint(self, job: Job) -> None:
        """A prompt the budget cut (``engine.request_admission=sglang``): what it computed is
        published before the next step (SGLang's ``stash_chunked_request``:
        ``checkpoint_kv_cache``), so requests admitted from now on can hit it. Its KV passes
        to the cache, pinned by the request; the duplicates of what other requests published
        meanwhile are freed (:meth:`RequestStep.checkpoint`), and the request holds only what
        the cache did not take (on a paged tree the chunk's partial last page: its published
        part then ends where the cache took). A tracking job (SGLang's ``extra_buffer``)
        publishes up to the state its chunk tracked, and nothing when it tracked none; it
        holds the rest."""
        assert job.started is not None
        if not self.step.publishes_chunks(job.started):  # the request keeps its KV
            return
        upto = job.prefilled if not job.tracks else job.chunk_state
        if upto is None:  # the chunk tracked no state: nothing to publish
            return
        kv = self.model.kv_bytes_per_token
        released = (upto - job.published_to) * kv
        self.kv.hold(-released)
        cached = self.step.checkpoint(job.started, upto)
        took = max(min(cached, upto), job.published_to)
        keep = (upto - took) * kv
        self.kv.hold(keep)
        job.reserved += keep - released
        job.published_to = took  # on a paged tree the chunk's partial last page stays its own

    def span_plan(self) -> tuple[list[Job], int]:
        """The decoders of a decode-only span and its steps: up to the first request's end,
        and at most those whose memory the pool could hold (:meth:`Preemption.reserve_decode`).
        With ``engine.request_admission=sglang`` nobody is admitted inside a span: a queued
        request that did not fit waits until a request leaves (``batch_is_full``), which
        ends the span, as an arrival does; after a retraction the queue is tried again at
        the next step, so the span is that one step."""
        world = self.world
        limit = 1 if world.results_pending() else None  # the result changes the next step
        fit = self._span_fit = self.preemption.reserve_decode(limit)
        decoders = [j for j in world.running if j.decoded < j.decode_end]  # decode_left > 0
        if world.batch.decode_skipped:
            return [], 0
        steps = min([j.decode_end - j.decoded for j in decoders])
        if self._retry_next_step():
            return decoders, 1
        return decoders, min(steps, fit)

    def _retry_next_step(self) -> bool:
        """``engine.request_admission=sglang``: whether the next step tries the queue's head
        (its batch is not full, e.g. after a retraction)."""
        return (
            self.settings.request_admission == "sglang"
            and not self.world.batch.full
            and bool(self.world.waiting)
            and len(self.world.running) < self.world.max_running
            and self.world.feeder.ready(self.world.waiting[0])
        )

    def span_ran(self, decoders: list[Job], done: int) -> None:
        """The span ran ``done`` steps (each decoder's ``decoded`` counts them already): the
        ratio decays, and a span cut short gives back the steps it did not run."""
        fit = self._span_fit
        self.world.batch.ratio.decay(done - self.world.batch.retracted)
        if done < fit:
            unused = (fit - done) * self.model.kv_bytes_per_token
            freed = float(unused * len(decoders))
            for job in decoders:
                job.reserved -= unused
                freed -= self.kv.repad(job, job.input_tokens + job.decoded)
            self.kv.hold(-freed)

    def complete(self, finished: list[Job]) -> None:
        for job in finished:
            self.finish(job)

    def finish(self, job: Job) -> None:
        """``job`` completed: its KV leaves the running part (the cache may admit it), its
        slots go back (its last state takes one: SGLang donates it), and it gets its record."""
        assert job.started is not None
        job.finished = self.world.env.now
        self.kv.hold(-job.reserved)
        job.reserved, job.pad = 0.0, 0
        if job.slots:
            self.kv.hold_slots(job, -job.slots)
        self.world.preempted_counts[job.req.request_id] = job.preemptions
        record = self.tree.record(job)
        self.kv.check()
        self.world.complete(job, record)

    def peek(self, req: Request) -> tuple[int, int]:
        return self.step.peek(req)

    def cache_peaks(self) -> dict[str, float]:
        return {}

    def ended(self) -> None:
        pass
