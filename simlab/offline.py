"""Offline batches on the timed engine: BatchLLM's explicit global prefix vs the implicit cache.

The whole batch arrives at t = 0 and is queued in the scheduler's order (``simlab.batchllm``:
BatchLLM groups ordered by ``R_group``, the threshold-sort heuristic, or a random order). For a
group with a shared prefix, an engine-made *prefix job* prefills the prefix first (checkpointed at
its end) and the group's members are held until it is done; the prefix stays pinned in the cache
until the group's last member completes; the prefixes pinned at once hold at most
``prefix_share`` of the cache (a group's prefix job waits for older groups to finish first). Batching is memory-centric: requests are admitted while
their KV fits in ``engine.running_memory_gb`` (set ``engine.max_running`` high so the memory
threshold, not a request count, limits the batch).

Saving ratio (BatchLLM Eq. 1): ``1 - N_processed / N_logical`` where ``N_processed`` counts every
prefilled token, group prefixes included, and ``N_logical`` the batch's input tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simlab.timed import Job, TimedEngine
from traces.format import Request

#: Group prefixes are engine-made requests; their ids are negative so they never clash.
PREFIX_ID_BASE = -1


@dataclass
class _GroupPin:
    """Pins a group's prefix from its prefix job's completion to its last member's."""

    prefix: np.ndarray
    remaining: int
    finished: Any  # simpy event: the group's last member completed
    node: Any = None

    def prefix_done(self, job: Job, engine: TimedEngine) -> None:
        probe = np.append(self.prefix, np.int32(-1))  # so a hit may cover the whole prefix
        self.node = engine.cache.lookup(probe).hit_node
        engine.cache.pin(self.node)

    def member_done(self, engine: TimedEngine) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            if self.node is not None:
                engine.cache.unpin(self.node)
            self.finished.succeed()


@dataclass
class BatchFeeder:
    """The feeder process for :meth:`TimedEngine.run`: queues a planned batch at t = 0."""

    requests: Sequence[Request]
    groups: Sequence[Any]  # simlab.batchllm.Group: prefix_len, members (batch positions)
    prefix_share: float = 0.5  # of the cache that pinned group prefixes may hold at once
    prefix_jobs: int = field(default=0, init=False)

    def __call__(self, engine: TimedEngine):
        pins: list[_GroupPin] = []
        budget = self.prefix_share * engine.cache.capacity
        for group in self.groups:
            after = None
            pin = None
            members = [self.requests[i] for i in group.members]
            if group.prefix_len and len(members) > 1:
                prefix = members[0].input_ids[: group.prefix_len]
                pin = _GroupPin(prefix, len(members), engine.env.event())
                after = self._submit_prefix(
                    engine, pin, self._oldest_live(pins, pin, budget, engine)
                ).done
                pins.append(pin)
            for req in members:
                job = Job(req=req, arrival=engine.env.now, done=engine.env.event(), after=after)
                if pin is not None:
                    job.on_finish = lambda _job, p=pin: p.member_done(engine)
                engine.submit(job)
        yield engine.env.timeout(0)

    @staticmethod
    def _oldest_live(
        pins: list[_GroupPin], new: _GroupPin, budget: float, engine: TimedEngine
    ) -> _GroupPin | None:
        """The group that must finish before ``new``'s prefix is cached: the newest one whose
        departure brings the live prefixes (newest first, ``new`` included) within ``budget``."""
        per_id = engine.cache.kv_per_token
        held = len(new.prefix) * per_id
        for older in reversed(pins):
            held += len(older.prefix) * per_id
            if held > budget:
                return older
        return None

    def _submit_prefix(self, engine: TimedEngine, pin: _GroupPin, older: _GroupPin | None) -> Job:
        self.prefix_jobs += 1
        req = Request(
            request_id=PREFIX_ID_BASE - self.prefix_jobs,
            session_id=PREFIX_ID_BASE - self.prefix_jobs,
            turn=0,
            arrival=engine.env.now,
            input_ids=pin.prefix,
            output_ids=np.zeros(0, dtype=np.int32),
            output_len=0,
        )
        job = Job(req=req, arrival=engine.env.now, done=engine.env.event(), internal=True)
        job.after = older.finished if older is not None else None
        job.on_finish = lambda finished: pin.prefix_done(finished, engine)
        return engine.submit(job)


def saving_ratio(engine: TimedEngine, requests: Sequence[Request]) -> float:
    """BatchLLM Eq. 1 over what the engine actually prefilled."""
    logical = sum(req.input_tokens for req in requests)
    return 1.0 - engine.stats.prefill_tokens / logical if logical else 0.0
