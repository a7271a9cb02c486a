"""A request's life in the timed engine (:class:`Job`) and the run's counters
(:class:`EngineStats`, :class:`PoolStats`), shared by :mod:`simlab.engines.timed.world` and
its memories."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from simlab.cache.nodes import Node
from simlab.engines import block_pool as vllm_pool
from simlab.engines.step import Started
from simlab.engines.timed.new_token_ratio import CLIP_MAX_NEW_TOKENS
from traces.format import Request

if TYPE_CHECKING:
    from simlab.engines.timed.settings import TimedSettings


@dataclass
class Job:
    """A request in the system; times in simulated seconds (NaN until they happen)."""

    req: Request
    arrival: float
    done: simpy.Event
    started: Started | None = None  # the request step's state, from scheduling on
    seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    hit: int = 0  # tokens
    hit_node: Node | None = None
    ckpt_tokens: list[int] = field(default_factory=list)  # checkpoint positions in tokens
    splits: list[int] = field(default_factory=list)  # tokens
    prefilled: int = 0  # tokens
    held_to: int = 0  # tokens: its prompt's KV is held (or in the cache) up to here
    published_to: int = 0  # tokens: its prompt is in the cache up to here (the hit, a checkpoint)
    decoded: int = 0
    reserved: float = 0.0
    #: shared KV pool on SGLang's paged allocator: tokens of its last page beyond its
    #: allocation, held with it (in ``reserved``); 0 on a pool of one-token pages
    pad: int = 0
    scheduled: float = math.nan
    first_token: float = math.nan
    finished: float = math.nan
    preemptions: int = 0  # shared KV pool: times it was preempted (recompute)
    ready: float = 0.0  # host tier: its prefill may start once its host hit is loaded
    load_s: float = 0.0  # host tier: seconds from scheduling to that load's end
    order: int = -1  # shared KV pool: rank of its first scheduling
    first_lookup: tuple[int, int] | None = None  # its first scheduling's (matched, hit) tokens
    decode_only: bool = False  # disaggregated decode replica: its KV arrived, no prefill here
    pool_run: vllm_pool.PoolRun | None = None  # vLLM's hybrid pool: its blocks (timed_pool)
    slots: int = 0  # shared KV pool beside a separate SSM pool: the state slots it holds
    #: its states are placed as its extends and decode steps run (SGLang's ``extra_buffer``:
    #: :meth:`RequestStep.tracks_runs`); ``chunk_state``: the one its last chunk tracked
    tracks: bool = False
    chunk_state: int | None = None
    #: shared KV pool: its place in SGLang's running batch (a mixed step puts the requests
    #: it admits first, in admission order): (-admission pass, index in it), ascending
    batch_rank: tuple[int, int] = (0, 0)
    #: ``engine.overlap``: output tokens it sampled in the last batch, whose result SGLang has
    #: not processed yet (0 or 1): its ``output_ids`` lag its ``decoded`` by that many
    in_flight: int = 0
    input_tokens: int = field(init=False)  # tokens its prefill computes (see ``resume``)
    output_len: int = field(init=False)
    decode_end: int = field(init=False)  # decode steps after its prefill (output_len - 1)

    def __post_init__(self) -> None:
        self.input_tokens = self.req.input_tokens
        self.output_len = self.req.output_len
        self.decode_end = self.output_len - 1

    def resume(self) -> None:
        """Preempted (recompute): what it computed is dropped, and the outputs it sampled are
        prefilled again with its prompt, the last chunk sampling its next token, as vLLM
        (``num_tokens - num_computed_tokens`` once ``num_computed_tokens`` is reset) and
        SGLang (a retracted request's ``fill_ids`` hold its outputs) do. Invariant:
        ``input_tokens + decode_end + 1 == req.input_tokens + output_len``."""
        sampled = self.decoded + 1 - self.in_flight if self.prefilled >= self.input_tokens else 0
        self.in_flight = 0  # SGLang drops a retracted request's queued token
        self.input_tokens += sampled
        self.decode_end -= sampled
        self.prefilled = self.decoded = 0

    @property
    def refill(self) -> int:
        """Outputs a recomputed job prefills again with its prompt (0 until it is preempted),
        which the shared pool's radix tree matches and publishes with it
        (:meth:`RequestStep.start`): SGLang keys a retracted request by its fill ids."""
        return self.input_tokens - self.req.input_tokens

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.input_tokens

    @property
    def outputs_left(self) -> int:
        """Output tokens still to sample (SGLang's ``max_new_tokens - len(output_ids)``, its
        ``max_new_tokens`` being the output length); its first comes with the prefill."""
        return (
            self.decode_end - self.decoded + (self.prefilled < self.input_tokens) + self.in_flight
        )

    @property
    def decode_left(self) -> int:
        """Decode steps still to run (the first output token comes with the prefill)."""
        return max(self.decode_end - self.decoded, 0)


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
    stalled: set[int] = field(default_factory=set)  # ids of requests that waited for memory
    #: ``kv_pool=separate``: request id -> the running memory (bytes) of a request that needed
    #: more than ``engine.running_memory_gb`` and so started alone, over the budget
    over_budget: dict[int, float] = field(default_factory=dict)

    def summary(self, n_requests: int) -> dict[str, Any]:
        """GPU busy fraction and the queue's time-average length (Little's law: = rate x
        delay)."""
        span = self.last_departure - self.first_arrival
        return {
            "gpu_busy_frac": self.busy / span if span > 0 else 0.0,
            "mean_queue_len": self.queue_area / span if span > 0 else 0.0,
            "arrival_rate": n_requests / span if span > 0 else 0.0,
            "iterations": self.iterations,
        }


@dataclass
class PoolStats:
    """The shared KV pool (``engine.kv_pool=shared``): its budget, the bytes running sequences
    hold, and what making room cost (preemptions, recomputed tokens, cache bytes evicted)."""

    budget: float = math.inf
    held: float = 0.0
    peak_held: float = 0.0
    preemptions: int = 0
    preempted: set[int] = field(default_factory=set)  # request ids
    recomputed_tokens: int = 0
    evicted_bytes: int = 0
    started: int = 0  # first schedulings so far (a job's ``order``)
    ssm_budget: float | None = None  # a separate SSM pool's bytes (``cache.ssm_gb``)
    slots_per_request: int = 0  # state slots a running request holds in it
    max_running: int = 0  # the engine's cap on running requests that the SSM pool sets
    held_slots: int = 0
    peak_held_slots: int = 0

    def summary(self, settings: TimedSettings) -> dict[str, Any]:
        out = {
            "kv_pool": settings.kv_pool,
            "preemption": settings.preemption,
            "request_admission": settings.request_admission,
            "pool_gb": self.budget / 1e9,
            "preemptions": self.preemptions,
            "preempted_requests": len(self.preempted),
            "recomputed_tokens": self.recomputed_tokens,
            "pool_evicted_gb": self.evicted_bytes / 1e9,
            "peak_running_gb": self.peak_held / 1e9,
        }
        if settings.overlap:  # SGLang's overlap scheduler's order (absent: the normal loop's)
            out["overlap"] = True
        if self.ssm_budget is not None:
            out |= {
                "ssm_pool_gb": self.ssm_budget / 1e9,
                "ssm_max_running": self.max_running,
                "peak_running_states": self.peak_held_slots,
            }
        return out


def clipped_max_new(job: Job) -> int:
    """The outputs SGLang reserves for a request it admits or whose prompt's last chunk it
    schedules: its whole ``max_new_tokens`` (the output length here), clipped, even for a
    retracted request that sampled some already (``_update_prefill_budget``); its admission
    check asks room only for those left (``Admission._sglang_need``)."""
    return min(job.req.output_len, CLIP_MAX_NEW_TOKENS)
