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
order of the cache's admissions. Requests come from a :class:`Feeder`: chat sessions here, a
planned batch in :mod:`simlab.engines.offline`. A hybrid under ``policy=vllm`` runs on vLLM's pool block
by block instead of the prefix cache and the reserved memory (:mod:`simlab.engines.timed.vllm_world`).
With ``engine.kv_pool=shared`` the running sequences and the cache share one budget
(:mod:`simlab.engines.timed.kv_pool`); a request's state through all this is a
:class:`simlab.engines.timed.jobs.Job`.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import simpy

from simlab.config import ConfigError
from simlab.cost.model import CostModel
from simlab.cost.shapes import BatchShape
from simlab.engines.records import RequestRecord, hit_columns
from simlab.engines.step import RequestStep, Timing
from simlab.engines.timed.jobs import EngineStats, Job, PoolStats
from simlab.engines.timed.kv_pool import SharedPoolScheduling
from simlab.engines.timed.new_token_ratio import (
    NewTokenRatio,
)
from traces.format import Request
from traces.progress import Progress

log = logging.getLogger(__name__)

TOKENS_PER_WORD = 1.33  # cl100k on English prose; converts tokens to words for typing time
KV_POOLS = ("separate", "shared")
PREEMPTIONS = ("lifo", "fifo", "sglang")
ADMISSIONS = ("whole", "sglang")
BATCHINGS = ("mixed", "prefill_first")


@dataclass(frozen=True)
class TimedSettings:
    """``engine`` config of the timed engine (validated)."""

    token_budget: int | None = 8192  # None: chunked prefill off (request_admission=sglang)
    max_prefill_tokens: int | None = None  # SGLang's --max-prefill-tokens (None: no cap)
    max_running: int = 256
    running_memory_gb: float = 16.0
    ckpt_split: bool = True
    ssm_chunk: int = 256
    radix_mlp: bool = False
    shared_prefix_attention: bool = False
    typing_wpm: float | None = None
    memory_check: bool = True  # false: what-if studies beyond the GPU's memory
    kv_pool: str = "separate"  # shared: running sequences and the prefix cache share one budget
    preemption: str = "lifo"  # shared pool: which running request is preempted first
    request_admission: str = "whole"  # shared pool: when a queued request may start
    ignore_eos: bool = False  # request_admission=sglang: requests run to max_new_tokens
    # prefill_first: a step that prefills runs no decodes (SGLang's default)
    batching: str = "mixed"
    #: the engine's overlapped loop, each batch scheduled before the last one's result is
    #: processed: SGLang's overlap scheduler (its default ``event_loop_overlap``) with
    #: request_admission=sglang; vLLM's async scheduling (its default ``AsyncScheduler``) on
    #: vLLM's block pool (:mod:`simlab.engines.timed.vllm_world`)
    overlap: bool = False

    def __post_init__(self) -> None:
        self._check_counts()
        shared = self.kv_pool == "shared"  # one budget: the cache alone may be the whole pool
        if not (self.running_memory_gb >= 0 if shared else self.running_memory_gb > 0):
            least = ">= 0 with kv_pool=shared" if shared else "> 0"
            raise ValueError(
                f"engine.running_memory_gb must be {least}, got {self.running_memory_gb!r}"
            )
        for key in (
            "ckpt_split",
            "radix_mlp",
            "shared_prefix_attention",
            "memory_check",
            "ignore_eos",
            "overlap",
        ):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"engine.{key} must be true or false, got {getattr(self, key)!r}")
        if self.typing_wpm is not None and not self.typing_wpm > 0:
            raise ValueError(f"engine.typing_wpm must be > 0 or null, got {self.typing_wpm!r}")
        if self.kv_pool not in KV_POOLS:
            raise ValueError(
                f"engine.kv_pool must be one of {'|'.join(KV_POOLS)}, got {self.kv_pool!r}"
            )
        if self.preemption not in PREEMPTIONS:
            raise ValueError(
                f"engine.preemption must be one of {'|'.join(PREEMPTIONS)}, got {self.preemption!r}"
            )
        if self.request_admission not in ADMISSIONS:
            raise ValueError(
                f"engine.request_admission must be one of {'|'.join(ADMISSIONS)}, "
                f"got {self.request_admission!r}"
            )
        if self.batching not in BATCHINGS:
            raise ValueError(
                f"engine.batching must be one of {'|'.join(BATCHINGS)}, got {self.batching!r}"
            )
        self._check_sglang_prefill_limits()
        if self.overlap and self.request_admission == "sglang" and not shared:
            raise ValueError(
                "engine.overlap with engine.request_admission=sglang is SGLang's overlap "
                f"scheduler: it needs engine.kv_pool=shared, got {self.kv_pool!r}"
            )

    def _check_counts(self) -> None:
        """The token and request counts are integers >= 1 (the two SGLang limits may be
        null: :meth:`_check_sglang_prefill_limits`)."""
        for key in ("token_budget", "max_prefill_tokens", "max_running", "ssm_chunk"):
            value = getattr(self, key)
            if value is None and key in ("token_budget", "max_prefill_tokens"):
                continue
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"engine.{key} must be an integer >= 1, got {value!r}")

    def _check_sglang_prefill_limits(self) -> None:
        """``engine.max_prefill_tokens`` and ``engine.token_budget=null`` (chunked prefill
        off) are SGLang's ``--max-prefill-tokens`` and ``--chunked-prefill-size -1``: they
        need its admission, and without chunks SGLang runs no mixed step."""
        sglang = self.request_admission == "sglang"
        if self.max_prefill_tokens is not None and not sglang:
            raise ValueError(
                "engine.max_prefill_tokens is SGLang's --max-prefill-tokens: it needs "
                f"engine.request_admission=sglang, got {self.request_admission!r}"
            )
        if self.token_budget is None and not (sglang and self.batching == "prefill_first"):
            raise ValueError(
                "engine.token_budget=null (chunked prefill off, SGLang's "
                "--chunked-prefill-size -1) needs engine.request_admission=sglang and "
                f"engine.batching=prefill_first, got {self.request_admission!r} and "
                f"{self.batching!r}"
            )


class Feeder(Protocol):
    """Where a timed world's requests come from (chat sessions, or an offline batch).

    ``processes(world)``: SimPy generators that submit jobs; the world ends once they all
    returned and every submitted job completed. ``ready(job)``: whether a queued job may be
    scheduled now (FCFS: a job that is not ready holds the queue). ``finished(job, record)``:
    called after a job's admission with its record; False for engine-made work that gets no
    record of its own (the feeder charges what it computed to a record it keeps).
    """

    def processes(self, world: TimedWorld) -> list[Generator[Any, Any, None]]: ...

    def ready(self, job: Job) -> bool: ...

    def finished(self, job: Job, record: RequestRecord) -> bool: ...


@dataclass
class SessionFeeder:
    """Chat sessions: request ``k+1`` of a session arrives a think time after request ``k``
    completes (see the module docstring)."""

    requests: Sequence[Request]
    typing_wpm: float | None = None

    def processes(self, world: TimedWorld) -> list[Generator[Any, Any, None]]:
        return [self._session(world, turns) for turns in _sessions(self.requests)]

    def ready(self, job: Job) -> bool:
        return True

    def finished(self, job: Job, record: RequestRecord) -> bool:
        return True

    def _session(self, world: TimedWorld, turns: list[Request]) -> Generator[Any, Any, None]:
        env = world.env
        yield env.timeout(turns[0].arrival)
        for k, req in enumerate(turns):
            if k:
                yield env.timeout(self._think(turns[k - 1], req))
            yield world.submit(Job(req=req, arrival=env.now, done=env.event())).done

    def _think(self, prev: Request, req: Request) -> float:
        """Gap between a request's completion and the session's next request."""
        if self.typing_wpm is None:
            return max(req.arrival - prev.arrival, 0.0)
        new_tokens = max(req.input_tokens - prev.input_tokens - prev.output_len, 0)
        return new_tokens / TOKENS_PER_WORD / self.typing_wpm * 60.0


class TimedWorld(SharedPoolScheduling):
    """One run of the timed world for one policy; see the module docstring."""

    #: runs vLLM's block pool, where ``engine.overlap`` is vLLM's async scheduling
    VLLM_POOL = False

    def __init__(
        self,
        requests: Sequence[Request],
        step: RequestStep,
        cost: CostModel,
        s: TimedSettings,
        env: simpy.Environment | None = None,  # a cluster's replicas share one
    ):
        self.step, self.cache, self.model = step, step.cache, step.cache.model
        self.cost, self.settings = cost, s
        self.env = env if env is not None else simpy.Environment()
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.records: list[RequestRecord] = []
        self.stats = EngineStats()
        self.memory_free = s.running_memory_gb * 1e9
        self._queue_changed = 0.0
        self._wakeup = self.env.event()
        self._open_sources = 0
        self._feeder: Feeder = SessionFeeder(requests)
        self._total = len(requests)
        self._progress: Progress | None = None
        self.shared = s.kv_pool == "shared"
        # tokens one iteration computes (chunked prefill off: any number)
        self._budget: float = math.inf if s.token_budget is None else s.token_budget
        self._kv_page = 1  # tokens per page of the shared KV pool (_open_pool)
        self.max_running = s.max_running  # a separate SSM pool may lower it (_open_pool)
        self._span_fit = 0
        self.pool = PoolStats()
        self._preempted_counts: dict[int, int] = {}  # request id -> preemptions
        self.resume_hits: dict[int, list[int]] = {}  # request id -> its hit at each resume
        self._ratio = NewTokenRatio()  # engine.request_admission=sglang: SGLang's new token ratio
        self._retracted = False  # the last decode memory check preempted (so did not decay)
        self._batch_full = False  # sglang: a request did not fit; no attempt until one leaves
        #: sglang: a prompt the budget cuts holds and publishes its KV chunk by chunk
        self._chunk_by_chunk = self.shared and s.request_admission == "sglang"
        self._chunked: list[Job] = []  # sglang: the prompts the last step cut, to publish
        self._passes = 0  # sglang: admission passes with requests queued (``calc_priority``)
        self._admission_passes = 0  # shared KV pool: passes run (``Job.batch_rank``)
        self._link_free = 0.0  # host tier: when the host<->GPU link finishes its last load
        self._prompts_ended: list[Job] = []  # engine.overlap: the last batch's, to publish
        self._decode_skipped = False  # engine.overlap: the last decode check skipped the step
        #: SGLang's overlap scheduler: a request's token sampled in the last batch waits in
        #: its queued result (``Job.in_flight``); vLLM delivers it even to a preempted request
        self._queues_tokens = s.overlap and s.request_admission == "sglang"
        if s.overlap and not (self._queues_tokens or self.VLLM_POOL):
            raise ConfigError(
                "engine.overlap: SGLang's overlap scheduler needs "
                "engine.request_admission=sglang, vLLM's async scheduling runs on vLLM's block "
                "pool (policy=vllm: a hybrid, or a Transformer with engine.kv_pool=shared); "
                f"got engine.request_admission={s.request_admission!r} on the prefix tree (where "
                "a disaggregated cluster's replicas always run)"
            )
        if self.shared:
            self._open_pool(requests)
        step.prepare(sorted(requests, key=lambda r: (r.arrival, r.session_id, r.turn)))

    @property
    def preempts(self) -> bool:
        """Whether running requests can be preempted (their run reports preemptions)."""
        return self.shared

    def peek(self, req: Request) -> tuple[int, int]:
        """``(matched, hit)`` tokens ``req`` would get if scheduled now, read-only (a
        cluster router's view of this replica)."""
        return self.step.peek(req)

    def cache_peaks(self) -> dict[str, float]:
        """Peak cached bytes the run's summary takes from the engine (none: the request
        step's cache has them)."""
        return {}

    # ------------------------------------------------------------------ world
    def run(self, feeder: Feeder) -> list[RequestRecord]:
        """Simulate until every request the feeder submits completed."""
        self._feeder = feeder
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
        self._feeder, self._open_sources, self._progress = feeder, sources, progress
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
        return self.records

    def _source(self, process: Generator[Any, Any, None]) -> Generator[Any, Any, None]:
        yield from process
        self._open_sources -= 1

    def submit(self, job: Job) -> Job:
        """Queue a job (FCFS) and wake the GPU."""
        self.stats.first_arrival = min(self.stats.first_arrival, self.env.now)
        self._note_queue()
        self.waiting.append(job)
        if not self._wakeup.triggered:
            self._wakeup.succeed()
        return job

    def _note_queue(self) -> None:
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
            self._schedule()
            if not self.running:
                self._ratio.reset()  # SGLang's on_idle
                if self._no_more_arrivals():
                    return
                self._wakeup = env.event()
                yield self._wakeup
                continue
            if self._any_prefill():
                yield from self._iteration()
            elif overlap and not self._decoders():  # only finishing requests: no batch
                self._process_results()
                continue
            else:
                yield from self._decode_span()
            if not overlap:
                self._complete_finished()
                self._stash_chunked()

    def _results_pending(self) -> bool:
        """``engine.overlap``: whether the last batch's result, still queued, ends a prompt or
        finishes a request (it changes what the step after the next one schedules)."""
        return self.settings.overlap and (
            bool(self._prompts_ended) or len(self._decoders()) < len(self._batch_members())
        )

    def _process_results(self) -> None:
        """``engine.overlap``: the last batch's result is processed once the next batch is
        planned (``event_loop_overlap``'s ``pop_and_process``): the prompts it ended are
        published (unless retracted since), the requests it finished complete, and its
        sampled tokens reach the requests' outputs."""
        prompts, self._prompts_ended = self._prompts_ended, []
        for job in prompts:
            if not job.in_prefill and job in self.running:
                self._prompt_done(job)
        self._complete_finished()
        for job in self.running:
            job.in_flight = 0

    def _batch_members(self) -> list[Job]:
        """SGLang's running batch: the running requests past their prefill, those whose
        finishing result the overlap scheduler has not processed yet included (without
        ``engine.overlap`` there are none: the decoders, :meth:`_decoders`)."""
        return [j for j in self.running if j.prefilled >= j.input_tokens]

    def _any_prefill(self) -> bool:
        """Whether a running request is still in its prefill (``Job.in_prefill``, inlined)."""
        return any(job.prefilled < job.input_tokens for job in self.running)

    def _no_more_arrivals(self) -> bool:
        return not self.waiting and self._open_sources == 0

    # ------------------------------------------------------------------ scheduling
    def _schedule(self) -> None:
        """Move queued requests into the running set while the limits allow (FCFS)."""
        if self.shared:
            self._schedule_shared()
            return
        while self.waiting and len(self.running) < self.max_running:
            job = self.waiting[0]
            if not self._feeder.ready(job):
                return
            need = self._reservation(job)
            if need > self.memory_free and self.running:
                return
            self._note_queue()
            self.waiting.popleft()
            self._start(job, need)

    def _refill(self, job: Job) -> int:
        """Outputs a recomputed ``job`` prefills again with its prompt, which the shared pool's
        radix tree matches and publishes with it (:meth:`RequestStep.start`): SGLang keys a
        retracted request by its fill ids. 0 in the separate pool."""
        return job.input_tokens - job.req.input_tokens if self.shared else 0

    def _ckpt_tokens(self, req: Request, ckpts: Sequence[int]) -> list[int]:
        """The plan's checkpoint positions (ids) in tokens, sorted: one within the input ends
        at most where the input does (a hash-id trace's last block may be partial; at ids x
        512 the prompt-end state fell past the prefill and was never charged)."""
        unit, n_in, tokens = self.cache.unit, req.input_len, req.input_tokens
        if unit == 1 and tokens >= n_in:  # ids are tokens: every position stays as it is
            return list(ckpts)
        return [min(c * unit, tokens) if c <= n_in else c * unit for c in ckpts]

    def _reservation(self, job: Job) -> float:
        """Running memory a request holds: KV of what it computes plus one SSM state."""
        req = job.req
        tokens = req.input_tokens + req.output_len
        return tokens * self.model.kv_bytes_per_token + self.model.ssm_state_bytes

    def _start(self, job: Job, need: float) -> None:
        if job.decode_only:
            self._start_decode(job, need)
            return
        started = job.started = self.step.start(job.req, refill=self._refill(job))
        job.seq, job.hit_node = started.seq, started.lookup.hit_node
        # the first token needs the last position's logits: a hit of the whole input (the
        # reference's ``whole_input_hit``) still computes that position (TTFT was NaN)
        job.hit = min(started.hit, job.input_tokens - 1)
        job.tracks = self.step.tracks_runs(started)
        job.ckpt_tokens = self._ckpt_tokens(job.req, started.plan.ckpts)
        job.splits = self._prefill_splits(job)
        job.prefilled = job.published_to = job.hit
        job.held_to = job.input_tokens
        if job.preemptions:
            self.resume_hits.setdefault(job.req.request_id, []).append(job.hit)
        else:
            job.first_lookup = (started.matched, started.hit)
        job.reserved = need - job.hit * self.model.kv_bytes_per_token
        self.memory_free -= job.reserved
        job.scheduled = self.env.now
        if started.host_loaded:
            self._load_host_hit(job, started.host_loaded)
        self.running.append(job)

    def _load_host_hit(self, job: Job, nbytes: int) -> None:
        """Host tier: the request's host hit (``nbytes``) comes back over the host link before
        its prefill may start (its first chunk is scheduled at ``job.ready``). Loads queue on
        the one link (FIFO at its bandwidth); the GPU runs other requests meanwhile. HiCache
        overlaps a load with the forward layer by layer, so this is the conservative bound:
        the whole load on the request's critical path, none of it hidden behind its prefill."""
        host = self.cache.host
        assert host is not None
        begin = max(self.env.now, self._link_free)
        job.ready = self._link_free = begin + host.load_seconds(nbytes)
        job.load_s = job.ready - self.env.now

    def _prefill_splits(self, job: Job) -> list[int]:
        """Checkpoint positions inside the prefill that need an exact state (a pass boundary).

        The scan materialises states on its chunk boundaries (counted from the prefill start)
        for free; a paged admission (fine-grained blocks) runs the scan with its block size as
        chunk, so its block-aligned checkpoints are free too. SGLang's scheduler
        (``engine.request_admission=sglang``) never splits an extend: a retracted request
        prefills its prompt and sampled outputs in one pass (its chunks cut by the token budget
        only) and keeps the state at the end.
        """
        if self.settings.request_admission == "sglang":
            return []
        if not (self.settings.ckpt_split and self.model.is_hybrid):
            return []
        chunk = self.settings.ssm_chunk
        page = self.step.page_size
        if page > 1:
            chunk = min(chunk, page * self.cache.unit)
        start, stop = job.hit, job.input_tokens
        return [c for c in job.ckpt_tokens if start < c < stop and (c - start) % chunk]

    # ------------------------------------------------------------------ iterations
    def _decoders(self) -> list[Job]:
        """Running requests past their prefill with decode steps left, in running order
        (``not in_prefill and decode_left > 0``, inlined: this runs every iteration)."""
        return [
            j for j in self.running if j.decoded < j.decode_end and j.prefilled >= j.input_tokens
        ]

    def _iteration(self):
        """One iteration with prefill chunks: every decoder steps once beside them (mixed
        batching; prefill_first: only when no chunk is ready), the chunks fill the budget."""
        had_decoders = self.settings.request_admission == "sglang" and bool(self._batch_members())
        decoders, chunks = self._iteration_work()
        overlap = self.settings.overlap
        if overlap:
            self._process_results()
        if not chunks and not decoders:  # only host loads in flight: wait (or an arrival)
            if self._decode_skipped:
                return
            yield from self._await_loads()
            return
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
            self._batch_full = False
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
            self._prompt_done(job)

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
            chunks = self._prefill_chunks(self._budget)
            return ([] if chunks else self._iteration_decoders()), chunks
        if self.settings.request_admission != "sglang":
            decoders = self._iteration_decoders()
            return decoders, self._prefill_chunks(self._budget - len(decoders))
        running = self._decoders()
        chunks = self._prefill_chunks(self._budget - len(self._batch_members()))
        if chunks and not self._evict_for(self._step_need(running)):
            return [], chunks
        return self._iteration_decoders(), chunks

    def _join_batch(self, job: Job) -> None:
        """``job``'s prompt ended: with ``engine.request_admission=sglang`` it joins SGLang's
        running batch with this step's admissions, ahead of them when its prompt took
        several steps (the chunked request leads its last chunk's batch)."""
        if self.settings.request_admission == "sglang" and abs(job.batch_rank[0]) != (
            self._admission_passes
        ):
            job.batch_rank = self._rank(-1)

    def _rank(self, index: int) -> tuple[int, int]:
        """Batch rank of the ``index``-th request of the last admission pass: mixed batching
        puts a step's admissions ahead of the running batch, prefill_first behind it (SGLang's
        ``mix_with_running`` and ``merge_batch``)."""
        passes = self._admission_passes
        return (passes if self.settings.batching == "prefill_first" else -passes, index)

    def _iteration_decoders(self) -> list[Job]:
        """The decoders of a mixed iteration, their step's memory held (shared KV pool). The
        new token ratio does not decay: SGLang decays it in ``update_running_batch``, which a
        step that runs a prefill never calls."""
        if self.shared and not self._reserve_decode(1):
            return []
        return self._decoders()

    def _prompt_done(self, job: Job) -> None:
        """``job``'s prefill ended: the request step publishes its prompt. In the shared KV
        pool the prompt's KV passes from the running part to the cache: it is released before
        the insertion, so the insertion fills the job's own room and evicts nothing for it
        (SGLang's ``RadixCache.checkpoint`` never evicts), and what the cache did not take
        stays held (:meth:`_published`)."""
        assert job.started is not None
        if not self.shared:
            self.step.prefilled(job.started)
            return
        prompt_kv = (job.input_tokens - job.published_to) * self.model.kv_bytes_per_token
        job.reserved -= prompt_kv
        self._hold(-prompt_kv)
        earlier = job.started.published  # what its chunks published (:meth:`_checkpoint`)
        self.step.prefilled(job.started, keep_room=False)
        self._published(job, prompt_kv, 0.0 if earlier is None else float(earlier.kv_bytes))

    def _await_loads(self):
        """The GPU idles until the first host load ends, or a request arrives."""
        first = min(j.ready for j in self.running if j.in_prefill)
        self._wakeup = self.env.event()
        yield self.env.timeout(max(first - self.env.now, 0.0)) | self._wakeup

    def _prefill_chunks(self, budget: float) -> list[tuple[Job, int]]:
        """Prefill chunks (job, tokens) of the running requests in order, within ``budget``
        (a request waiting for its host hit's load gets none yet)."""
        chunks: list[tuple[Job, int]] = []
        now = self.env.now
        for job in self.running:
            if budget <= 0:
                break
            if job.prefilled < job.input_tokens and job.ready <= now:
                take = min(self._chunk_size(job, budget), job.held_to - job.prefilled)
                if take > 0:
                    chunks.append((job, take))
                    budget -= take
        return chunks

    def _stash_chunked(self) -> None:
        """The prompts the last step's budget cut publish what they computed
        (:meth:`_checkpoint`) after the step's finished requests, as SGLang's next
        ``get_next_batch_to_run`` stashes its chunked request once the result loop released
        them (the order of their insertions is the order of the Mamba LRU)."""
        for job in self._chunked:
            self._checkpoint(job)
        self._chunked = []

    def _checkpoint(self, job: Job) -> None:
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
        self._hold(-released)
        cached = self.step.checkpoint(job.started, upto)
        took = max(min(cached, upto), job.published_to)
        keep = (upto - took) * kv
        self._hold(keep)
        job.reserved += keep - released
        job.published_to = took  # on a paged tree the chunk's partial last page stays its own

    def _chunk_size(self, job: Job, budget: float) -> int:
        i = bisect.bisect_right(job.splits, job.prefilled)
        stop = job.splits[i] if i < len(job.splits) else job.input_tokens
        return int(min(budget, stop - job.prefilled))

    def _batch(self, chunks: list[tuple[Job, int]], decoders: list[Job]) -> BatchShape:
        loads = sum(1 for job, _ in chunks if job.prefilled == job.hit and job.hit > 0)
        stores = sum(
            bisect.bisect_right(job.ckpt_tokens, job.prefilled + take)
            - bisect.bisect_right(job.ckpt_tokens, job.prefilled)
            for job, take in chunks
        )
        batch = BatchShape(
            prefill=[(job.prefilled, take) for job, take in chunks],
            decode=[j.input_tokens + j.decoded + 1 for j in decoders],
            state_loads=loads if self.model.is_hybrid else 0,
            state_stores=stores * self.cache.ckpt_states if self.model.is_hybrid else 0,
            # logits only where a token is sampled: decodes and chunks that end their prompt
            sampled=len(decoders)
            + sum(1 for job, take in chunks if job.prefilled + take >= job.input_tokens),
        )
        if self.settings.radix_mlp and len(chunks) > 1 and self.cache.unit == 1:
            batch.unique_tokens = unique_tokens(
                [(job.seq, job.prefilled, job.prefilled + take) for job, take in chunks]
            ) + len(decoders)
        if self.settings.shared_prefix_attention:
            batch.shared_kv_tokens = shared_prefix_reads(decoders)
        return batch

    def _span_plan(self) -> tuple[list[Job], int]:
        """The decoders of a decode-only span and its steps (up to the first request's end;
        a shared KV pool: the steps whose memory it could hold, ``_span_fit``). With
        ``engine.request_admission=sglang`` nobody is admitted inside a span: a queued
        request that did not fit waits until a request leaves (``batch_is_full``), which
        ends the span, as an arrival does; after a retraction the queue is tried again at
        the next step, so the span is that one step."""
        limit = 1 if self._results_pending() else None  # the result changes the next step
        fit = self._span_fit = self._reserve_decode(limit) if self.shared else 0
        decoders = [j for j in self.running if j.decoded < j.decode_end]  # decode_left > 0
        if self._decode_skipped:
            return [], 0
        steps = min([j.decode_end - j.decoded for j in decoders])
        if not self.shared:
            return decoders, steps
        if self._retry_next_step():
            return decoders, 1
        return decoders, min(steps, fit)

    def _retry_next_step(self) -> bool:
        """``engine.request_admission=sglang``: whether the next step tries the queue's head
        (its batch is not full, e.g. after a retraction)."""
        return (
            self.settings.request_admission == "sglang"
            and not self._batch_full
            and bool(self.waiting)
            and len(self.running) < self.max_running
            and self._feeder.ready(self.waiting[0])
        )

    def _span_ran(self, decoders: list[Job], done: int) -> None:
        """The span ran ``done`` steps (each decoder's ``decoded`` counts them already)."""
        fit = self._span_fit
        if self.shared:
            self._ratio.decay(done - self._retracted)
        if self.shared and done < fit:  # cut short: give back the steps not run
            unused = (fit - done) * self.model.kv_bytes_per_token
            freed = float(unused * len(decoders))
            for job in decoders:
                job.reserved -= unused
                freed -= self._repad(job, job.input_tokens + job.decoded)
            self._hold(-freed)

    def _decode_span(self):
        """Decode-only stretch until the first request finishes or a new one arrives."""
        decoders, steps = self._span_plan()
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
        self._span_ran(decoders, done)
        if self._queues_tokens:
            for job in decoders:
                job.in_flight = 1

    def preemption_column(self, records: Sequence[RequestRecord]) -> list[int]:
        """Per record (in ``records``' order): times its request was preempted."""
        return [self._preempted_counts.get(r.request_id, 0) for r in records]

    # ------------------------------------------------------------------ completion
    def _complete_finished(self) -> None:
        """Requests done (``not in_prefill and decode_left == 0``, inlined) leave the running
        set, then complete in running order (completing one never reads the running set)."""
        running = self.running
        finished = [
            j for j in running if j.decoded >= j.decode_end and j.prefilled >= j.input_tokens
        ]
        if not finished:
            return
        running[:] = [
            j for j in running if j.decoded < j.decode_end or j.prefilled < j.input_tokens
        ]
        self._batch_full = False  # SGLang's ``filter_batch`` shrank the batch
        if self.settings.request_admission == "sglang":  # its result loop's order
            finished.sort(key=lambda j: j.batch_rank)
        for job in finished:
            self._finish(job)

    def _start_decode(self, job: Job, need: float) -> None:
        """A disaggregated decode replica (:mod:`simlab.engines.cluster`) takes a request whose KV (and
        state) came from its prefill replica: it holds the whole request's memory, computes no
        prefill and touches no cache."""
        job.prefilled = job.input_tokens
        job.reserved = need
        self.memory_free -= need
        job.scheduled = self.env.now
        self.running.append(job)

    def _finish_decode(self, job: Job) -> None:
        """A decode-only request completed: its memory is freed; no record (its prefill
        replica wrote it) and nothing admitted."""
        job.finished = self.env.now
        self.memory_free += job.reserved
        self.stats.last_departure = max(self.stats.last_departure, job.finished)
        job.done.succeed()

    def _finish(self, job: Job) -> None:
        if job.decode_only:
            self._finish_decode(job)
            return
        assert job.started is not None
        job.finished = self.env.now
        if self.shared:  # its KV leaves the running part: the cache may admit it
            self._hold(-job.reserved)
            job.reserved, job.pad = 0.0, 0
            if job.slots:  # its slots go back; its last state takes one (SGLang donates it)
                self._hold_slots(job, -job.slots)
            self._preempted_counts[job.req.request_id] = job.preemptions
        timing = Timing(
            arrival=job.arrival,
            scheduled=job.scheduled,
            first_token=job.first_token,
            finished=job.finished,
            prefill_time=self.cost.prefill_time(job.hit, job.req.input_tokens - job.hit),
        )
        record = self.step.finish(job.started, timing)
        if job.preemptions:  # recomputed: its record keeps its first scheduling's hit
            assert job.first_lookup is not None
            for column, value in hit_columns(self.model, *job.first_lookup).items():
                setattr(record, column, value)
        if self.cache.host is not None:
            record.host_load_s = job.load_s
        if self.shared:
            self._check_pool()
        if self._feeder.finished(job, record):
            self.records.append(record)
            if self._progress is not None:
                self._progress.update()
        self.memory_free += job.reserved
        self.stats.last_departure = max(self.stats.last_departure, job.finished)
        self.stats.occupancy.append((job.finished, self.cache.kv_bytes, self.cache.ssm_bytes))
        self.stats.prefill_tokens += job.input_tokens - job.hit
        job.done.succeed()


def _sessions(requests: Sequence[Request]) -> list[list[Request]]:
    """Requests grouped by session, turns in order, sessions by first arrival."""
    by_session: dict[int, list[Request]] = {}
    for req in requests:
        by_session.setdefault(req.session_id, []).append(req)
    sessions = [sorted(turns, key=lambda r: r.turn) for turns in by_session.values()]
    return sorted(sessions, key=lambda t: (t[0].arrival, t[0].session_id))


def unique_tokens(chunks: list[tuple[np.ndarray, int, int]]) -> int:
    """RadixMLP's ``N'``: tokens of the chunks ``seq[start:end]`` counted once per distinct
    prefix (a token is a duplicate of another chunk's when their whole prefixes are equal)."""
    total = 0
    for i, (seq, start, end) in enumerate(chunks):
        dup = 0
        for other, o_start, o_end in chunks[:i]:
            hi = min(end, o_end)
            if hi <= max(start, o_start):
                continue
            diff = np.flatnonzero(seq[:hi] != other[:hi])
            common = int(diff[0]) if diff.size else hi
            dup = max(dup, min(hi, common) - max(start, o_start))
        total += (end - start) - max(dup, 0)
    return total


def shared_prefix_reads(decoders: list[Job]) -> int:
    """KV token reads saved when decoders reusing the same cached prefix read it once."""
    groups: dict[int, tuple[int, int]] = {}
    for job in decoders:
        if job.hit_node is not None and job.hit:
            count, length = groups.get(id(job.hit_node), (0, job.hit))
            groups[id(job.hit_node)] = (count + 1, min(length, job.hit))
    return sum((count - 1) * length for count, length in groups.values())
