"""How a timed world's requests hold memory and get scheduled: the :class:`Memory` a
:class:`simlab.engines.timed.world.TimedWorld` calls at each step of its loop. On the prefix
tree it is :class:`SeparateMemory` (``engine.kv_pool=separate``: the running sequences have
memory of their own beside the cache) or :class:`simlab.engines.timed.shared.SharedMemory`
(``engine.kv_pool=shared``), chosen by :func:`tree_memory`; on vLLM's block pool it is
:class:`simlab.engines.timed.vllm.VllmMemory`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from simlab.config import ConfigError
from simlab.engines.timed.jobs import Job
from simlab.engines.timed.shared import SharedMemory
from simlab.engines.timed.tree import TreeJobs
from traces.format import Request

if TYPE_CHECKING:
    from simlab.engines.timed.world import TimedWorld


class Memory(Protocol):
    """The world's memory and scheduler. ``schedule()`` moves queued jobs into the running set;
    an iteration then runs ``prefill_chunks(budget)`` beside ``iteration_decoders()`` when
    ``prefills()``, else a decode-only span of ``span_plan()``'s decoders and steps, after
    which ``span_ran(decoders, done)``; ``prompt_done(job)`` when a prompt's prefill ended,
    ``checkpoint(job)`` when the budget cut one (SGLang publishes it chunk by chunk);
    ``complete(finished)`` once jobs finished, in their completion order. ``decode_fits``:
    SGLang's memory check of a mixed step, which evicts and retracts nobody. ``peek(req)``:
    ``(matched, hit)`` tokens ``req`` would get now, read-only (a router's view);
    ``cache_peaks()``: peak cached bytes for the run's summary (none: the request step's cache
    has them); ``ended()``: the run ended. ``preempts``: whether running requests can be
    preempted (the run then reports preemptions)."""

    preempts: bool

    def schedule(self) -> None: ...
    def prefills(self) -> bool: ...
    def prefill_chunks(self, budget: float) -> list[tuple[Job, int]]: ...
    def iteration_decoders(self) -> list[Job]: ...
    def decode_fits(self, decoders: list[Job]) -> bool: ...
    def prompt_done(self, job: Job) -> None: ...
    def checkpoint(self, job: Job) -> None: ...
    def span_plan(self) -> tuple[list[Job], int]: ...
    def span_ran(self, decoders: list[Job], done: int) -> None: ...
    def complete(self, finished: list[Job]) -> None: ...
    def peek(self, req: Request) -> tuple[int, int]: ...
    def cache_peaks(self) -> dict[str, float]: ...
    def ended(self) -> None: ...


#: a world's memory, made once the world's state exists (before its request step is prepared)
MemoryFactory = Callable[["TimedWorld", Sequence[Request]], Memory]


def tree_memory(world: TimedWorld, requests: Sequence[Request]) -> Memory:
    """The prefix tree's memory for ``engine.kv_pool``."""
    s = world.settings
    if s.overlap and s.request_admission != "sglang":
        raise ConfigError(
            "engine.overlap: SGLang's overlap scheduler needs "
            "engine.request_admission=sglang, vLLM's async scheduling runs on vLLM's block "
            "pool (policy=vllm: a hybrid, or a Transformer with engine.kv_pool=shared); "
            f"got engine.request_admission={s.request_admission!r} on the prefix tree (where "
            "a disaggregated cluster's replicas always run)"
        )
    if s.kv_pool == "shared":
        return SharedMemory(world, requests)
    return SeparateMemory(world)


class SeparateMemory:
    """``engine.kv_pool=separate``: running requests hold ``engine.running_memory_gb`` of
    their own (``free``: what is left of it), their whole KV and one SSM state each from
    scheduling to completion, beside the prefix cache; nobody is preempted. A disaggregated
    decode replica's jobs (``Job.decode_only``) hold their memory and touch no cache."""

    preempts = False

    def __init__(self, world: TimedWorld):
        self.world, self.step, self.cache = world, world.step, world.cache
        self.model = world.model
        self.tree = TreeJobs(world)
        self.free = world.settings.running_memory_gb * 1e9

    def schedule(self) -> None:
        """Move queued requests into the running set while the limits allow (FCFS)."""
        world = self.world
        waiting, running = world.waiting, world.running
        while waiting and len(running) < world.max_running:
            job = waiting[0]
            if not world.feeder.ready(job):
                return
            need = self._reservation(job)
            if need > self.free and running:
                world.stats.stalled.add(job.req.request_id)
                return
            if need > self.free:  # alone, and more than the whole budget
                world.stats.over_budget[job.req.request_id] = need
            world.note_queue()
            waiting.popleft()
            if job.decode_only:
                self._start_decode(job, need)
            else:
                self.tree.start(job, need)
                self.free -= job.reserved

    def _reservation(self, job: Job) -> float:
        """Running memory a request holds: KV of what it computes plus one SSM state."""
        req = job.req
        tokens = req.input_tokens + req.output_len
        return tokens * self.model.kv_bytes_per_token + self.model.ssm_state_bytes

    def _start_decode(self, job: Job, need: float) -> None:
        """A disaggregated decode replica (:mod:`simlab.engines.cluster`) takes a request whose
        KV (and state) came from its prefill replica: it holds the whole request's memory,
        computes no prefill and touches no cache."""
        job.prefilled = job.input_tokens
        job.reserved = need
        self.free -= need
        job.scheduled = self.world.env.now
        self.world.running.append(job)

    def prefills(self) -> bool:
        return self.world.prefilling()

    def prefill_chunks(self, budget: float) -> list[tuple[Job, int]]:
        return self.tree.prefill_chunks(budget)

    def iteration_decoders(self) -> list[Job]:
        return self.world.decoders()

    def decode_fits(self, decoders: list[Job]) -> bool:
        """Whether the cache has room for the decoders' next token, evicting for it."""
        need = len(decoders) * self.model.kv_bytes_per_token
        cache = self.cache
        if need > cache.free_bytes:
            freed, _ = cache.evict(need, self.step.eviction)
            self.world.pool.evicted_bytes += freed
        return need <= cache.free_bytes

    def prompt_done(self, job: Job) -> None:
        """``job``'s prefill ended: the request step publishes its prompt."""
        assert job.started is not None
        self.step.prefilled(job.started)

    def checkpoint(self, job: Job) -> None:
        """Prompts are published whole here."""

    def span_plan(self) -> tuple[list[Job], int]:
        """The decoders of a decode-only span and its steps, up to the first request's end."""
        decoders = [j for j in self.world.running if j.decoded < j.decode_end]
        return decoders, min([j.decode_end - j.decoded for j in decoders])

    def span_ran(self, decoders: list[Job], done: int) -> None:
        pass

    def complete(self, finished: list[Job]) -> None:
        for job in finished:
            if job.decode_only:
                self._finish_decode(job)
                continue
            job.finished = self.world.env.now
            record = self.tree.record(job)
            self.free += job.reserved
            self.world.complete(job, record)

    def _finish_decode(self, job: Job) -> None:
        """A decode-only request completed: its memory is freed; no record (its prefill
        replica wrote it) and nothing admitted."""
        job.finished = self.world.env.now
        self.free += job.reserved
        stats = self.world.stats
        stats.last_departure = max(stats.last_departure, job.finished)
        job.done.succeed()

    def peek(self, req: Request) -> tuple[int, int]:
        return self.step.peek(req)

    def cache_peaks(self) -> dict[str, float]:
        return {}

    def ended(self) -> None:
        pass
