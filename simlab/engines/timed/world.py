"""The timed engine: a SimPy world with sessions, a queue, and one GPU doing continuous batching.

Sessions start at their first request's assigned arrival time (Poisson or the trace's own
timestamps, see ``traces.arrivals``); request ``k+1`` of a session arrives a think time after
request ``k`` *completes* (the same think gaps the replay engine uses, or the typing time of the
next user message at ``typing_wpm``). So queueing delays push later turns back, as in real use.

The GPU process runs iterations of continuous batching: running requests decode one token each;
the remaining chunked-prefill token budget goes to prefill chunks in arrival order. A request is
scheduled (moved from the queue to the running set) when fewer than ``max_running`` requests run
and its KV (and SSM state) fit in the memory reserved for running sequences, which is separate
from the prefix cache. At scheduling it looks up the prefix cache, pins the reused prefix and gets
its checkpoint plan; checkpoints not on an SSM chunk boundary split its prefill (a second pass)
when ``ckpt_split`` is on; at completion input + output are admitted and the pin released.

Each iteration's duration comes from the cost model. Stretches where only decoding happens and
nothing changes are simulated as one event (their step durations are summed in closed form) and
cut short when a request arrives, so the event count grows with requests, not tokens.

What happens to a request against the cache is the one request step's
(:class:`simlab.engines.step.RequestStep`): started when it is scheduled, finished when it completes. The
cache's clock is logical (one tick per started request), so recency is the same order-based
quantity as in the replay engine (at low load both engines take identical decisions); the
``observe`` hooks and controllers (alpha tuning) see requests in completion order, the logical
order of the cache's admissions. Requests come from a :class:`simlab.engines.timed.feeders.Feeder`:
chat sessions (:mod:`simlab.engines.timed.feeders`), a planned batch in
:mod:`simlab.engines.offline`. How requests hold memory and get scheduled is the world's
:class:`simlab.engines.timed.memory.Memory`: reserved running memory beside the cache
(``engine.kv_pool=separate``), one budget the running sequences and the cache share
(``engine.kv_pool=shared``, :mod:`simlab.engines.timed.shared`), or vLLM's pool block by block
for a hybrid under ``policy=vllm`` (:mod:`simlab.engines.timed.vllm`). A request's state through
all this is a :class:`simlab.engines.timed.jobs.Job`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np
import simpy

from simlab.cost.model import CostModel
from simlab.cost.shapes import BatchShape
from simlab.engines.records import RequestRecord
from simlab.engines.step import RequestStep
from simlab.engines.timed.batch import RunningBatch, batch_shape, shared_prefix_reads
from simlab.engines.timed.feeders import Feeder, SessionFeeder
from simlab.engines.timed.intake import Intake
from simlab.engines.timed.jobs import EngineStats, Job, PoolStats
from simlab.engines.timed.memory import MemoryFactory, tree_memory
from simlab.engines.timed.settings import TimedSettings
from traces.format import Request
from traces.progress import Progress


class TimedWorld:
    """One run of the timed world for one policy; see the module docstring. ``memory``: how
    its requests hold memory and get scheduled (:func:`tree_memory`: on the prefix tree)."""

    def __init__(
        self,
        requests: Sequence[Request],
        step: RequestStep,
        cost: CostModel,
        s: TimedSettings,
        env: simpy.Environment | None = None,  # a cluster's replicas share one
        memory: MemoryFactory = tree_memory,
    ):
        self.step, self.cache, self.model = step, step.cache, step.cache.model
        self.cost, self.settings = cost, s
        self.env = env if env is not None else simpy.Environment()
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.records: list[RequestRecord] = []
        self.stats = EngineStats()
        self.pool = PoolStats()
        self.feeder: Feeder = SessionFeeder(requests)
        self.max_running = s.running_cap  # a separate SSM pool may lower it
        # tokens one iteration computes (chunked prefill off: any number)
        self.budget: float = math.inf if s.token_budget is None else s.token_budget
        self.batch = RunningBatch(prefill_first=s.batching == "prefill_first")
        self.preempted_counts: dict[int, int] = {}  # request id -> preemptions
        self.resume_hits: dict[int, list[int]] = {}  # request id -> its hit at each resume
        self._queue_changed = 0.0
        self._wakeup = self.env.event()
        self._open_sources = 0
        self._total = len(requests)
        self._progress: Progress | None = None
        sglang = s.request_admission == "sglang"
        #: sglang: a prompt the budget cuts holds and publishes its KV chunk by chunk
        self._chunk_by_chunk = s.kv_pool == "shared" and sglang
        self._chunked: list[Job] = []  # sglang: the prompts the last step cut, to publish
        self._prompts_ended: list[Job] = []  # engine.overlap: the last batch's, to publish
        #: SGLang's overlap scheduler: a request's token sampled in the last batch waits in
        #: its queued result (``Job.in_flight``); vLLM delivers it even to a preempted request
        self._queues_tokens = s.overlap and sglang
        self.intake = Intake(s)  # the engine's holds on new requests
        self._after_extend = False  # the last step ran prefill chunks
        self.memory = memory(self, requests)
        step.prepare(sorted(requests, key=lambda r: (r.arrival, r.session_id, r.turn)))

    @property
    def preempts(self) -> bool:
        """Whether running requests can be preempted (their run reports preemptions)."""
        return self.memory.preempts

    def peek(self, req: Request) -> tuple[int, int]:
        """``(matched, hit)`` tokens ``req`` would get if scheduled now, read-only (a
        cluster router's view of this replica)."""
        return self.memory.peek(req)

    def cache_peaks(self) -> dict[str, float]:
        """Peak cached bytes the run's summary takes from the engine (none: the request
        step's cache has them)."""
        return self.memory.cache_peaks()

    def preemption_column(self, records: Sequence[RequestRecord]) -> list[int]:
        """Per record (in ``records``' order): times its request was preempted."""
        return [self.preempted_counts.get(r.request_id, 0) for r in records]

    # ------------------------------------------------------------------ world
    def run(self, feeder: Feeder) -> list[RequestRecord]:
        """Simulate until every request the feeder submits completed."""
        self.feeder = feeder
        for process in feeder.processes(self):
            self._open_sources += 1
            self.env.process(self._source(process))
        self.env.process(self._gpu())
        with Progress(self._total, f"{self.step.policy} (timed)") as self._progress:
            self.env.run()
        return self.collect()

    def attach(self, feeder: Feeder, sources: int, progress: Progress | None = None) -> None:
        """Serve jobs that ``sources`` processes outside this world submit (a cluster's router,
        :mod:`simlab.engines.cluster`): start the GPU process, which ends once every source closed
        (:meth:`close_source`) and every job completed. The caller runs the environment."""
        self.feeder, self._open_sources, self._progress = feeder, sources, progress
        self.env.process(self._gpu())

    def close_source(self) -> None:
        """One of the outside sources submits nothing more."""
        self._open_sources -= 1

    def collect(self) -> list[RequestRecord]:
        """The records once the environment ran out, sorted by (arrival, session, turn)."""
        stuck = len(self.waiting) + len(self.running)
        if stuck:
            raise RuntimeError(f"{stuck} requests never completed (running memory too small?)")
        self.records.sort(key=lambda r: (r.arrival, r.session_id, r.turn))
        self.memory.ended()
        return self.records

    def _source(self, process: Generator[Any, Any, None]) -> Generator[Any, Any, None]:
        yield from process
        self._open_sources -= 1

    def submit(self, job: Job) -> Job:
        """Queue a job (FCFS) and wake the GPU; with ``engine.request_overhead_s``, that long
        after its send (its ``arrival``, from which its TTFT counts)."""
        self.stats.first_arrival = min(self.stats.first_arrival, self.env.now)
        if self.settings.request_overhead_s:
            self.env.process(self._front_end(job))
            return job
        return self._enqueue(job)

    def _front_end(self, job: Job) -> Generator[Any, Any, None]:
        yield self.env.timeout(self.settings.request_overhead_s)
        self._enqueue(job)

    def _enqueue(self, job: Job) -> Job:
        if self.intake.holds_arrivals:
            self.intake.inbox.append(job)
        else:
            self.note_queue()
            self.waiting.append(job)
        if not self._wakeup.triggered:
            self._wakeup.succeed()
        return job

    def note_queue(self) -> None:
        """Accumulate the time integral of the queue length (call before it changes)."""
        now = self.env.now
        self.stats.queue_area += len(self.waiting) * (now - self._queue_changed)
        self._queue_changed = now

    # ------------------------------------------------------------------ GPU
    def _gpu(self) -> Generator[Any, Any, None]:
        env = self.env
        overlap = self.settings.overlap
        while True:
            if overlap:  # ``get_next_batch_to_run`` stashes first, the last result still queued
                self._stash_chunked()
            if self.intake.holds_arrivals:
                self._pull()
            self.memory.schedule()
            if not self.running:
                self.batch.ratio.reset()  # SGLang's on_idle
                if self._no_more_arrivals():
                    return
                self._wakeup = env.event()
                yield self._wakeup
                continue
            if self.memory.prefills():
                yield from self._iteration()
            elif overlap and not self.decoders():  # only finishing requests: no batch
                self._process_results()
                continue
            else:
                yield from self._decode_span()
            if not overlap:
                self._complete_finished()
                self._stash_chunked()

    def _pull(self) -> None:
        """The requests the engine pulls before this iteration join the queue
        (:class:`simlab.engines.timed.intake.Intake`; called only when it holds arrivals)."""
        idle = not self.running and not self.waiting
        pulled = self.intake.poll(idle, self._after_extend)
        if pulled:
            self.note_queue()
            self.waiting.extend(pulled)

    def results_pending(self) -> bool:
        """``engine.overlap``: whether the last batch's result, still queued, ends a prompt or
        finishes a request (it changes what the step after the next one schedules)."""
        return self.settings.overlap and (
            bool(self._prompts_ended) or len(self.decoders()) < len(self.batch_members())
        )

    def _process_results(self) -> None:
        """``engine.overlap``: the last batch's result is processed once the next batch is
        planned (``event_loop_overlap``'s ``pop_and_process``): the prompts it ended are
        published (unless retracted since), the requests it finished complete, and its
        sampled tokens reach the requests' outputs."""
        prompts, self._prompts_ended = self._prompts_ended, []
        for job in prompts:
            if not job.in_prefill and job in self.running:
                self.memory.prompt_done(job)
        self._complete_finished()
        for job in self.running:
            job.in_flight = 0

    def batch_members(self) -> list[Job]:
        """SGLang's running batch: the running requests past their prefill, those whose
        finishing result the overlap scheduler has not processed yet included (without
        ``engine.overlap`` there are none: the decoders, :meth:`decoders`)."""
        return [j for j in self.running if j.prefilled >= j.input_tokens]

    def prefilling(self) -> bool:
        """Whether a running request is still in its prefill (``Job.in_prefill``, inlined)."""
        return any(job.prefilled < job.input_tokens for job in self.running)

    def _no_more_arrivals(self) -> bool:
        return not self.waiting and not self.intake.inbox and self._open_sources == 0

    # ------------------------------------------------------------------ iterations
    def decoders(self) -> list[Job]:
        """Running requests past their prefill with decode steps left, in running order
        (``not in_prefill and decode_left > 0``, inlined: this runs every iteration)."""
        return [
            j for j in self.running if j.decoded < j.decode_end and j.prefilled >= j.input_tokens
        ]

    def _iteration(self):
        """One iteration with prefill chunks: every decoder steps once beside them (mixed
        batching; prefill_first: only when no chunk is ready), the chunks fill the budget."""
        had_decoders = self.settings.request_admission == "sglang" and bool(self.batch_members())
        decoders, chunks = self._iteration_work()
        overlap = self.settings.overlap
        if overlap:
            self._process_results()
        if not chunks and not decoders:  # only host loads in flight: wait (or an arrival)
            if self.batch.decode_skipped:
                return
            yield from self._await_loads()
            return
        self._after_extend = bool(chunks)
        self._track_chunks(chunks)
        duration = self.cost.time(self._batch(chunks, decoders))
        yield self.env.timeout(duration)
        self.stats.busy += duration
        self.stats.iterations += 1
        # SGLang tracks no state for a decode step that rides a prefill batch
        # (``mix_with_running``: "decode tails are not tracked in a mixed step")
        self._decoded(decoders, 1, tracked=not chunks)
        # SGLang's running batch is a fresh one, not full, when the step mixed the decodes in
        # or none were running; a prefill-only step merges into the running batch, flag kept
        if chunks and (decoders or not had_decoders):
            self.batch.full = False
        for job, take in chunks:
            job.prefilled += take
            if not job.in_prefill:
                self._prompt_ended(job)
        if self._queues_tokens:
            for job in decoders:
                job.in_flight = 1
        if self._chunk_by_chunk:  # SGLang stashes its chunked request at the next step
            self._chunked = [job for job, _ in chunks if job.in_prefill]

    def _prompt_ended(self, job: Job) -> None:
        """``job``'s last chunk ran: its first token is sampled (a recomputed request keeps its
        first), it joins the running batch, and its prompt is published, with
        ``engine.overlap`` once the next batch is planned (:meth:`_process_results`)."""
        if math.isnan(job.first_token):
            job.first_token = self.env.now
        self._join_batch(job)
        if self.settings.overlap:
            job.in_flight = int(self._queues_tokens)
            self._prompts_ended.append(job)
        else:
            self.memory.prompt_done(job)

    def _track_chunks(self, chunks: list[tuple[Job, int]]) -> None:
        """The state each chunk of a tracking job will track (:meth:`RequestStep.track_extend`),
        placed before its batch is costed so that its store is charged."""
        for job, take in chunks:
            if job.tracks:
                assert job.started is not None
                end = job.prefilled + take
                job.chunk_state = self.step.track_extend(job.started, job.prefilled, end)
                if job.chunk_state is not None:
                    job.ckpt_tokens.append(job.chunk_state)

    def _decoded(self, decoders: list[Job], steps: int, tracked: bool = True) -> None:
        """``decoders`` each ran ``steps`` decode steps; a tracking job's steps place its last
        decode state unless they rode a prefill batch (``tracked`` false)."""
        for job in decoders:
            if tracked and job.tracks:
                assert job.started is not None
                seq = job.input_tokens + job.decoded
                self.step.track_decode(job.started, seq, seq + steps)
            job.decoded += steps

    def _iteration_work(self) -> tuple[list[Job], list[tuple[Job, int]]]:
        """The decoders and prefill chunks of the next iteration. Mixed batching: the chunks
        fill what the decoders leave of the budget; with ``engine.request_admission=sglang``
        the decoders sit this step out when the pool cannot hold their next token (SGLang's
        mixed step checks ``check_decode_mem`` and retracts nobody; the next decode step
        does). ``engine.batching=prefill_first``: the chunks take the whole budget and run
        alone (SGLang's default: ``get_next_batch_to_run`` runs a prefill batch first)."""
        if self.settings.batching == "prefill_first":
            chunks = self.memory.prefill_chunks(self.budget)
            return ([] if chunks else self.memory.iteration_decoders()), chunks
        if self.settings.request_admission != "sglang":
            decoders = self.memory.iteration_decoders()
            if self.intake.wait_iters and self.intake.holds_context(  # TensorRT-LLM's wait
                sum([j.input_tokens for j in self.running if j.prefilled < j.input_tokens]),
                len(decoders),
            ):
                return decoders, []
            return decoders, self.memory.prefill_chunks(self.budget - len(decoders))
        running = self.decoders()
        chunks = self.memory.prefill_chunks(self.budget - len(self.batch_members()))
        if chunks and not self.memory.decode_fits(running):
            return [], chunks
        return self.memory.iteration_decoders(), chunks

    def _join_batch(self, job: Job) -> None:
        """``job``'s prompt ended: with ``engine.request_admission=sglang`` it joins SGLang's
        running batch with this step's admissions, ahead of them when its prompt took
        several steps (the chunked request leads its last chunk's batch)."""
        if self.settings.request_admission == "sglang" and abs(job.batch_rank[0]) != (
            self.batch.admission_passes
        ):
            job.batch_rank = self.batch.rank(-1)

    def _await_loads(self):
        """The GPU idles until the first host load ends, or a request arrives."""
        first = min(j.ready for j in self.running if j.in_prefill)
        self._wakeup = self.env.event()
        yield self.env.timeout(max(first - self.env.now, 0.0)) | self._wakeup

    def _stash_chunked(self) -> None:
        """The prompts the last step's budget cut publish what they computed
        (:meth:`Memory.checkpoint`) after the step's finished requests, as SGLang's next
        ``get_next_batch_to_run`` stashes its chunked request once the result loop released
        them (the order of their insertions is the order of the Mamba LRU)."""
        for job in self._chunked:
            self.memory.checkpoint(job)
        self._chunked = []

    def _batch(self, chunks: list[tuple[Job, int]], decoders: list[Job]) -> BatchShape:
        return batch_shape(chunks, decoders, self.cache, self.settings)

    def _decode_span(self):
        """Decode-only stretch until the first request finishes, a new one arrives or (with
        ``engine.recv_interval``) the engine pulls the ones that arrived."""
        decoders, steps = self.memory.span_plan()
        self._after_extend = False
        until_pull = self.intake.steps_before_pull()
        if until_pull is not None and steps > until_pull:  # the stretch ends at the pull
            steps = until_pull
        if self.settings.overlap:
            self._process_results()
            if not steps:  # the decode sits this step out: its memory frees at the step's end
                return
        # the contexts (input + decoded + 1 each) enter the cost model through their sum only
        context_sum = sum([j.input_tokens + j.decoded for j in decoders]) + len(decoders)
        shared = shared_prefix_reads(decoders) if self.settings.shared_prefix_attention else 0
        ends = np.cumsum(self.cost.decode_span_of(len(decoders), context_sum, steps, shared))
        start = self.env.now
        self._wakeup = self.env.event()
        if len(self.running) < self.max_running:  # an arrival could join the batch
            yield self.env.timeout(float(ends[-1])) | self._wakeup
        else:
            yield self.env.timeout(float(ends[-1]))
        done = min(int(np.searchsorted(ends, self.env.now - start - 1e-12)) + 1, steps)
        if self.env.now < start + float(ends[done - 1]):  # finish the step in progress
            yield self.env.timeout(start + float(ends[done - 1]) - self.env.now)
        self.stats.busy += float(ends[done - 1])
        self.stats.iterations += done
        self._decoded(decoders, done)
        self.intake.decoded(done)
        self.memory.span_ran(decoders, done)
        if self._queues_tokens:
            for job in decoders:
                job.in_flight = 1

    # ------------------------------------------------------------------ completion
    def _complete_finished(self) -> None:
        """Requests done (``not in_prefill and decode_left == 0``, inlined) leave the running
        set, then complete in running order (completing one never reads the running set); the
        memory may complete others with them."""
        running = self.running
        finished = [
            j for j in running if j.decoded >= j.decode_end and j.prefilled >= j.input_tokens
        ]
        if finished:
            running[:] = [
                j for j in running if j.decoded < j.decode_end or j.prefilled < j.input_tokens
            ]
            self.batch.full = False  # SGLang's ``filter_batch`` shrank the batch
            if self.settings.request_admission == "sglang":  # its result loop's order
                finished.sort(key=lambda j: j.batch_rank)
        self.memory.complete(finished)

    def complete(
        self, job: Job, record: RequestRecord, cached: tuple[int, int] | None = None
    ) -> None:
        """``job`` completed with ``record`` (its memory's bookkeeping done): the feeder takes
        it, and the stats the cache's bytes (``cached``: KV and SSM bytes, when the memory
        keeps them rather than the request step's cache)."""
        if self.feeder.finished(job, record):
            self.records.append(record)
            if self._progress is not None:
                self._progress.update()
        stats = self.stats
        stats.last_departure = max(stats.last_departure, job.finished)
        kv, ssm = cached if cached is not None else (self.cache.kv_bytes, self.cache.ssm_bytes)
        stats.occupancy.append((job.finished, kv, ssm))
        stats.prefill_tokens += job.input_tokens - job.hit
        job.done.succeed()
