"""The cyclic garbage collector is paused while a simulation runs
(:func:`simlab.util.collector.collector_paused`). That is safe only while the engines make no
reference cycles as they run: reference counting then frees whatever they drop, and nothing
waits for the collector. These tests hold every engine to that invariant, on traces of two
lengths, and check that the pause restores the collector as it found it."""

from __future__ import annotations

import gc
from contextlib import contextmanager

import pytest
import simpy

import simlab.run.policy
from simlab.run.simulate import simulate
from simlab.util.collector import collector_paused
from tests.fixtures import compose

#: the functions :func:`cycles_left` wraps, as imported (before any test patched them)
REAL_RUN, REAL_PAUSE = simpy.Environment.run, collector_paused
CHAT = ["trace=chat", "arrivals.mode=uniform", "bounds.enabled=false", "report=false"]

#: a configuration per engine and per part of an engine with its own per-request objects
RUNS = {
    "replay, token tree": ["+policy=marconi", "cache.size_gb=0.5", "cache.compiled=false"],
    "replay, the paper's alpha tuner": [
        "+policy=marconi",
        "policy.tuning.protocol=paper",
        "cache.size_gb=0.5",
        "cache.compiled=false",
    ],
    "replay, host tier": [
        "+policy=sglang",
        "cache.size_gb=0.3",
        "cache.host_gb=1",
        "cache.host_bw_gbps=25",
    ],
    "timed, token tree": ["engine=timed", "+policy=marconi", "cache.size_gb=0.5"],
    "timed, vLLM's block pool": [
        "engine=timed",
        "model=llama3_8b",
        "engine.kv_pool=shared",
        "+policy=vllm",
        "cache.size_gb=2",
    ],
    "timed, SSM pool": ["engine=timed", "+policy=sglang", "cache.size_gb=1", "cache.ssm_gb=0.3"],
    "cluster": [
        "engine=timed",
        "+policy=sglang",
        "cache.size_gb=0.5",
        "cluster.replicas=2",
        "cluster.router=prefix_aware",
    ],
    "offline": ["engine=offline", "+policy=sglang", "cache.size_gb=0.5"],
}


def cycles_left(monkeypatch, overrides: list[str]) -> list[int]:
    """Objects in reference cycles found unreachable at the end of each engine loop of a run
    (a SimPy environment's run, with the world still alive) and at the end of each paused
    body: what the run dropped in cycles while the collector was paused."""
    found: list[int] = []

    def run_then_collect(env, until=None):
        out = REAL_RUN(env, until)
        found.append(gc.collect())
        return out

    @contextmanager
    def paused_then_collect():
        with REAL_PAUSE():
            yield
            if not found:  # no event loop (the replay): what the whole body dropped
                found.append(gc.collect())

    monkeypatch.setattr(simpy.Environment, "run", run_then_collect)
    monkeypatch.setattr(simlab.run.policy, "collector_paused", paused_then_collect)
    simulate(compose([*CHAT, *overrides]))
    return found


@pytest.mark.parametrize("run", list(RUNS))
def test_no_engine_drops_reference_cycles_as_it_runs(run, monkeypatch, tmp_path):
    """With the collector paused, what each engine loop leaves in unreachable cycles is the
    same on 8 sessions as on 16: nothing per request waits for the collector, however long
    the trace. (It is nothing at all, except a cluster's: building each replica's policy
    leaves the tracebacks of OmegaConf's caught missing-key errors, a few per replica.)"""
    found = {}
    for sessions in (8, 16):
        overrides = [*RUNS[run], f"trace.n_sessions={sessions}", "overwrite=true"]
        found[sessions] = cycles_left(monkeypatch, [*overrides, f"output_dir={tmp_path}"])
    assert found[8], "the run never paused the collector"
    assert found[16] == found[8], f"objects left in cycles by sessions: {found}"
    assert all(n < 1000 for n in found[16]), found


def test_a_pause_freezes_and_stops_the_collector_then_restores_it():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with collector_paused():  # a pause within a pause changes nothing
            assert not gc.isenabled()
        assert gc.get_freeze_count() == frozen
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_pause_leaves_a_collector_switched_off_as_it_is():
    gc.disable()
    try:
        with collector_paused():
            assert gc.get_freeze_count() == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failing_body_restores_the_collector():
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a run failed")
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
