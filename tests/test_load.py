"""The load verdict and the steady-state check of timed runs (simlab.engines.timed.load): judged
on queueing, the pool's preemptions and stalls, and whether arrivals outlast the service."""

from __future__ import annotations

import pytest

from simlab.config import ClusterSettings
from simlab.engines.cluster.engine import ClusterEngine
from simlab.engines.records import RequestRecord
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.load import load_verdict, steady_state
from simlab.run.summary import Summary
from tests.fixtures import chat_trace, policy_plugins
from tests.test_timed import A100, CKPT, HYBRID, timed_run
from traces.arrivals import assign_arrivals


def record(session: int, arrival: float, wait: float, served: float, rid: int = 0) -> RequestRecord:
    """A finished request that waited ``wait`` s and was served (to its first token, and
    finished) ``served`` s later."""
    out = RequestRecord(
        "p", rid, session, 0, arrival, 100, 10, 0, 0, 0.0, 0.0, 0, 0, 0, 0, 0, False, 0, 0
    )
    out.queue_delay, out.scheduled = wait, arrival + wait
    out.ttft, out.finished = wait + served, arrival + wait + served
    return out


def spaced(waits: list[float], served: float = 0.5) -> list[RequestRecord]:
    return [record(i, float(i), w, served, rid=i) for i, w in enumerate(waits)]


def test_a_busy_gpu_that_serves_without_queueing_is_not_saturated():
    """Case 2 of issue 78: GPU busy alone flagged runs whose requests barely waited."""
    verdict = load_verdict(spaced([0.01] * 50), busy=0.99, preempted=0, stalled=set())
    assert verdict["load"] == "ok" and not verdict["saturated"]


def test_a_queue_that_grows_then_drains_is_a_building_backlog():
    """The hump of a finite session population (8.7 -> 24 -> 33 -> 32 -> 10 s by arrival fifth)
    was read as no saturation: the last quarter waited no more than twice the first."""
    waits = [w for w in (8.7, 24.0, 33.0, 32.0, 10.0) for _ in range(20)]
    verdict = load_verdict(spaced(waits, served=1.0), busy=0.87, preempted=0, stalled=set())
    assert verdict["saturated"] and verdict["load"] == "saturated"
    assert "8.70 -> 24.00 -> 33.00 -> 32.00 -> 10.00" in verdict["saturation"]


def test_preemptions_or_memory_stalls_make_the_pool_the_bottleneck():
    waits = [2.0] * 100  # flat: no backlog builds, the GPU not busy
    verdict = load_verdict(spaced(waits), busy=0.5, preempted=14, stalled=set())
    assert verdict["saturated"] and "14 of 100 requests preempted" in verdict["saturation"]
    verdict = load_verdict(spaced(waits), busy=0.5, preempted=0, stalled=set(range(30)))
    assert verdict["saturated"]
    assert "30 of 100 requests waited for pool memory" in verdict["saturation"]
    quick = load_verdict(spaced([0.1] * 100), busy=0.5, preempted=0, stalled=set(range(30)))
    assert not quick["saturated"], "stalls that cost less than service are not a bottleneck"
    # a tenth of the requests wait 20 s for memory while the median one waits none: pool-bound
    tail = load_verdict(spaced([20.0] * 10 + [0.0] * 90), 0.1, 0, stalled=set(range(10)))
    assert tail["saturated"] and "20.00 s on average" in tail["saturation"]
    few = load_verdict(spaced(waits), busy=0.5, preempted=4, stalled=set(range(4)))
    assert few["load"] == "queueing", "waiting longer than served, at a load kept up with"


def test_a_burst_of_sessions_never_reaches_a_steady_state():
    """Case 3 of issue 78: 100 sessions at 2/s lasting 280 s each is a 50-second burst; a
    steady 2/s would hold about 560 open."""
    records = [
        record(s, s / 2 + t, 0.0, 1.0, rid=100 * s + t) for s in range(100) for t in (0, 279)
    ]
    state = steady_state(records)
    assert not state["reached"] and state["peak_open_sessions"] == 100
    assert state["expected_open_sessions"] == pytest.approx(2 * 280, rel=0.01)
    assert "at most 100 sessions open at once" in state["caveat"]
    assert "= 560: a burst" in state["caveat"]


def test_a_long_run_reaches_a_steady_state_and_a_drain_is_named():
    steady = [record(s, s + t, 0.0, 1.0, rid=10 * s + t) for s in range(500) for t in (0, 5)]
    state = steady_state(steady)
    assert state["reached"] and "caveat" not in state
    assert state["peak_open_sessions"] >= state["expected_open_sessions"]
    # the last 100 requests arrive together and wait in turn: the queue clears 99 s later,
    # over a tenth of the 505 s of arrivals
    drained = steady[:-1] + [
        record(999 + k, 505.0, float(k), 1.0, rid=9999 + k) for k in range(100)
    ]
    state = steady_state(drained)
    assert not state["reached"] and state["queued_at_last_arrival"] == 99
    assert (
        "arrivals stop at 505 s with 99 requests queued, and the queue clears 99 s later"
        in state["caveat"]
    )


def test_timed_runs_carry_the_verdict_and_a_heavy_one_is_saturated():
    trace = chat_trace(seed=7, sessions=40)
    heavy, records, _ = timed_run("sglang_plus", trace, 30 * CKPT, session_rate=50.0, max_running=2)
    flags = load_verdict(records, 1.0, 0, heavy.stats.stalled)
    assert flags["saturated"] and "the backlog builds" in flags["saturation"]
    _, records, _ = timed_run("sglang_plus", trace, 30 * CKPT, session_rate=1e-3)
    assert load_verdict(records, 0.1, 0, set())["load"] == "ok"
    policy = {"token_hit_rate": 0.5, "saturated": True, "saturation": "the backlog builds"}
    lines = Summary(policies={"lru": policy}, trace={}, config={}).saturation_lines()
    assert "warning: lru is saturated (the backlog builds); its latencies measure" in lines
    assert "cache.size_gb=engine" not in lines  # the queue, not the pool
    pool = policy | {"saturation": "300 of 900 requests waited for pool memory"}
    lines = Summary(policies={"lru": pool}, trace={}, config={}).saturation_lines()
    assert "or take the engine's own KV pool (cache.size_gb=engine), to compare" in lines
    sized = Summary(policies={"lru": pool}, trace={}, config={"engine_pool": {}})
    assert "cache.size_gb=engine" not in sized.saturation_lines()  # it has it already


def test_a_timed_engine_run_states_its_load_and_warns_of_a_burst(caplog):
    """The engine's summary items: the verdict, the steady state and, for a burst, a caveat
    logged once as a WARNING; the memory stalls of a shared pool that is too small."""
    trace = assign_arrivals(
        chat_trace(seed=3, sessions=20), session_rate=50.0, think_time_mean=2.0, seed=0
    )
    admission, eviction = policy_plugins("sglang_plus")
    step = RequestStep.build(HYBRID, 4 * CKPT, admission, eviction, "sglang_plus")
    engine = TimedEngine(hardware=A100, kv_pool="shared", running_memory_gb=4 * CKPT / 1e9)
    with caplog.at_level("WARNING", logger="simlab.engines.timed.engine"):
        extras = engine.run(list(trace.requests()), step).extras
    assert extras["load"] in ("ok", "queueing", "saturated")
    assert extras["memory_stalled_requests"] > 0
    assert not extras["steady_state"]["reached"]
    assert extras["caveats"] == [extras["caveats"][0]]
    assert extras["caveats"][0].startswith("no steady state: at most 20 sessions open")
    warned = [r for r in caplog.records if "no steady state" in r.getMessage()]
    assert len(warned) == 1


def test_a_request_over_the_running_memory_runs_alone_and_says_so(caplog):
    """``kv_pool=separate`` starts a request that needs more than ``engine.running_memory_gb``
    once nothing else runs (it could never start otherwise): a long agentic context on a dense
    model did so silently. Now it is one warning and a caveat beside the steady state's."""
    trace = assign_arrivals(
        chat_trace(seed=3, sessions=20), session_rate=50.0, think_time_mean=2.0, seed=0
    )
    requests = list(trace.requests())
    longest = max(r.input_tokens + r.output_len for r in requests)
    budget = (longest - 1) * HYBRID.kv_bytes_per_token + CKPT  # the longest does not fit
    admission, eviction = policy_plugins("sglang_plus")

    def fresh() -> RequestStep:
        return RequestStep.build(HYBRID, 40 * CKPT, admission, eviction, "sglang_plus")

    engine = TimedEngine(hardware=A100, running_memory_gb=budget / 1e9)
    with caplog.at_level("WARNING", logger="simlab.engines.timed.engine"):
        extras = engine.run(requests, fresh()).extras
    over = [c for c in extras["caveats"] if "more running memory than" in c]
    assert len(over) == 1 and over[0].startswith("1 requests needed more running memory")
    assert any(c.startswith("no steady state") for c in extras["caveats"]), "both kept"
    warned = [r for r in caplog.records if "more running memory than" in r.getMessage()]
    assert len(warned) == 1
    roomy = TimedEngine(hardware=A100, running_memory_gb=2 * budget / 1e9)
    assert not any("more running" in c for c in roomy.run(requests, fresh()).extras["caveats"])
    cluster = ClusterEngine(engine, ClusterSettings(2, "round_robin"))
    caveats = cluster.run(requests, fresh(), fresh).extras["caveats"]
    assert [c for c in caveats if "more running memory than" in c] == over, "on a replica too"


def test_a_closed_loop_has_no_backlog_to_build():
    """trace.users: the queue holds at most one request per user; delays that grow with the
    requests' contexts are not a building backlog."""
    waits = [w for w in (0.5, 2.0, 4.0, 6.0, 8.0) for _ in range(20)]
    assert load_verdict(spaced(waits), busy=0.1, preempted=0, stalled=set())["saturated"]
    closed = load_verdict(spaced(waits), busy=0.1, preempted=0, stalled=set(), closed=True)
    assert closed["load"] == "queueing" and not closed["saturated"]
