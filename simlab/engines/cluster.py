"""Replicas behind a router, in the timed engine (``cluster.*``).

``cluster.replicas=N`` runs N timed engines (:class:`simlab.engines.timed.world.TimedWorld`) in **one** SimPy
environment: each replica has its own GPU process, FCFS queue, running set and its own cache and
policy instance (its own :class:`~simlab.engines.step.RequestStep`, built for the same policy, with
``cache.size_gb`` per replica). The chat sessions (:class:`simlab.engines.timed.world.SessionFeeder`) submit
each request to the cluster, and the router picks a replica at arrival; a session's next
request still arrives a think time after the previous one completed, wherever it ran.

Routers (``cluster.router``):

* ``round_robin``: request ``i`` (in submission order) goes to replica ``i mod N``;
* ``least_loaded``: the smallest load, load = queued input tokens + running requests' tokens
  (input + decoded so far);
* ``random``: uniform, seeded (``cluster.seed``, else the run seed);
* ``prefix_aware``: the largest ``overlap - load_weight x load``, overlap = the longest cached
  prefix (KV match, the checkpoint rule ignored). This is Dynamo's KV-router cost in tokens:
  Dynamo picks the worker of lowest ``w x prefill_blocks + decode_blocks`` with
  ``prefill_blocks = (pending prompt tokens + input - overlap) / block`` and ``decode_blocks``
  the active KV blocks (``--kv-overlap-score-weight`` w, default 1); dividing by ``w``, it is
  our score with ``load_weight = 1 / w`` on the decode part and 1 on the pending prompts, which
  we merge into one load: at Dynamo's default ``w = 1`` and ``load_weight = 1`` the two rank
  replicas alike (up to block rounding, and counting a running request's whole input as its
  KV even while it still prefills). SGLang's cache-aware router instead switches between a shortest-queue
  rule (when loads are imbalanced) and the highest match rate; a linear cost is the simpler of
  the two to tune and sweep (``load_weight=0``: cache affinity only);
* ``hybrid_aware``: the same cost with the **usable** hit as overlap: for a hybrid model the
  deepest SSM checkpoint on the matched path (a replica holding the KV without the state gives
  no hit); for a pure Transformer the KV match, so it routes exactly as ``prefix_aware``;
* ``session_affinity``: a session's requests go where its first went; new sessions round robin.

Ties go to the smaller load, then to the replica that got fewer requests so far, then to the
lower index (so at low load new prefixes still spread); every router is deterministic given the
config and seed.

What the router reads. The router matches with :meth:`RequestStep.peek`, a read-only lookup (no
clock tick, no recency refresh, no pin, no key assigned), so routing never changes a replica's
cache. The load is the router's own bookkeeping and is always current (real routers count their
in-flight requests). With ``cluster.router_lag_s = L > 0`` the router sees each replica's cache
as of ``L`` seconds ago: each replica has a *twin* step (same policy, fresh cache) that replays
the replica's cache operations (start, prefill published, finish) ``L`` simulated seconds after
they happened. A cache's state is a function of its operation sequence alone (its clock is
logical), so at time ``t`` the twin holds exactly the replica's cache of time ``t - L``
(operations at exactly ``t - L`` may or may not be visible yet: same-time events run in the order
they were scheduled). It is the KV-event stream of Dynamo's indexer delivered late, evictions
included, at the price of a second cache per replica.

Records and summaries. With N > 1 each record gains ``replica`` (chosen), ``best_overlap``
(the largest usable hit any replica offered at routing time, on their true caches, in tokens),
``routed_overlap`` (the chosen replica's) and ``routing_regret`` (their difference, >= 0); the
hit actually taken (``hit_tokens``) is looked up later, when the request is scheduled. The
policy's summary gains per-replica request counts, hit rates and GPU busy fractions, the load
imbalance and the regret; peaks are summed over replicas. With N = 1 the engine is the plain
timed engine, untouched: records and summaries stay byte-identical.

Disaggregation (``cluster.disaggregated``): prefill replicas and decode replicas with the KV
moved between them; see :class:`DisaggregatedCluster`.

Not modelled: clairvoyant policies see the whole trace's future, not their replica's share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import simpy

from simlab.config import ClusterSettings, ConfigError
from simlab.engines.base import Engine, EngineRun
from simlab.engines.records import RequestRecord
from simlab.engines.step import RequestStep, Started, Timing, add_timing
from simlab.engines.timed.engine import TimedEngine, saturation
from simlab.engines.timed.vllm_world import PoolWorld
from simlab.engines.timed.world import Job, SessionFeeder, TimedWorld
from traces.format import Request
from traces.progress import Progress

#: routers whose choice reads the replicas' caches
CACHE_ROUTERS = ("prefix_aware", "hybrid_aware")
#: per-record columns a cluster adds (:attr:`simlab.engines.base.EngineRun.columns`)
ROUTE_COLUMNS = ("replica", "best_overlap", "routed_overlap", "routing_regret")


def with_cluster(engine: Engine, settings: ClusterSettings, run_seed: int) -> Engine:
    """``engine`` behind ``settings.replicas`` replicas; the engine itself with one replica.
    Raises :class:`ConfigError` naming the key."""
    if settings.replicas == 1:
        return engine
    if type(engine) is not TimedEngine:
        raise ConfigError(
            f"cluster.replicas: {settings.replicas} replicas need engine=timed "
            f"(got engine={engine.name})"
        )
    if settings.disaggregated and engine.kv_pool == "shared":
        raise ConfigError(
            "cluster.disaggregated: not supported with engine.kv_pool=shared yet; "
            "use engine.kv_pool=separate"
        )
    seed = run_seed if settings.seed is None else settings.seed
    return ClusterEngine(engine, settings, seed)


# ---------------------------------------------------------------------------------- engine
@dataclass(frozen=True)
class ClusterEngine:
    """The timed engine with ``settings.replicas`` replicas; see the module docstring."""

    engine: TimedEngine
    settings: ClusterSettings
    seed: int = 0

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def replicas(self) -> int:
        return self.settings.replicas

    def check_memory(self, model: Any, cache_gb: float) -> None:
        """Each replica is one GPU (x tp) with its own cache: the single engine's check."""
        self.engine.check_memory(model, cache_gb)

    def run(
        self,
        requests: Sequence[Request],
        step: RequestStep,
        fresh_step: Callable[[], RequestStep] | None = None,
    ) -> EngineRun:
        """Simulate the cluster; ``step`` serves replica 0 and ``fresh_step()`` builds each
        other replica's step (and each twin, with a router lag)."""
        if fresh_step is None:
            raise ValueError("a cluster needs fresh_step to build each replica's request step")
        n = self.settings.replicas
        steps = [step, *(fresh_step() for _ in range(n - 1))]
        if self.settings.disaggregated:
            n = self.settings.n_prefill  # the router sees the prefill replicas only
        twins = [fresh_step() for _ in range(n)] if self.settings.router_lag_s > 0 else None
        kind = DisaggregatedCluster if self.settings.disaggregated else Cluster
        return kind(self, requests, steps, twins).run()


class MirroredStep(RequestStep):
    """A replica's request step that replays each cache operation on ``twin`` ``lag`` seconds
    later (the router's lagged view). Invariant: at simulated time ``t`` the twin's cache is
    this cache as of ``t - lag``."""

    twin: RequestStep
    env: simpy.Environment
    lag: float
    _pending: dict[int, tuple[Started, list[Started]]]

    @classmethod
    def around(
        cls, step: RequestStep, twin: RequestStep, env: simpy.Environment, lag: float
    ) -> MirroredStep:
        """``step``'s cache and plug-ins, mirrored onto ``twin``."""
        mirrored = cls(step.cache, step.admission, step.eviction, step.policy, step.controllers)
        mirrored.twin, mirrored.env, mirrored.lag, mirrored._pending = twin, env, lag, {}
        return mirrored

    def _later(self, op: Callable[[], Any]) -> None:
        self.env.timeout(self.lag).callbacks.append(lambda _event: op())

    def start(self, req: Request, pin: bool = True, refill: int = 0) -> Started:
        started = super().start(req, pin, refill)
        twin_started: list[Started] = []  # filled when the twin starts (the started is alive)
        self._pending[id(started)] = (started, twin_started)
        self._later(lambda: twin_started.append(self.twin.start(req, pin, refill)))
        return started

    def prefilled(self, started: Started, keep_room: bool = True) -> None:
        super().prefilled(started, keep_room)
        twin_started = self._pending[id(started)][1]
        self._later(lambda: self.twin.prefilled(twin_started[0], keep_room))

    def finish(self, started: Started, timing: Timing | None = None) -> RequestRecord:
        record = super().finish(started, timing)
        key = id(started)
        twin_started = self._pending[key][1]

        def replay() -> None:
            self.twin.finish(twin_started[0])
            del self._pending[key]

        self._later(replay)
        return record

    def abort(self, started: Started) -> None:
        super().abort(started)
        key = id(started)
        twin_started = self._pending[key][1]

        def replay() -> None:
            self.twin.abort(twin_started[0])
            del self._pending[key]

        self._later(replay)


# ---------------------------------------------------------------------------------- router
class Router:
    """Picks a replica per request (``settings.router``; see the module docstring)."""

    def __init__(self, settings: ClusterSettings, hybrid: bool, seed: int, n: int) -> None:
        self.settings, self.hybrid = settings, hybrid
        self.n = n  # the replicas it routes to (a disaggregated cluster's prefill replicas)
        self._count = 0
        self.routed = [0] * self.n  # requests sent to each replica so far
        self._sessions: dict[int, int] = {}
        self._rng = np.random.default_rng(seed)
        self._pick: Callable[..., int] = getattr(self, f"_{settings.router}")

    def choose(
        self,
        req: Request,
        seen: Callable[[], list[tuple[int, int]]],
        loads: Callable[[], list[int]],
    ) -> int:
        """The replica for ``req``; ``seen()``: (matched, hit) tokens per replica in the
        router's view; ``loads()``: load tokens per replica. Each is called only if needed."""
        k = self._pick(req, seen, loads)
        self.routed[k] += 1
        return k

    def _round_robin(self, req: Request, seen: Any, loads: Any) -> int:
        self._count += 1
        return (self._count - 1) % self.n

    def _session_affinity(self, req: Request, seen: Any, loads: Any) -> int:
        if req.session_id not in self._sessions:
            self._sessions[req.session_id] = len(self._sessions) % self.n
        return self._sessions[req.session_id]

    def _random(self, req: Request, seen: Any, loads: Any) -> int:
        return int(self._rng.integers(self.n))

    def _least_loaded(self, req: Request, seen: Any, loads: Callable[[], list[int]]) -> int:
        load = loads()
        return min(range(self.n), key=lambda k: (load[k], self.routed[k], k))

    def _prefix_aware(
        self, req: Request, seen: Callable[[], list[tuple[int, int]]], loads: Any
    ) -> int:
        return self._best([matched for matched, _hit in seen()], loads())

    def _hybrid_aware(
        self, req: Request, seen: Callable[[], list[tuple[int, int]]], loads: Any
    ) -> int:
        overlap = [hit if self.hybrid else matched for matched, hit in seen()]
        return self._best(overlap, loads())

    def _best(self, overlap: list[int], load: list[int]) -> int:
        """Largest ``overlap - load_weight x load``; ties: smaller load, fewer requests routed
        so far, lower index."""
        weight, routed = self.settings.load_weight, self.routed
        return min(
            range(self.n), key=lambda k: (weight * load[k] - overlap[k], load[k], routed[k], k)
        )


# ---------------------------------------------------------------------------------- world
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
        if self.twins is not None and any(isinstance(w, PoolWorld) for w in self.worlds):
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
        feeder = SessionFeeder(self.requests, self.engine.engine.typing_wpm)
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


# ---------------------------------------------------------------------------------- summary
def cluster_extras(
    cluster: Cluster, per_replica: list[list[RequestRecord]], routes: list[Route]
) -> dict[str, Any]:
    """The policy's summary items of a cluster run (see the module docstring)."""
    settings, worlds = cluster.engine.settings, cluster.worlds
    counts = [len(records) for records in per_replica]
    input_tokens = sum(r.input_tokens for records in per_replica for r in records)
    regret = sum(rt.best_overlap - rt.routed_overlap for rt in routes)
    return (
        cluster_stats(worlds, sum(counts))
        | cluster_saturation(worlds, per_replica)
        | {
            "replicas": settings.replicas,
            "router": settings.router,
            "load_weight": settings.load_weight,
            "router_lag_s": settings.router_lag_s,
            "replica_requests": counts,
            "replica_token_hit_rate": [_hit_rate(records) for records in per_replica],
            "load_imbalance": max(counts) / (sum(counts) / len(counts)) if sum(counts) else 1.0,
            "routing_regret_tokens": regret,
            "routing_regret_rate": regret / input_tokens if input_tokens else 0.0,
            "best_overlap_rate": sum(rt.best_overlap for rt in routes) / input_tokens
            if input_tokens
            else 0.0,
        }
        | {key: sum(peaks[key] for peaks in map(replica_peaks, worlds)) for key in PEAKS}
    )


PEAKS = ("peak_kv_gb", "peak_ssm_gb", "peak_gb")


def replica_peaks(world: TimedWorld) -> dict[str, float]:
    """One replica's peak cached GB: its engine's (vLLM's hybrid pool) or its cache's."""
    cache = world.cache
    return world.cache_peaks() or {
        "peak_kv_gb": cache.peak_kv_bytes / 1e9,
        "peak_ssm_gb": cache.peak_ssm_bytes / 1e9,
        "peak_gb": cache.peak_bytes / 1e9,
    }


def pool_extras(worlds: list[TimedWorld], settings: TimedEngine) -> dict[str, Any]:
    """The shared KV pool's summary items over the replicas: counts and bytes summed, the
    pool (and SSM pool, with its cap) per replica, and per-replica preemptions."""
    pools = [w.pool.summary(settings) for w in worlds]
    out = dict(pools[0])
    for key in ("preemptions", "preempted_requests", "recomputed_tokens", "pool_evicted_gb"):
        out[key] = sum(p[key] for p in pools)
    out["peak_running_gb"] = sum(p["peak_running_gb"] for p in pools)
    if "peak_running_states" in out:  # a separate SSM pool per replica
        out["peak_running_states"] = sum(p["peak_running_states"] for p in pools)
    out["replica_preemptions"] = [p["preemptions"] for p in pools]
    return out


def _hit_rate(records: list[RequestRecord]) -> float:
    total = sum(r.input_tokens for r in records)
    return sum(r.hit_tokens for r in records) / total if total else 0.0


def cluster_stats(worlds: list[TimedWorld], n_requests: int) -> dict[str, Any]:
    """The timed engine's stats over the cluster: busy = mean GPU busy fraction over the
    cluster's span, the queue = all replicas' queues (Little's law holds for their sum)."""
    first = min(w.stats.first_arrival for w in worlds)
    last = max(w.stats.last_departure for w in worlds)
    span = last - first if last > first else 0.0
    busy = [w.stats.busy / span if span > 0 else 0.0 for w in worlds]
    return {
        "gpu_busy_frac": sum(busy) / len(busy),
        "replica_gpu_busy_frac": busy,
        "mean_queue_len": sum(w.stats.queue_area for w in worlds) / span if span > 0 else 0.0,
        "arrival_rate": n_requests / span if span > 0 else 0.0,
        "iterations": sum(w.stats.iterations for w in worlds),
    }


def cluster_saturation(
    worlds: list[TimedWorld], per_replica: list[list[RequestRecord]]
) -> dict[str, Any]:
    """Saturated when any replica is (:func:`simlab.engines.timed.engine.saturation`), saying which."""
    reasons = []
    for k, (world, records) in enumerate(zip(worlds, per_replica, strict=True)):
        if records:
            flagged = saturation(world.stats, records)
            if flagged["saturated"]:
                reasons.append(f"replica {k}: {flagged['saturation']}")
    return {"saturated": bool(reasons), "saturation": "; ".join(reasons)}


def merged_occupancy(worlds: list[TimedWorld]) -> list[tuple[float, int, int]]:
    """Cluster cache bytes over time: at each replica's sample, the sum over replicas of
    their latest KV and SSM bytes."""
    samples = sorted(
        (t, k, kv, ssm) for k, w in enumerate(worlds) for t, kv, ssm in w.stats.occupancy
    )
    kv_now, ssm_now = [0] * len(worlds), [0] * len(worlds)
    out = []
    for t, k, kv, ssm in samples:
        kv_now[k], ssm_now[k] = kv, ssm
        out.append((t, sum(kv_now), sum(ssm_now)))
    return out
