"""One run of a cluster: the replicas' worlds in one SimPy environment, the router in front."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import simpy

from simlab.config import ConfigError
from simlab.engines.base import EngineRun
from simlab.engines.cluster.mirror import MirroredStep
from simlab.engines.cluster.router import Router
from simlab.engines.cluster.summary import cluster_extras, merged_occupancy, pool_extras
from simlab.engines.records import RequestRecord
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import over_budget, steady
from simlab.engines.timed.feeders import session_feeder
from simlab.engines.timed.jobs import Job
from simlab.engines.timed.vllm import VllmMemory
from simlab.engines.timed.world import TimedWorld
from traces.format import Request
from traces.progress import Progress

if TYPE_CHECKING:
    from simlab.engines.cluster.engine import ClusterEngine


@dataclass
class Route:
    """Where a request went and what the replicas offered it at routing time (tokens)."""

    replica: int
    best_overlap: int
    routed_overlap: int


@dataclass
class Cluster:
    """One run of a cluster for one policy: the replicas' worlds in one environment."""

    engine: ClusterEngine
    requests: Sequence[Request]
    steps: list[RequestStep]
    twins: list[RequestStep] | None = None
    env: simpy.Environment = field(default_factory=simpy.Environment)
    routes: dict[int, Route] = field(default_factory=dict)

    def __post_init__(self) -> None:
        lag = self.engine.settings.router_lag_s
        if self.twins is not None:
            self.steps = [
                MirroredStep.around(s, t, self.env, lag)
                for s, t in zip(self.steps, self.twins, strict=True)
            ]
            order = sorted(self.requests, key=lambda r: (r.arrival, r.session_id, r.turn))
            for twin in self.twins:
                twin.prepare(order)
        self.worlds = [self._replica(s) for s in self.steps]
        if self.twins is not None and any(isinstance(w.memory, VllmMemory) for w in self.worlds):
            raise ConfigError(
                "cluster.router_lag_s: the lagged router view mirrors the prefix tree, not "
                "vLLM's block pool (policy=vllm on a hybrid, or on a Transformer with "
                "engine.kv_pool=shared); set cluster.router_lag_s=0 or "
                "policy.admission.block_pool=false"
            )
        self.views = self.twins
        model = self.steps[0].cache.model
        n = len(self.steps)
        self.router = Router(self.engine.settings, model.is_hybrid, self.engine.seed, n)

    def _replica(self, step: RequestStep) -> TimedWorld:
        """A routed replica's world: on vLLM's hybrid pool where the single timed engine runs
        it there (:meth:`TimedEngine.world`), else on the prefix tree."""
        return self.engine.engine.world(self.requests, step, self.env)

    def gpus(self) -> list[TimedWorld]:
        """Every replica's world (the routed ones, and a disaggregated cluster's decoders)."""
        return self.worlds

    def run(self) -> EngineRun:
        """Simulate until every session ended and every request completed."""
        feeder = session_feeder(self.requests, self.engine.engine.typing_wpm)
        sessions = feeder.processes(cast(TimedWorld, self))  # they use only env and submit
        for process in sessions:
            self.env.process(self._source(process))
        what = f"{self.steps[0].policy} (timed x{len(self.worlds)})"
        with Progress(len(self.requests), what) as progress:
            for world in self.gpus():
                world.attach(feeder, len(sessions), progress)
            self.env.run()
        return self._result([world.collect() for world in self.worlds])

    def _source(self, process: Generator[Any, Any, None]) -> Generator[Any, Any, None]:
        yield from process
        for world in self.gpus():
            world.close_source()

    def submit(self, job: Job) -> Job:
        """Route a job to a replica and queue it there. The router reads the replicas' caches
        through read-only peeks (its lagged twins' with a router lag); the records' overlaps
        come from the true caches, at this moment."""
        req = job.req
        true = [world.peek(req) for world in self.worlds]

        def seen() -> list[tuple[int, int]]:
            return true if self.views is None else [view.peek(req) for view in self.views]

        k = self.router.choose(req, seen, self.loads)
        hits = [hit for _matched, hit in true]
        self.routes[req.request_id] = Route(k, max(hits), hits[k])
        return self.worlds[k].submit(job)

    def loads(self) -> list[int]:
        """Per replica: queued input tokens + running requests' tokens (input + decoded)."""
        return [world_load(w) for w in self.worlds]

    def _result(self, per_replica: list[list[RequestRecord]]) -> EngineRun:
        tagged = [(r, k) for k, records in enumerate(per_replica) for r in records]
        tagged.sort(key=lambda rk: (rk[0].arrival, rk[0].session_id, rk[0].turn))
        records = [r for r, _k in tagged]
        routes = [self.routes[r.request_id] for r in records]
        columns: dict[str, list[Any]] = {
            "replica": [k for _r, k in tagged],
            "best_overlap": [rt.best_overlap for rt in routes],
            "routed_overlap": [rt.routed_overlap for rt in routes],
            "routing_regret": [rt.best_overlap - rt.routed_overlap for rt in routes],
        }
        extras = cluster_extras(self, per_replica, routes)
        policy = self.worlds[0].step.policy
        state = steady(policy, records)
        caveats = over_budget(policy, self.worlds) + state.pop("caveats", [])
        extras |= state | ({"caveats": caveats} if caveats else {})
        extras["latency_error"] = self.engine.engine.latency_error(self.worlds[0].cost)
        if self.worlds[0].preempts:  # a shared or vLLM's pool: preemptions, summed
            counts = [
                w.preemption_column(rs) for w, rs in zip(self.worlds, per_replica, strict=True)
            ]
            by_id = {
                r.request_id: c
                for rs, cs in zip(per_replica, counts, strict=True)
                for r, c in zip(rs, cs, strict=True)
            }
            columns["preemptions"] = [by_id[r.request_id] for r in records]
            extras |= pool_extras(self.worlds, self.engine.engine)
        return EngineRun(records, extras, merged_occupancy(self.worlds), columns)


def world_load(world: TimedWorld) -> int:
    """Queued input tokens + running requests' tokens (input + decoded) of one replica."""
    return sum(j.input_tokens for j in world.waiting) + sum(
        j.input_tokens + j.decoded for j in world.running
    )
