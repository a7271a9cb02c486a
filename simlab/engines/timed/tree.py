"""Requests on the prefix tree in the timed engine: a job's start (its lookup, checkpoint
plan and prefill splits, a host hit's load), its prefill chunks and its record
(:class:`TreeJobs`), shared by the separate running memory
(:class:`simlab.engines.timed.memory.SeparateMemory`) and the shared KV pool
(:class:`simlab.engines.timed.shared.SharedMemory`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from simlab.engines.records import RequestRecord, hit_columns
from simlab.engines.step import Timing
from simlab.engines.timed.jobs import Job
from traces.format import Request

if TYPE_CHECKING:
    from simlab.engines.timed.world import TimedWorld


class TreeJobs:
    """``world``'s jobs against its request step's prefix cache."""

    def __init__(self, world: TimedWorld):
        self.world = world
        self.step, self.cache, self.model = world.step, world.cache, world.model
        self.settings = world.settings
        self._link_free = 0.0  # host tier: when the host<->GPU link finishes its last load

    def start(self, job: Job, need: float) -> None:
        """``job`` starts: the request step looks its prefix up and pins it (a recomputed job's
        sampled outputs prefilled again with its prompt, ``Job.refill``), and the job holds
        ``need`` bytes of running memory less its hit's (``Job.reserved``)."""
        started = job.started = self.step.start(job.req, refill=job.refill)
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
            self.world.resume_hits.setdefault(job.req.request_id, []).append(job.hit)
        else:
            job.first_lookup = (started.matched, started.hit)
        job.reserved = need - job.hit * self.model.kv_bytes_per_token
        job.scheduled = self.world.env.now
        if started.host_loaded:
            self._load_host_hit(job, started.host_loaded)
        self.world.running.append(job)

    def _ckpt_tokens(self, req: Request, ckpts: Sequence[int]) -> list[int]:
        """The plan's checkpoint positions (ids) in tokens, sorted: one within the input ends
        at most where the input does (a hash-id trace's last block may be partial; at ids x
        512 the prompt-end state fell past the prefill and was never charged)."""
        unit, n_in, tokens = self.cache.unit, req.input_len, req.input_tokens
        if unit == 1 and tokens >= n_in:  # ids are tokens: every position stays as it is
            return list(ckpts)
        return [min(c * unit, tokens) if c <= n_in else c * unit for c in ckpts]

    def _load_host_hit(self, job: Job, nbytes: int) -> None:
        """Host tier: the request's host hit (``nbytes``) comes back over the host link before
        its prefill may start (its first chunk is scheduled at ``job.ready``). Loads queue on
        the one link (FIFO at its bandwidth); the GPU runs other requests meanwhile. HiCache
        overlaps a load with the forward layer by layer, so this is the conservative bound:
        the whole load on the request's critical path, none of it hidden behind its prefill."""
        host = self.cache.host
        assert host is not None
        now = self.world.env.now
        begin = max(now, self._link_free)
        job.ready = self._link_free = begin + host.load_seconds(nbytes)
        job.load_s = job.ready - now

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

    def prefill_chunks(self, budget: float) -> list[tuple[Job, int]]:
        """Prefill chunks (job, tokens) of the running requests in order, within ``budget``
        (a request waiting for its host hit's load gets none yet)."""
        chunks: list[tuple[Job, int]] = []
        now = self.world.env.now
        for job in self.world.running:
            if budget <= 0:
                break
            if job.prefilled < job.input_tokens and job.ready <= now:
                take = min(self._chunk_size(job, budget), job.held_to - job.prefilled)
                if take > 0:
                    chunks.append((job, take))
                    budget -= take
        return chunks

    def _chunk_size(self, job: Job, budget: float) -> int:
        i = bisect.bisect_right(job.splits, job.prefilled)
        stop = job.splits[i] if i < len(job.splits) else job.input_tokens
        return int(min(budget, stop - job.prefilled))

    def record(self, job: Job) -> RequestRecord:
        """Finished ``job``'s record: the request step admits what it computed and releases its
        pin; a recomputed request's record keeps its first scheduling's hit."""
        assert job.started is not None
        timing = Timing(
            arrival=job.arrival,
            scheduled=job.scheduled,
            first_token=job.first_token,
            finished=job.finished,
            prefill_time=self.world.cost.prefill_time(job.hit, job.req.input_tokens - job.hit),
        )
        record = self.step.finish(job.started, timing)
        if job.preemptions:  # recomputed: its record keeps its first scheduling's hit
            assert job.first_lookup is not None
            for column, value in hit_columns(self.model, *job.first_lookup).items():
                setattr(record, column, value)
        if self.cache.host is not None:
            record.host_load_s = job.load_s
        return record
