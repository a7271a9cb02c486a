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

The prefix cache's clock is logical: it advances by one at every lookup, so recency is the same
order-based quantity as in the replay engine (at low load both engines take identical decisions).
An eviction policy's optional ``observe(cache, request, admission)`` hook is called after each
admission (at completion), as in the replay engine: a learning policy (Marconi's alpha tuning)
sees requests in completion order, the logical request order of the cache's admissions.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from policies.base import AdmissionPolicy, EvictionPolicy
from simlab.cache import Node, PrefixCache
from simlab.costmodel import BatchShape, CostModel
from simlab.records import RequestRecord
from traces.format import Request

TOKENS_PER_WORD = 1.33  # cl100k on English prose; converts tokens to words for typing time


@dataclass(frozen=True)
class TimedSettings:
    """``engine`` config of the timed engine (validated)."""

    token_budget: int = 8192
    max_running: int = 256
    running_memory_gb: float = 16.0
    ckpt_split: bool = True
    ssm_chunk: int = 256
    radix_mlp: bool = False
    shared_prefix_attention: bool = False
    typing_wpm: float | None = None

    def __post_init__(self) -> None:
        for key in ("token_budget", "max_running", "ssm_chunk"):
            if not (isinstance(getattr(self, key), int) and getattr(self, key) >= 1):
                raise ValueError(
                    f"engine.{key} must be an integer >= 1, got {getattr(self, key)!r}"
                )
        if not self.running_memory_gb > 0:
            raise ValueError(
                f"engine.running_memory_gb must be > 0, got {self.running_memory_gb!r}"
            )
        if self.typing_wpm is not None and not self.typing_wpm > 0:
            raise ValueError(f"engine.typing_wpm must be > 0 or null, got {self.typing_wpm!r}")


@dataclass
class Job:
    """A request in the system; times in simulated seconds (NaN until they happen)."""

    req: Request
    arrival: float
    done: simpy.Event
    seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    unit: int = 1  # tokens per id of the trace
    hit: int = 0  # tokens
    matched: int = 0  # tokens
    hit_node: Node | None = None
    ckpts: list[int] = field(default_factory=list)  # ids (tree positions)
    end: int = 0  # ids
    ckpt_tokens: list[int] = field(default_factory=list)  # checkpoint positions in tokens
    splits: list[int] = field(default_factory=list)  # tokens
    prefilled: int = 0  # tokens
    decoded: int = 0
    reserved: float = 0.0
    after: simpy.Event | None = None  # not scheduled before this event (offline group prefixes)
    internal: bool = False  # engine-made work (a group prefix): no record of its own
    on_finish: Callable[[Job], None] | None = None  # called right after its admission
    scheduled: float = math.nan
    first_token: float = math.nan
    finished: float = math.nan
    input_tokens: int = field(init=False)  # req.input_tokens, read in every iteration
    output_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.input_tokens = self.req.input_tokens
        self.output_len = self.req.output_len

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.input_tokens

    @property
    def decode_left(self) -> int:
        """Decode steps still to run (the first output token comes with the prefill)."""
        return max(self.output_len - 1 - self.decoded, 0)


@dataclass
class EngineStats:
    """Aggregates for the run summary (queue area for Little's law, GPU busy time)."""

    busy: float = 0.0
    queue_area: float = 0.0
    iterations: int = 0
    events: int = 0
    prefill_tokens: int = 0  # tokens actually prefilled (group prefixes included)
    first_arrival: float = math.inf
    last_departure: float = 0.0
    occupancy: list[tuple[float, int, int]] = field(default_factory=list)


class TimedEngine:
    """One run of the timed world for one policy; see the module docstring."""

    def __init__(
        self,
        requests: list[Request],
        cache: PrefixCache,
        admission: AdmissionPolicy,
        eviction: EvictionPolicy,
        cost: CostModel,
        settings: TimedSettings,
        policy: str,
    ):
        self.cache, self.admission, self.eviction = cache, admission, eviction
        self.cost, self.settings, self.policy = cost, settings, policy
        self.model = cache.model
        self.env = simpy.Environment()
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.records: list[RequestRecord] = []
        self.stats = EngineStats()
        self.memory_free = settings.running_memory_gb * 1e9
        self._queue_changed = 0.0
        self._wakeup = self.env.event()
        self._sessions = _sessions(requests)
        self._open_sessions = len(self._sessions)
        self._observe = getattr(eviction, "observe", None)
        for plugin in (admission, eviction):
            prepare = getattr(plugin, "prepare", None)
            if prepare is not None:
                prepare(sorted(requests, key=lambda r: (r.arrival, r.session_id, r.turn)))

    # ------------------------------------------------------------------ world
    def run(self, feeder: Any = None) -> list[RequestRecord]:
        """Simulate until every request completed; ``feeder`` (a generator function taking the
        engine) replaces the session processes, e.g. an offline batch (``simlab.offline``)."""
        if feeder is None:
            for turns in self._sessions:
                self.env.process(self._session(turns))
        else:
            self._open_sessions = 1
            self.env.process(self._feed(feeder))
        self.env.process(self._gpu())
        self.env.run()
        stuck = len(self.waiting) + len(self.running)
        if stuck:
            raise RuntimeError(f"{stuck} requests never completed (running memory too small?)")
        self.records.sort(key=lambda r: (r.arrival, r.session_id, r.turn))
        return self.records

    def _session(self, turns: list[Request]):
        yield self.env.timeout(turns[0].arrival)
        for k, req in enumerate(turns):
            if k:
                yield self.env.timeout(self._think(turns[k - 1], req))
            yield self.submit(Job(req=req, arrival=self.env.now, done=self.env.event())).done
        self._open_sessions -= 1

    def _feed(self, feeder: Any):
        yield from feeder(self)
        self._open_sessions -= 1

    def submit(self, job: Job) -> Job:
        """Queue a job (FCFS) and wake the GPU."""
        self.stats.first_arrival = min(self.stats.first_arrival, self.env.now)
        self._note_queue()
        self.waiting.append(job)
        if not self._wakeup.triggered:
            self._wakeup.succeed()
        return job

    def _think(self, prev: Request, req: Request) -> float:
        """Gap between a request's completion and the session's next request."""
        if self.settings.typing_wpm is None:
            return max(req.arrival - prev.arrival, 0.0)
        new_tokens = max(req.input_tokens - prev.input_tokens - prev.output_len, 0)
        return new_tokens / TOKENS_PER_WORD / self.settings.typing_wpm * 60.0

    def _note_queue(self) -> None:
        """Accumulate the time integral of the queue length (call before it changes)."""
        now = self.env.now
        self.stats.queue_area += len(self.waiting) * (now - self._queue_changed)
        self._queue_changed = now

    # ------------------------------------------------------------------ GPU
    def _gpu(self):
        env = self.env
        while True:
            self._schedule()
            if not self.running:
                if self._no_more_arrivals():
                    return
                self._wakeup = env.event()
                yield self._wakeup
                continue
            if any(j.in_prefill for j in self.running):
                yield from self._iteration()
            else:
                yield from self._decode_span()
            self._complete_finished()

    def _no_more_arrivals(self) -> bool:
        return not self.waiting and self._open_sessions == 0

    # ------------------------------------------------------------------ scheduling
    def _schedule(self) -> None:
        """Move queued requests into the running set while the limits allow (FCFS)."""
        while self.waiting and len(self.running) < self.settings.max_running:
            job = self.waiting[0]
            if job.after is not None and not job.after.triggered:
                return
            need = self._reservation(job)
            if need > self.memory_free and self.running:
                return
            self._note_queue()
            self.waiting.popleft()
            self._start(job, need)

    def _reservation(self, job: Job) -> float:
        """Running memory a request holds: KV of what it computes plus one SSM state."""
        req = job.req
        tokens = req.input_tokens + req.output_len
        return tokens * self.model.kv_bytes_per_token + self.model.ssm_state_bytes

    def _start(self, job: Job, need: float) -> None:
        cache, req = self.cache, job.req
        cache.now += 1.0
        lookup = cache.lookup(req.input_ids, self.admission.page_size)
        self.eviction.on_hit(cache, lookup)
        job.seq = req.full_sequence()
        plan = self.admission.plan(lookup, req.input_len, int(job.seq.shape[0]))
        job.unit = cache.unit
        job.hit, job.matched = req.hit_tokens(lookup.hit), req.hit_tokens(lookup.matched)
        job.hit_node = lookup.hit_node
        job.ckpts, job.end = plan.ckpts, plan.end
        job.ckpt_tokens = [c * job.unit for c in plan.ckpts]
        job.splits = self._prefill_splits(job)
        job.prefilled = job.hit
        job.reserved = need - job.hit * self.model.kv_bytes_per_token
        self.memory_free -= job.reserved
        job.scheduled = self.env.now
        cache.pin(job.hit_node)
        self.running.append(job)

    def _prefill_splits(self, job: Job) -> list[int]:
        """Checkpoint positions inside the prefill that need an exact state (a pass boundary).

        The scan materialises states on its chunk boundaries (counted from the prefill start)
        for free; a paged admission (fine-grained blocks) runs the scan with its block size as
        chunk, so its block-aligned checkpoints are free too.
        """
        if not (self.settings.ckpt_split and self.model.is_hybrid):
            return []
        chunk = self.settings.ssm_chunk
        if self.admission.page_size > 1:
            chunk = min(chunk, self.admission.page_size * job.unit)
        start, stop = job.hit, job.input_tokens
        return [c for c in job.ckpt_tokens if start < c < stop and (c - start) % chunk]

    # ------------------------------------------------------------------ iterations
    def _iteration(self):
        """One mixed iteration: every decoder steps once; prefill chunks fill the budget."""
        budget = self.settings.token_budget
        decoders = [j for j in self.running if not j.in_prefill and j.decode_left > 0]
        budget -= len(decoders)
        chunks: list[tuple[Job, int]] = []
        for job in self.running:
            if job.in_prefill and budget > 0:
                take = self._chunk_size(job, budget)
                chunks.append((job, take))
                budget -= take
        batch = self._batch(chunks, decoders)
        duration = self.cost.time(batch)
        yield self.env.timeout(duration)
        self.stats.busy += duration
        self.stats.iterations += 1
        for job in decoders:
            job.decoded += 1
        for job, take in chunks:
            job.prefilled += take
            if not job.in_prefill:
                job.first_token = self.env.now

    def _chunk_size(self, job: Job, budget: int) -> int:
        i = bisect.bisect_right(job.splits, job.prefilled)
        stop = job.splits[i] if i < len(job.splits) else job.input_tokens
        return min(budget, stop - job.prefilled)

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
            state_stores=stores if self.model.is_hybrid else 0,
        )
        if self.settings.radix_mlp and len(chunks) > 1 and self.cache.unit == 1:
            batch.unique_tokens = unique_tokens(
                [(job.seq, job.prefilled, job.prefilled + take) for job, take in chunks]
            ) + len(decoders)
        if self.settings.shared_prefix_attention:
            batch.shared_kv_tokens = shared_prefix_reads(decoders)
        return batch

    def _decode_span(self):
        """Decode-only stretch until the first request finishes or a new one arrives."""
        decoders = [j for j in self.running if j.decode_left > 0]
        steps = min(j.decode_left for j in decoders)
        contexts = np.array([j.input_tokens + j.decoded + 1 for j in decoders])
        shared = shared_prefix_reads(decoders) if self.settings.shared_prefix_attention else 0
        ends = np.cumsum(self.cost.decode_span(contexts, steps, shared))
        start = self.env.now
        self._wakeup = self.env.event()
        if len(self.running) < self.settings.max_running:  # an arrival could join the batch
            yield self.env.timeout(float(ends[-1])) | self._wakeup
        else:
            yield self.env.timeout(float(ends[-1]))
        elapsed = self.env.now - start
        done = int(np.searchsorted(ends, elapsed - 1e-12, side="left")) + 1
        done = min(done, steps)
        if self.env.now < start + float(ends[done - 1]):  # finish the step in progress
            yield self.env.timeout(start + float(ends[done - 1]) - self.env.now)
        self.stats.busy += float(ends[done - 1])
        self.stats.iterations += done
        for job in decoders:
            job.decoded += done

    # ------------------------------------------------------------------ completion
    def _complete_finished(self) -> None:
        for job in [j for j in self.running if not j.in_prefill and j.decode_left == 0]:
            self.running.remove(job)
            self._finish(job)

    def _finish(self, job: Job) -> None:
        cache = self.cache
        job.finished = self.env.now
        admitted = cache.insert(job.seq, job.ckpts, job.end, self.eviction)
        cache.unpin(job.hit_node)
        if job.on_finish is not None:
            job.on_finish(job)
        if self._observe is not None:
            self._observe(cache, job.req, self.admission)
        self.memory_free += job.reserved
        self.stats.last_departure = max(self.stats.last_departure, job.finished)
        self.stats.occupancy.append((job.finished, cache.kv_bytes, cache.ssm_bytes))
        self.stats.prefill_tokens += job.req.input_tokens - job.hit
        if not job.internal:
            self.records.append(self._record(job, admitted))
        job.done.succeed()

    def _record(self, job: Job, admitted: Any) -> RequestRecord:
        req, model = job.req, self.model
        tpot = (
            (job.finished - job.first_token) / (req.output_len - 1)
            if req.output_len > 1
            else math.nan
        )
        return RequestRecord(
            policy=self.policy,
            request_id=req.request_id,
            session_id=req.session_id,
            turn=req.turn,
            arrival=job.arrival,
            input_tokens=req.input_tokens,
            output_tokens=req.output_len,
            matched_tokens=job.matched,
            hit_tokens=job.hit,
            prefill_flops=model.prefill_flops(0, req.input_tokens),
            flops_saved=model.prefill_flops(0, job.hit) if job.hit else 0.0,
            kv_bytes_admitted=admitted.kv_bytes,
            ssm_bytes_admitted=admitted.ssm_bytes,
            ckpts_admitted=admitted.ckpts,
            bytes_evicted=admitted.evicted_bytes,
            nodes_evicted=admitted.evicted_nodes,
            admission_truncated=admitted.truncated,
            cache_kv_bytes=self.cache.kv_bytes,
            cache_ssm_bytes=self.cache.ssm_bytes,
            scheduled=job.scheduled,
            first_token=job.first_token,
            finished=job.finished,
            ttft=job.first_token - job.arrival,
            queue_delay=job.scheduled - job.arrival,
            tpot=tpot,
            e2e=job.finished - job.arrival,
            prefill_time=self.cost.prefill_time(job.hit, req.input_tokens - job.hit),
        )


def _sessions(requests: list[Request]) -> list[list[Request]]:
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
