"""Offline batches on the timed engine: BatchLLM's explicit global prefix vs the implicit cache.

The whole batch arrives at t = 0 and is queued in the scheduler's order (``simlab.engines.batchllm``:
BatchLLM groups ordered by ``R_group``, the threshold-sort heuristic, or a random order). For a
group with a shared prefix, an engine-made *prefix job* prefills the prefix first (checkpointed at
its end) and the group's members are held until it is done; the prefix stays pinned in the cache
until the group's last member completes; the prefixes pinned at once hold at most
``prefix_share`` of the cache, each counted with its KV and the SSM states its policy plans
(:meth:`simlab.engines.step.RequestStep.admission_bytes`; a group's prefix job waits for older groups
to finish first). Batching is memory-centric: requests are admitted while
their KV fits in ``engine.running_memory_gb`` (set ``engine.max_running`` high so the memory
threshold, not a request count, limits the batch).

Saving ratio (BatchLLM Eq. 1): ``1 - N_processed / N_logical`` where ``N_processed`` counts every
prefilled token, group prefixes included, and ``N_logical`` the batch's input tokens.

A prefix job has no record of its own: each token it prefilled is charged (tokens and FLOPs) to
the first of its group's members, in completion order, whose hit covers it. So a member's
``hit_tokens`` are the tokens not computed for it, and no plan beats the infinite cache's hits
(without the charge a batch reported 0.909 against an infinite bound of 0.852). When the members
reuse all of it (a checkpoint at the prefix's end), the batch's token hit rate is its saving
ratio; a token no member reuses (a hybrid whose checkpoints miss the prefix's end) was computed
again by the members and is charged to none, so the hit rate is then above the saving ratio.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from simlab.engines.base import EngineRun
from simlab.engines.batchllm import Group
from simlab.engines.records import RequestRecord
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.jobs import Job
from simlab.engines.timed.world import TimedWorld
from traces.format import Request

#: Group prefixes are engine-made requests; their ids are negative so they never clash.
PREFIX_ID_BASE = -1


@dataclass(frozen=True)
class OfflineEngine(TimedEngine):
    """``engine=offline``: the timed engine fed a planned batch at t = 0 (``scheduler``: a
    :mod:`simlab.engines.batchllm` scheduler with ``plan(requests) -> groups`` and a ``name``)."""

    name: str = "offline"
    scheduler: Any = None
    prefix_share: float = 0.5  # of the cache that pinned group prefixes may hold at once

    def __post_init__(self) -> None:
        super().__post_init__()
        share = self.prefix_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
            raise ValueError(f"engine.prefix_share must be a number in [0, 1], got {share!r}")

    def defaults_caveat(self, keys: tuple[str, ...] | None = None) -> str | None:
        """The token budget and the batching only: batching is memory-centric here (BatchLLM),
        ``engine.max_running`` no request cap by design."""
        return super().defaults_caveat(keys or ("token_budget", "batching"))

    def run(self, requests: Sequence[Request], step: RequestStep) -> EngineRun:
        groups = self.scheduler.plan(requests)
        world = self.world(requests, step)
        records = world.run(BatchFeeder(requests, groups, self.prefix_share))
        extras = world.stats.summary(len(records)) | {
            "scheduler": self.scheduler.name,
            "saving_ratio": saving_ratio(world, requests),
            "plan_saving_ratio": plan_saving_ratio(groups, requests),
        }
        return EngineRun(records, extras, world.stats.occupancy)


@dataclass
class _GroupPin:
    """Pins a group's prefix from its prefix job's completion to its last member's."""

    job: Request  # the engine-made prefix job
    remaining: int
    finished: Any  # simpy event: the group's last member completed
    nbytes: int = 0  # what the prefix holds once cached (KV and planned states)
    node: Any = None
    charged: int = 0  # the prefix job's prefill not charged yet: tokens [charged, prefix end)

    def prefix_done(self, world: TimedWorld, record: RequestRecord) -> None:
        """Pin the node holding the cached prefix, found as the policy's own lookup finds it
        (its keys and pages: a block-keyed policy's tree holds block ids, not tokens)."""
        ids = np.append(self.job.input_ids, np.int32(-1))  # so a hit may cover the whole prefix
        _, self.node = world.step.peek_hit(replace(self.job, input_ids=ids))
        world.cache.pin(self.node)
        self.charged = record.hit_tokens  # what the prefix job reused is nobody's cost

    def charge(self, record: RequestRecord, world: TimedWorld) -> None:
        """Charge the member the prefix job's prefilled tokens its hit covers and no member
        before it was charged. Invariant: 0 <= charged tokens <= the member's hit tokens."""
        end = min(record.hit_tokens, self.job.input_tokens)
        if end <= self.charged:
            return
        record.hit_tokens -= end - self.charged
        record.flops_saved -= world.cache.model.prefill_flops(self.charged, end - self.charged)
        self.charged = end

    def member_done(self, world: TimedWorld) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            if self.node is not None:
                world.cache.unpin(self.node)
            self.finished.succeed()


@dataclass
class _Hold:
    """What the feeder knows of one of its jobs."""

    after: Any = None  # simpy event the job waits for (its group's prefix job)
    pin: _GroupPin | None = None  # its group's prefix pin
    prefix: bool = False  # an engine-made prefix job (no record)


@dataclass
class BatchFeeder:
    """The :class:`simlab.engines.timed.feeders.Feeder` of a planned batch: queued at t = 0, group by group."""

    requests: Sequence[Request]
    groups: Sequence[Group]
    prefix_share: float = 0.5
    prefix_jobs: int = field(default=0, init=False)
    _holds: dict[int, _Hold] = field(default_factory=dict, init=False)  # by request id
    _world: TimedWorld | None = field(default=None, init=False)

    def processes(self, world: TimedWorld) -> list[Generator[Any, Any, None]]:
        self._world = world
        return [self._queue_batch(world)]

    def ready(self, job: Job) -> bool:
        hold = self._holds.get(job.req.request_id)
        return hold is None or hold.after is None or hold.after.triggered

    def finished(self, job: Job, record: RequestRecord) -> bool:
        hold = self._holds.get(job.req.request_id)
        if hold is None or hold.pin is None:
            return True
        assert self._world is not None
        if hold.prefix:
            hold.pin.prefix_done(self._world, record)
            return False
        hold.pin.charge(record, self._world)
        hold.pin.member_done(self._world)
        return True

    def _queue_batch(self, world: TimedWorld) -> Generator[Any, Any, None]:
        env = world.env
        pins: list[_GroupPin] = []
        budget = self.prefix_share * world.cache.capacity
        for group in self.groups:
            members = [self.requests[i] for i in group.members]
            hold = _Hold()
            if group.prefix_len and len(members) > 1:
                req = self._prefix_request(members, group.prefix_len, env.now)
                nbytes = world.step.admission_bytes(req)
                hold.pin = _GroupPin(req, len(members), env.event(), nbytes=nbytes)
                older = self._oldest_live(pins, hold.pin, budget)
                hold.after = self._submit_prefix(world, req, hold.pin, older).done
                pins.append(hold.pin)
            for req in members:
                self._holds[req.request_id] = hold
                world.submit(Job(req=req, arrival=env.now, done=env.event()))
        yield env.timeout(0)

    @staticmethod
    def _oldest_live(pins: list[_GroupPin], new: _GroupPin, budget: float) -> _GroupPin | None:
        """The group that must finish before ``new``'s prefix is cached: the newest one whose
        departure brings the live prefixes' bytes (newest first, ``new`` included; KV and SSM
        states) within ``budget``."""
        held = new.nbytes
        for older in reversed(pins):
            held += older.nbytes
            if held > budget:
                return older
        return None

    def _prefix_request(self, members: list[Request], prefix_len: int, now: float) -> Request:
        """The engine-made job of a group's first ``prefix_len`` ids (the members' units)."""
        self.prefix_jobs += 1
        rid = PREFIX_ID_BASE - self.prefix_jobs
        first = members[0]
        prefix, empty = first.input_ids[:prefix_len], np.zeros(0, dtype=np.int32)
        tokens = prefix_tokens(members, prefix_len) if first.block_size > 1 else None
        return Request(rid, rid, 0, now, prefix, empty, 0, first.block_size, tokens)

    def _submit_prefix(
        self, world: TimedWorld, req: Request, pin: _GroupPin, older: _GroupPin | None
    ) -> Job:
        after = older.finished if older is not None else None
        self._holds[req.request_id] = _Hold(after=after, pin=pin, prefix=True)
        return world.submit(Job(req=req, arrival=world.env.now, done=world.env.event()))


def prefix_tokens(members: Sequence[Request], prefix_len: int) -> int:
    """Tokens of a group's first ``prefix_len`` ids: on a hash-id trace the last of them may be
    a member's partial last block (its ``input_tokens`` end there)."""
    return min(min(prefix_len * m.block_size, m.input_tokens) for m in members)


def plan_saving_ratio(groups: Sequence[Group], requests: Sequence[Request]) -> float:
    """BatchLLM Eq. 1 of the plan, in tokens: each group's shared prefix prefilled once (on a
    token trace, :func:`simlab.engines.batchllm.saving_ratio`; a hash-id trace's ids are blocks)."""
    logical = processed = 0
    for group in groups:
        members = [requests[i] for i in group.members]
        tokens = [m.input_tokens for m in members]
        shared = prefix_tokens(members, group.prefix_len) if len(members) > 1 else 0
        logical += sum(tokens)
        processed += shared + sum(tokens) - shared * len(members)
    return 1.0 - processed / logical if logical else 0.0


def saving_ratio(world: TimedWorld, requests: Sequence[Request]) -> float:
    """BatchLLM Eq. 1 over what the engine actually prefilled."""
    logical = sum(req.input_tokens for req in requests)
    return 1.0 - world.stats.prefill_tokens / logical if logical else 0.0
