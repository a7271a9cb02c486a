"""Preemption in the timed engine's shared KV pool (``engine.kv_pool=shared``): each decode
step's memory reserved token by token (:meth:`Preemption.reserve_decode`), and when it does
not fit, running requests preempted (``engine.preemption``: LIFO, FIFO) or retracted as
SGLang's ``retract_decode`` does. A preempted request is recomputed: :func:`drop_progress`
and :func:`requeue`, which vLLM's block pool (:mod:`simlab.engines.timed.vllm`) shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from simlab.engines.timed.jobs import Job
from simlab.engines.timed.new_token_ratio import RETRACT_DECODE_STEPS

if TYPE_CHECKING:
    from collections import deque

    from simlab.engines.timed.kv_pool import KVPool
    from simlab.engines.timed.world import TimedWorld


def drop_progress(world: TimedWorld, victim: Job, release: Callable[[Job], None]) -> None:
    """``victim``, out of ``world``'s running set, is preempted: its progress is counted as
    recomputed and dropped, and ``release`` gives back its memory."""
    pool = world.pool
    pool.preemptions += 1
    pool.preempted.add(victim.req.request_id)
    pool.recomputed_tokens += victim.prefilled - victim.hit + victim.decoded
    victim.preemptions += 1
    release(victim)
    victim.resume()
    world.note_queue()


def requeue(waiting: deque[Job], victim: Job) -> None:
    """A preempted ``victim`` goes back to the front of the queue, the preempted requests
    there in their first scheduling order."""
    i = 0
    while i < len(waiting) and waiting[i].preemptions and waiting[i].order < victim.order:
        i += 1
    waiting.insert(i, victim)


class Preemption:
    """The decode steps' memory of ``world``'s running requests in ``kv``, and who is
    preempted for it."""

    def __init__(self, world: TimedWorld, kv: KVPool):
        self.world, self.kv = world, kv
        self.step, self.cache, self.model = world.step, world.cache, world.model
        self.settings, self.pool = world.settings, world.pool

    def reserve_decode(self, limit: int | None) -> int:
        """Hold the KV of the next decode steps of every decoding request: evict cached
        entries, and when they cannot make room for one step, preempt running requests
        (``engine.preemption``) until it fits; SGLang's ``check_decode_mem`` first evicts what
        it can, in vain or not (:meth:`KVPool.evict_for`). Returns the steps held (>= 1; at
        most ``limit``, None: up to the first request's end): those the free bytes hold once
        the first step evicted what it lacked (an engine allocates step by step and evicts
        only then)."""
        kv = self.model.kv_bytes_per_token
        sglang = self.settings.preemption == "sglang"
        batch = self.world.batch
        batch.retracted = batch.decode_skipped = False
        while True:
            decoders = self.world.decoders()
            if not decoders:
                return limit or 0
            per_step = self.kv.step_need(decoders)
            if self.kv.evict_for(per_step) if sglang else self.kv.make_room(per_step):
                break
            if self.settings.overlap and len(decoders) < len(self.world.batch_members()):
                # a finishing request's queued result frees its KV at this step's end: the
                # decode sits the step out rather than retract (``update_running_batch``)
                batch.decode_skipped, batch.full = True, False
                return 0
            batch.retracted = True
            if sglang and len(decoders) > 1:
                self.retract(decoders)
            else:
                self._preempt()
        if batch.retracted:  # what the kept requests show becomes the ratio
            batch.ratio.retracted(
                [j.req.output_len - j.outputs_left for j in decoders],
                [j.req.output_len for j in decoders],
            )
        steps = min(j.decode_left for j in decoders) if limit is None else limit
        if self.kv.page > 1:
            return self._hold_paged_steps(decoders, steps)
        if steps > 1:  # the steps the free bytes hold; the next evicts when it must
            steps = max(1, min(steps, int(self.cache.free_bytes // per_step)))
        for job in decoders:
            job.reserved += steps * kv
        self.kv.hold(per_step * steps)
        return steps

    def _hold_paged_steps(self, decoders: list[Job], steps: int) -> int:
        """SGLang's paged pool: after its decode memory check, each step's allocation asks a
        page free per decoding request (``alloc_paged_token_slots_decode``), evicting when the
        free pages are fewer. Holds the first step and those after it that find that many
        free (the next evicts when it must), at most ``steps``; returns how many."""
        kv, page = self.model.kv_bytes_per_token, self.kv.page
        spare = len(decoders) * page
        self.kv.evict_for(spare * kv)
        ends = np.array([j.input_tokens + j.decoded for j in decoders])
        free = int(self.cache.free_bytes // kv)
        held = 0
        for step in range(steps):
            if step and free - held < spare:
                break
            held += page * int(np.count_nonzero((ends + step) % page == 0))
        else:
            step = steps
        grown = 0.0
        for job, end in zip(decoders, ends, strict=True):
            job.reserved += step * kv
            grown += step * kv + self.kv.repad(job, int(end) + step)
        self.kv.hold(grown)
        return step

    def _preempt(self) -> None:
        """Preempt one running request (recompute): its progress is dropped, its memory freed
        and it goes back to the front of the queue (:func:`requeue`). LIFO: the most recently
        scheduled; FIFO: the earliest; ``sglang`` (:meth:`retract`) with at most one request
        decoding: LIFO."""
        running = self.world.running
        if len(running) <= 1:
            raise RuntimeError(
                "engine.kv_pool=shared: one running request does not fit the pool "
                "(cache.size_gb + engine.running_memory_gb too small)"
            )
        victim = running.pop(0 if self.settings.preemption == "fifo" else -1)
        self.drop_progress(victim)
        requeue(self.world.waiting, victim)

    def retract(self, decoders: list[Job]) -> None:
        """SGLang's ``retract_decode`` (``engine.preemption=sglang``): decoding requests are
        retracted, the fewest outputs first (ties: the longest prompt, then the latest in the
        batch), at least one and then until the rest fit their next step (``check_decode_mem``),
        one always kept; after each, cached entries are evicted toward
        ``RETRACT_DECODE_STEPS`` steps of the rest (``release_req``). Retracted requests free
        their KV uncached (``release_kv_cache(is_insert=False)``) and join the back of the
        queue (``_add_request_to_queue`` under FCFS). The batch keeps the rest in the order
        they were sorted in (``filter_batch(keep_indices=...)``): the most outputs first."""
        kv = self.model.kv_bytes_per_token
        order = sorted(
            sorted(decoders, key=lambda j: j.batch_rank),  # ties: the batch's order
            key=lambda j: (  # its outputs (``len(output_ids)``: the queued token not yet)
                j.input_tokens - j.req.input_tokens + j.decoded + 1 - j.in_flight,
                -j.req.input_tokens,
            ),
            reverse=True,
        )
        first = True
        while len(order) > 1 and (first or not self.kv.evict_for(self.kv.step_need(order))):
            first = False
            victim = order.pop()
            self.world.batch.full = False  # the batch shrank
            self.world.running.remove(victim)
            self.drop_progress(victim)
            self.world.waiting.append(victim)
            self.kv.evict_for(len(order) * RETRACT_DECODE_STEPS * kv)  # ``release_req``
        for index, job in enumerate(order):  # the batch keeps them in this order
            job.batch_rank = self.world.batch.rank(index)

    def drop_progress(self, victim: Job) -> None:
        """A preempted (retracted) request, out of the running set: :func:`drop_progress`, its
        pin and memory given back."""
        drop_progress(self.world, victim, self._release)

    def _release(self, victim: Job) -> None:
        """A preempted request gives back its pin and its memory."""
        assert victim.started is not None
        self.step.abort(victim.started)
        self.kv.hold(-victim.reserved)
        victim.reserved, victim.pad, victim.started = 0.0, 0, None
        if victim.slots:
            self.kv.hold_slots(victim, -victim.slots)
