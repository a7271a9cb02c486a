"""Replicas and routing (``simlab.engines.cluster``): identity at one replica, two oracles, the
router's read-only view, its lag, bad input."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from simlab.config import ROUTERS, ClusterSettings, ConfigError
from simlab.cost.hardware import Hardware
from simlab.engines.cluster.engine import ROUTE_COLUMNS, ClusterEngine
from simlab.engines.records import RECORD_COLUMNS, records_frame
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.feeders import SessionFeeder, sessions
from simlab.engines.timed.vllm import VllmMemory
from simlab.run.bounds import infinite_cache_hits
from simlab.run.breakdown import COLUMNS as PART_COLUMNS
from simlab.run.cli import USER_ERRORS
from simlab.run.simulate import build_engine, simulate
from tests.fixtures import (
    CONFIGS,
    chat_trace,
    compose,
    hot_prefix_trace,
    model,
    policy_plugins,
    routed,
)
from traces.arrivals import assign_arrivals
from traces.format import Request

HYBRID = model("marconi_7b")
LLAMA = model("llama3_8b")
A100 = Hardware.from_config(OmegaConf.load(CONFIGS / "hardware" / "a100_40gb.yaml"))
CKPT = HYBRID.ssm_state_bytes


def fresh_step(policy, spec=HYBRID, capacity=30 * CKPT):
    def build() -> RequestStep:  # on its timed route (vLLM's pool for a hybrid under vllm)
        admission, eviction = policy_plugins(policy)
        step = RequestStep.build(spec, capacity, admission, eviction, policy)
        return routed(step, TimedEngine(hardware=A100))

    return build


def single_run(requests, build):
    """The plain timed engine (one GPU), records as a frame."""
    world = TimedEngine(hardware=A100).world(requests, build())
    return records_frame(world.run(SessionFeeder(requests)))


def cluster_run(requests, build, replicas, router, overlap=False, **settings):
    engine = ClusterEngine(
        TimedEngine(hardware=A100, overlap=overlap), ClusterSettings(replicas, router, **settings)
    )
    run = engine.run(requests, build(), build)
    return records_frame(run.records).assign(**run.columns), run


def chat_requests(seed=0, sessions=12, rate=1.0, **trace):
    arrived = assign_arrivals(
        chat_trace(seed=seed, sessions=sessions, **trace),
        session_rate=rate,
        think_time_mean=2.0,
        seed=seed,
    )
    return list(arrived.requests())


def spaced(requests: list[Request], gap: float) -> list[Request]:
    """The requests with arrival ``i * gap`` (one request per session in the fixture)."""
    return [dataclasses.replace(r, arrival=i * gap) for i, r in enumerate(requests)]


# ------------------------------------------------------------------------------ one replica
@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("lag", [0.0, 0.5])
def test_a_one_replica_cluster_is_the_timed_engine_byte_for_byte(router, lag):
    """Through the cluster's machinery (shared environment, router, session sources, lagged
    twin), one replica gives exactly the plain timed engine's records."""
    requests = chat_requests(seed=3, sessions=15, rate=2.0)
    build = fresh_step("marconi")
    alone = single_run(requests, build)
    together, _ = cluster_run(requests, build, 1, router, router_lag_s=lag)
    pd.testing.assert_frame_equal(together[RECORD_COLUMNS], alone, check_exact=True)


def test_one_replica_by_default_is_the_plain_timed_engine():
    """``cluster.replicas=1`` (the default) builds the timed engine itself, so records and
    summaries are today's; the goldens of tests/test_timed.py and tests/test_policies.py pin
    them."""
    cfg = compose(["engine.calibration=null"])
    assert cfg.cluster.replicas == 1
    assert type(build_engine(cfg)) is TimedEngine
    two = build_engine(compose(["engine.calibration=null", "cluster.replicas=2"]))
    assert isinstance(two, ClusterEngine) and two.settings.replicas == 2


# ------------------------------------------------------------------------------ oracles
def assert_replicas_equal_their_shares(frame, shares, build):
    for k, share in enumerate(shares):
        mine = frame[frame["replica"] == k][RECORD_COLUMNS].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, single_run(share, build), check_exact=True)


@pytest.mark.parametrize("policy", ["sglang_plus", "vllm_plus", "marconi"])
def test_session_affinity_replicas_equal_single_runs_on_their_shares(policy):
    """Oracle (multi-turn sessions, 3 replicas, a load that queues): ``session_affinity`` sends
    the k-th session (by first arrival) to replica ``k mod 3`` and all its turns after it. A
    router that never reads the caches makes replicas independent, so replica k's records
    (hits, evictions, every latency) equal those of one timed engine run on its share alone:
    the sessions k, k+3, ... with the same arrival times. Sessions share system prompts across
    replicas here, so hits lost to the split would show up as a difference."""
    requests = chat_requests(seed=4, sessions=18, rate=3.0)
    build = fresh_step(policy, capacity=12 * CKPT)
    frame, _ = cluster_run(requests, build, 3, "session_affinity")
    groups = sessions(requests)
    shares = [[r for turns in groups[k::3] for r in turns] for k in range(3)]
    assert_replicas_equal_their_shares(frame, shares, build)
    assert frame.groupby("session_id")["replica"].nunique().max() == 1


def test_round_robin_on_one_request_sessions_equals_single_runs_on_the_shares():
    """Oracle (one-request sessions, arrivals one second apart, 3 replicas): ``round_robin``
    sends request i (arrival order) to replica ``i mod 3``; each replica's records, and so its
    hit rate, equal one timed engine's on requests k, k+3, .... (The sessions share hot
    prefixes, so the split costs hits that a single cache would have.)"""
    requests = list(hot_prefix_trace(seed=2, requests=120).requests())
    build = fresh_step("sglang_plus", spec=LLAMA, capacity=1e9)
    frame, _run = cluster_run(requests, build, 3, "round_robin")
    assert_replicas_equal_their_shares(frame, [requests[k::3] for k in range(3)], build)
    rates = frame.groupby("replica").apply(lambda f: f.hit_tokens.sum() / f.input_tokens.sum())
    assert (rates > 0).all()


@pytest.mark.parametrize("workload", ["chat", "hot"])
def test_prefix_aware_on_infinite_caches_equals_one_pooled_infinite_cache(workload):
    """Oracle (a Transformer, llama3_8b; requests far apart so none overlaps another): with
    ``load_weight = 0`` and an infinite cache per replica, ``prefix_aware`` sends each request
    to a replica holding its longest cached prefix, and every cached prefix lives whole on one
    replica, so each request hits exactly what one pooled infinite cache gives it: the ideal
    reuse (:func:`simlab.run.bounds.infinite_cache_hits`, on a token tree nobody routes). Ties
    spread new prefixes over the replicas, so the hits come from several of them."""
    if workload == "chat":
        requests = chat_requests(seed=5, sessions=10, rate=1e-4, system_prompts=4)
    else:
        requests = spaced(list(hot_prefix_trace(seed=3, requests=60).requests()), 1000.0)
    build = fresh_step("sglang_plus", spec=LLAMA, capacity=float("inf"))
    frame, _ = cluster_run(requests, build, 3, "prefix_aware", load_weight=0.0)
    ordered = sorted(requests, key=lambda r: (r.arrival, r.session_id, r.turn))
    assert frame["hit_tokens"].tolist() == infinite_cache_hits(ordered)
    assert (frame["routing_regret"] == 0).all()
    hitting = frame[frame["hit_tokens"] > 0]
    assert hitting["replica"].nunique() >= 2
    pooled = single_run(requests, build)
    assert frame["hit_tokens"].sum() == pooled["hit_tokens"].sum()


# ------------------------------------------------------------------------------ the router
def test_hybrid_aware_routes_like_prefix_aware_for_a_transformer():
    requests = chat_requests(seed=6, sessions=14, rate=2.0)
    build = fresh_step("sglang_plus", spec=LLAMA, capacity=4e9)
    prefix, _ = cluster_run(requests, build, 3, "prefix_aware")
    hybrid, _ = cluster_run(requests, build, 3, "hybrid_aware")
    pd.testing.assert_frame_equal(prefix, hybrid, check_exact=True)


def test_hybrid_aware_never_routes_to_a_smaller_usable_hit_than_prefix_aware_at_zero_weight():
    """With a hybrid model, the usable hit is what hybrid_aware maximises: at load_weight 0 it
    has no routing regret (regret is measured in usable hits), prefix_aware may have some."""
    requests = chat_requests(seed=7, sessions=16, rate=2.0)
    build = fresh_step("sglang_plus", spec=LLAMA, capacity=1e9)
    hybrid, _ = cluster_run(requests, build, 4, "hybrid_aware", load_weight=0.0)
    assert (hybrid["routing_regret"] == 0).all()
    assert (hybrid["routed_overlap"] == hybrid["best_overlap"]).all()


@pytest.mark.parametrize("policy", ["sglang_plus", "vllm", "marconi"])
def test_peek_is_read_only_and_equals_the_lookup_at_start(policy):
    """The router's match changes nothing (clock, recency, pins, SSM recency, key ids) and
    predicts exactly what starting the request would match and hit."""
    build = fresh_step(policy, capacity=10 * CKPT)
    step = build()
    requests = chat_requests(seed=8, sessions=8)
    for req in sorted(requests, key=lambda r: r.arrival):
        cache = step.cache
        before = (
            cache.now,
            cache.last_access.copy(),
            cache.pins.copy(),
            cache.state_access.copy(),
            cache.used_bytes,
            len(getattr(step.keys.scheme, "_ids", ())),
        )
        peeked = [step.peek(r) for r in requests]
        after = (
            cache.now,
            cache.last_access,
            cache.pins,
            cache.state_access,
            cache.used_bytes,
            len(getattr(step.keys.scheme, "_ids", ())),
        )
        for b, a in zip(before, after, strict=True):
            assert np.array_equal(b, a)
        started = step.start(req, pin=False)
        assert peeked[requests.index(req)] == (started.matched, started.hit)
        step.finish(started)


def test_a_lagged_view_is_the_replicas_cache_replayed_late():
    """With ``router_lag_s`` each replica's twin replays its cache operations late; once the
    run is over the twin has replayed them all and holds the replica's cache exactly."""
    requests = chat_requests(seed=9, sessions=14, rate=2.0)
    build = fresh_step("marconi", capacity=12 * CKPT)
    engine = ClusterEngine(
        TimedEngine(hardware=A100), ClusterSettings(3, "hybrid_aware", router_lag_s=3.0)
    )
    from simlab.engines.cluster.world import Cluster

    steps = [build() for _ in range(3)]
    twins = [build() for _ in range(3)]
    Cluster(engine, requests, steps, twins).run()

    def shape(step):
        return sorted((n.start, n.end, n.ckpt) for n in step.cache.nodes()), step.cache.used_bytes

    for step, twin in zip(steps, twins, strict=True):
        assert step.cache.now > 0 and shape(step) == shape(twin)


def test_the_lagged_view_at_t_is_the_replicas_cache_at_t_minus_lag():
    """Sampled during the run every 0.37 s (off any event time): each twin's logical clock and
    bytes at ``t`` equal its replica's at ``t - lag`` (lag = 3 samples)."""
    from simlab.engines.cluster.world import Cluster

    requests = chat_requests(seed=12, sessions=12, rate=2.0)
    build = fresh_step("marconi", capacity=12 * CKPT)
    every, lag = 0.37, 3 * 0.37
    engine = ClusterEngine(
        TimedEngine(hardware=A100), ClusterSettings(2, "hybrid_aware", router_lag_s=lag)
    )
    cluster = Cluster(engine, requests, [build(), build()], [build(), build()])
    samples: list[list[tuple[float, int, float, int]]] = []

    def sample():
        yield cluster.env.timeout(0.011)
        for _ in range(300):
            samples.append(
                [
                    (s.cache.now, s.cache.used_bytes, t.cache.now, t.cache.used_bytes)
                    for s, t in zip(cluster.steps, cluster.twins, strict=True)
                ]
            )
            yield cluster.env.timeout(every)

    cluster.env.process(sample())
    cluster.run()
    changed = 0
    for i in range(3, len(samples)):
        for k in range(2):
            real_then, twin_now = samples[i - 3][k][:2], samples[i][k][2:]
            assert twin_now == real_then
            changed += samples[i][k][:2] != real_then
    assert changed > 20


def test_a_router_that_sees_stale_caches_routes_worse():
    """A lag longer than the run: the router's view stays empty, so prefix-aware routing falls
    back to its tie rule and loses hits that the live view finds."""
    requests = chat_requests(seed=10, sessions=16, rate=1.0)
    build = fresh_step("sglang_plus", spec=LLAMA, capacity=2e9)
    live, _ = cluster_run(requests, build, 4, "prefix_aware", load_weight=0.0)
    stale, _ = cluster_run(requests, build, 4, "prefix_aware", load_weight=0.0, router_lag_s=1e6)
    assert stale["routing_regret"].sum() > live["routing_regret"].sum()
    assert stale["hit_tokens"].sum() < live["hit_tokens"].sum()


def test_random_router_is_seeded_and_same_config_same_records():
    requests = chat_requests(seed=11, sessions=10)
    build = fresh_step("sglang_plus")
    first, _ = cluster_run(requests, build, 3, "random")
    again, _ = cluster_run(requests, build, 3, "random")
    pd.testing.assert_frame_equal(first, again, check_exact=True)
    engine = ClusterEngine(TimedEngine(hardware=A100), ClusterSettings(3, "random"), seed=1)
    run = engine.run(requests, build(), build)
    other = records_frame(run.records).assign(**run.columns)
    assert other["replica"].tolist() != first["replica"].tolist()


def test_least_loaded_spreads_a_burst_evenly():
    """A burst at t = 0, before any token is computed: each request goes to the replica with
    the fewest tokens so far, so the replicas' token totals end within one request of each
    other (greedy balancing), whatever the counts."""
    requests = spaced(list(hot_prefix_trace(seed=4, requests=40).requests()), 0.0)
    frame, run = cluster_run(requests, fresh_step("sglang_plus"), 4, "least_loaded")
    tokens = frame.groupby("replica")["input_tokens"].sum()
    assert len(tokens) == 4 and tokens.max() - tokens.min() <= frame["input_tokens"].max()
    assert run.extras["load_imbalance"] < 1.2


# ------------------------------------------------------------------------------ whole runs
def test_a_cluster_run_writes_routing_columns_and_summary(tmp_path):
    overrides = [
        "engine.calibration=null",
        "report=false",
        "bounds.enabled=false",
        "+policy=sglang_plus",
        "trace=chat",
        "trace.n_sessions=20",
    ]
    simulate(compose([*overrides, f"output_dir={tmp_path / 'one'}"]))
    simulate(compose([*overrides, "cluster.replicas=3", f"output_dir={tmp_path / 'three'}"]))
    one = pd.read_parquet(tmp_path / "one" / "records.parquet")
    three = pd.read_parquet(tmp_path / "three" / "records.parquet")
    parts = list(PART_COLUMNS.values())  # the reuse breakdown's (simlab.run.breakdown)
    assert list(one.columns) == [*RECORD_COLUMNS, *parts]
    assert list(three.columns) == [*RECORD_COLUMNS, *ROUTE_COLUMNS, *parts]
    policy = json.loads((tmp_path / "three" / "summary.json").read_text())["policies"]
    summary = policy["sglang_plus"]
    assert sum(summary["replica_requests"]) == len(three) == summary["requests"]
    assert len(summary["replica_token_hit_rate"]) == 3 and summary["load_imbalance"] >= 1.0
    single = json.loads((tmp_path / "one" / "summary.json").read_text())["policies"]
    assert "replicas" not in single["sglang_plus"]


BAD_CLUSTER = [
    (["cluster.replicas=0"], "cluster.replicas: must be an integer >= 1"),
    (["cluster.replicas=two"], "cluster.replicas: must be an integer >= 1"),
    (["cluster.router=nearest"], "cluster.router: must be one of round_robin|"),
    (["cluster.router_lag_s=-1"], "cluster.router_lag_s: must be a finite number >= 0"),
    (["cluster.load_weight=-0.5"], "cluster.load_weight: must be a finite number >= 0"),
    (["cluster.seed=-3"], "cluster.seed: must be a non-negative integer"),
    (["+cluster.bogus=1"], "cluster.bogus: unknown key"),
    (["cluster.replicas=2", "engine=replay"], "cluster.replicas: 2 replicas need engine=timed"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_CLUSTER, ids=lambda v: str(v)[:50])
def test_bad_cluster_config_is_one_line_naming_the_key(tmp_path, overrides, message):
    out = tmp_path / "out"
    timed = [] if "engine=replay" in overrides else ["engine.calibration=null"]
    cfg = compose(["report=false", *timed, *overrides, f"output_dir={out}"])
    with pytest.raises(USER_ERRORS) as caught:
        simulate(cfg)
    text = str(caught.value)
    assert message in text and "\n" not in text
    assert not out.exists() or not any(out.iterdir())


def test_a_clusters_clairvoyant_bound_is_one_cache_of_all_its_replicas_capacity():
    """Four replicas' caches together hold no more than one cache of their summed capacity,
    whose Belady is the bound (at one replica's capacity the pooled hit rate read 4.0x it)."""
    common = ["+policy=sglang_plus", "model=llama3_8b", "trace=sharegpt", "trace.limit=300"]
    common += ["report=false"]
    four = simulate(compose([*common, "cluster.replicas=4", "cache.size_gb=0.05"]))
    pooled = simulate(compose([*common, "engine=replay", "cache.size_gb=0.2"]))
    assert four.bounds["clairvoyant"] == pooled.bounds["clairvoyant"] > 0
    assert four.policies["sglang_plus"]["hit_vs_clairvoyant"] <= 1


# ------------------------------------------------------------------------------ vLLM's hybrid pool
NEMOTRON = model("nemotron_h_8b")


def pool_requests() -> list[Request]:
    """Chats long enough to share 528-token blocks, fast enough to preempt on a 0.4 GB pool."""
    return chat_requests(seed=6, sessions=24, rate=6.0, system_len=1200, msg_len=(100, 500))


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("router", ["round_robin", "hybrid_aware"])
def test_a_one_replica_cluster_runs_vllms_hybrid_pool_as_the_timed_engine(router, overlap):
    """A hybrid under ``policy=vllm`` runs on vLLM's pool in a cluster too (it ran on the
    prefix tree), with vLLM's synchronous or async scheduling: one replica gives the plain
    timed engine's records, preemptions and peaks."""
    requests, build = pool_requests(), fresh_step("vllm", NEMOTRON, 0.4e9)
    world = TimedEngine(hardware=A100, overlap=overlap).world(requests, build())
    assert isinstance(world.memory, VllmMemory)
    alone = records_frame(world.run(SessionFeeder(requests)))
    together, run = cluster_run(requests, build, 1, router, overlap=overlap)
    pd.testing.assert_frame_equal(together[RECORD_COLUMNS], alone, check_exact=True)
    assert run.extras["preemptions"] == world.pool.preemptions > 0
    assert run.columns["preemptions"] == world.preemption_column(world.collect())
    assert run.extras["peak_gb"] == world.cache_peaks()["peak_gb"] > 0


def test_session_affinity_replicas_on_vllms_hybrid_pool_equal_single_runs_on_their_shares():
    requests, build = pool_requests(), fresh_step("vllm", NEMOTRON, 0.4e9)
    frame, run = cluster_run(requests, build, 3, "session_affinity")
    assert run.extras["preemptions"] == sum(run.extras["replica_preemptions"]) > 0
    groups = sessions(requests)
    shares = [[r for turns in groups[k::3] for r in turns] for k in range(3)]
    assert_replicas_equal_their_shares(frame, shares, build)


def test_a_lagged_router_view_is_refused_on_vllms_hybrid_pool():
    requests = pool_requests()
    with pytest.raises(ConfigError, match=r"cluster\.router_lag_s"):
        cluster_run(
            requests, fresh_step("vllm", NEMOTRON, 0.4e9), 2, "hybrid_aware", router_lag_s=0.5
        )
