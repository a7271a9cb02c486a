"""Prefill/decode disaggregation (``cluster.disaggregated``)."""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from simlab.engines.base import EngineRun
from simlab.engines.cluster.summary import cluster_stats
from simlab.engines.cluster.world import Cluster, world_load
from simlab.engines.records import RequestRecord
from simlab.engines.step import RequestStep, Timing, add_timing
from simlab.engines.timed.jobs import Job
from simlab.engines.timed.world import TimedWorld
from traces.format import Request


def prompt_only(req: Request) -> Request:
    """What a prefill replica serves: the prompt, and no output (the first token comes with
    the prefill; the rest, and their KV, are the decode replica's), so it caches the prompt."""
    return replace(req, output_ids=req.output_ids[:0], output_len=0)


@dataclass
class Transfer:
    """A disaggregated request's hand-off: decode replica, KV transfer seconds, completion."""

    decode_replica: int
    transfer_s: float
    finished: float


@dataclass
class DisaggregatedCluster(Cluster):
    """Prefill/decode disaggregation (``cluster.disaggregated``): the router sends each request
    to one of the first ``cluster.prefill_replicas`` replicas, which prefill it with their
    prefix caches (prompt only: :func:`prompt_only`) and produce its first token (TTFT); its KV
    (input tokens x KV bytes per token, plus the SSM state of a hybrid) then crosses the link at
    ``cluster.link_bw_gbps`` once the prefill ended (no layer-wise overlap), and the least
    loaded decode replica (:func:`world_load`; ties: lower index) generates the other tokens
    with that memory held, computing no prefill and caching nothing (SGLang's and Dynamo's
    decode workers without a decode-side prefix cache). A request of one output token ends at
    its prefill. Records: ``replica`` is the prefill replica; ``decode_replica`` (-1: none)
    and ``kv_transfer_s`` are added; ``finished``, ``tpot`` and ``e2e`` include the transfer and
    the decode queue."""

    decoders: list[TimedWorld] = field(default_factory=list)
    transfers: dict[int, Transfer] = field(default_factory=dict)
    originals: dict[int, Request] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n_prefill = self.engine.settings.n_prefill
        decode_steps, self.steps = self.steps[n_prefill:], self.steps[:n_prefill]
        super().__post_init__()
        timed = self.engine.engine
        self.decoders = [
            TimedWorld(self.requests, s, timed.cost_model(s.cache.model), timed, self.env)
            for s in decode_steps
        ]
        model = self.steps[0].cache.model
        self._state_bytes = model.ssm_state_bytes if model.is_hybrid else 0
        self._kv_per_token = model.kv_bytes_per_token

    def _replica(self, step: RequestStep) -> TimedWorld:
        """A prefill replica's world: on the prefix tree (its prompt-only requests and the
        hand-off are not modelled on vLLM's hybrid pool)."""
        timed = self.engine.engine
        return TimedWorld(self.requests, step, timed.cost_model(step.cache.model), timed, self.env)

    def gpus(self) -> list[TimedWorld]:
        return [*self.worlds, *self.decoders]

    def submit(self, job: Job) -> Job:
        """Route the prompt to a prefill replica; the hand-off follows its prefill."""
        self.originals[job.req.request_id] = job.req
        prefill = super().submit(
            Job(req=prompt_only(job.req), arrival=job.arrival, done=self.env.event())
        )
        self.env.process(self._hand_off(job, prefill))
        return job

    def transfer_seconds(self, req: Request) -> float:
        """The request's KV (and state) over the prefill -> decode link."""
        nbytes = req.input_tokens * self._kv_per_token + self._state_bytes
        return nbytes / (float(self.engine.settings.link_bw_gbps or math.inf) * 1e9)

    def _hand_off(self, job: Job, prefill: Job) -> Generator[Any, Any, None]:
        yield prefill.done
        rid = job.req.request_id
        if job.output_len <= 1:
            self.transfers[rid] = Transfer(-1, 0.0, prefill.finished)
            job.done.succeed()
            return
        seconds = self.transfer_seconds(job.req)
        if seconds > 0:
            yield self.env.timeout(seconds)
        load = [world_load(w) for w in self.decoders]
        k = min(range(len(load)), key=lambda i: (load[i], i))
        decode = Job(req=job.req, arrival=job.arrival, done=self.env.event(), decode_only=True)
        yield self.decoders[k].submit(decode).done
        self.transfers[rid] = Transfer(len(self.worlds) + k, seconds, decode.finished)
        job.done.succeed()

    def _result(self, per_replica: list[list[RequestRecord]]) -> EngineRun:
        for records in per_replica:
            for record in records:
                self._complete(record)
        run = super()._result(per_replica)
        moves = [self.transfers[r.request_id] for r in run.records]
        run.columns["decode_replica"] = [m.decode_replica for m in moves]
        run.columns["kv_transfer_s"] = [m.transfer_s for m in moves]
        settings = self.engine.settings
        decode_busy = cluster_stats(self.decoders, len(run.records))["replica_gpu_busy_frac"]
        run.extras |= {
            "disaggregated": True,
            "prefill_replicas": len(self.worlds),
            "decode_replicas": len(self.decoders),
            "link_bw_gbps": settings.link_bw_gbps,
            "kv_transfer_s_mean": float(np.mean([m.transfer_s for m in moves])) if moves else 0.0,
            "decode_gpu_busy_frac": decode_busy,
        }
        return run

    def _complete(self, record: RequestRecord) -> None:
        """The prefill replica's record, completed: the whole output, and the time the
        decode replica finished."""
        req, move = self.originals[record.request_id], self.transfers[record.request_id]
        record.output_tokens = req.output_len
        timing = Timing(
            record.arrival, record.scheduled, record.first_token, move.finished, record.prefill_time
        )
        add_timing(record, timing)
