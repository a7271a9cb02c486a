"""The route table (``simlab.run.routes``): every route is taken where its plug-ins' declarations
and the settings allow it, refused with a reason otherwise, kept in ``summary.json``, and every
route gives the records the slower ones give on the cases it accepts (each forced on and off by
``cache.one_pass`` / ``cache.compiled`` on one small synthetic trace)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from policies.engine_lru import BlockLRU
from policies.fifo import FIFO
from policies.lru import LRU
from policies.production import VLLM
from simlab.cache.contract import EvictionPolicy
from simlab.engines.block_pool import pool_run, pool_shape
from simlab.engines.records import RECORD_COLUMNS, record_columns
from simlab.engines.replay import ReplayEngine
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import TimedEngine
from simlab.report.load import load_run
from simlab.report.provenance import run_lines
from simlab.run import routes
from simlab.run.simulate import plan_run, policy_step, simulate, trace_requests
from tests.fixtures import compose, model
from tests.test_cluster import A100

CHAT = [
    "trace=chat",
    "trace.n_sessions=12",
    "arrivals.mode=uniform",
    "bounds.enabled=false",
    "report=false",
    "engine=replay",
]
LLAMA = ["model=llama3_8b", "cache.size_gb=0.05"]
HYBRID = ["model=marconi_7b", "cache.size_gb=0.4"]
#: the timed engine's columns are NaN in a replay; the rest is what a route computes
COLUMNS = [c for c in RECORD_COLUMNS if c not in ("first_token", "finished", "ttft", "queue_delay")]

NO_ONE_PASS = ["cache.one_pass=false"]
NOT_COMPILED = ["cache.compiled=false"]
#: per fast route: a run that takes it, and the settings of the slower routes it must equal
CASES = {
    "stack_distances": ([*LLAMA, "+policy=vllm"], [NO_ONE_PASS]),
    "block_heap": (
        [*LLAMA, "+policy=vllm", "eviction@policy.eviction=fifo", *NOT_COMPILED],
        [NO_ONE_PASS],
    ),
    "compiled_block_heap": (
        [*LLAMA, "+policy=clairvoyant_blocks", "cache.compiled=true"],
        [NOT_COMPILED, [*NOT_COMPILED, *NO_ONE_PASS]],
    ),
    "compiled_radix": (
        [*HYBRID, "+policy=marconi", "policy.tuning.enabled=false", "cache.compiled=true"],
        [NOT_COMPILED],
    ),
    "compiled_radix, LRU": (
        [*HYBRID, "+policy=sglang_plus", "cache.compiled=true"],
        [NOT_COMPILED],
    ),
    "compiled_radix, fine-grained": (
        [*HYBRID, "+policy=vllm_plus", "cache.compiled=true"],
        [NOT_COMPILED],
    ),
}


def run(overrides: list[str], tmp_path, name: str) -> tuple[pd.DataFrame, dict]:
    out = tmp_path / name
    simulate(compose([*CHAT, *overrides, f"output_dir={out}"]))
    summary = json.loads((out / "summary.json").read_text())
    return pd.read_parquet(out / "records.parquet"), summary


@pytest.mark.parametrize("case", list(CASES))
def test_every_fast_route_gives_the_slower_routes_records(case, tmp_path):
    overrides, slower = CASES[case]
    if "compiled" in case:
        pytest.importorskip("numba")
    fast, summary = run(overrides, tmp_path, "fast")
    (route,) = summary["routes"].values()
    assert route["taken"] == case.split(",")[0]
    assert fast["nodes_evicted"].sum() > 0 and fast["hit_tokens"].sum() > 0
    taken = []
    for i, settings in enumerate(slower):
        want, other = run([*overrides, *settings], tmp_path, f"slow{i}")
        (slow,) = other["routes"].values()
        taken.append(slow["taken"])
        assert_frame_equal(fast[COLUMNS], want[COLUMNS], check_exact=True)
    assert route["taken"] not in taken and len(set(taken)) == len(taken)


def test_the_block_pool_runs_a_hybrid_under_vllm_and_refuses_a_transformer(tmp_path):
    """vLLM's pool is the route of a hybrid under ``policy=vllm`` (the tree does not model its
    pool); a Transformer's replay keeps the faster block paths, and on vLLM's pool (what the
    timed engine's shared KV pool runs) it hits what they hit, request for request."""
    _, summary = run(["model=nemotron_h_8b", "cache.size_gb=1", "+policy=vllm"], tmp_path, "h")
    route = summary["routes"]["vllm"]
    assert route["taken"] == "block_pool"
    assert "hybrid" in route["refused"]["stack_distances"]
    llama = ["model=llama3_8b", "cache.size_gb=1", "+policy=vllm"]  # holds any request
    tree, summary = run([*llama, "cache.one_pass=false"], tmp_path, "t")
    assert "Transformer" in summary["routes"]["vllm"]["refused"]["block_pool"]
    cfg = compose([*CHAT, *llama])
    plan = plan_run(cfg)
    _, requests = trace_requests(plan.trace, plan.settings)
    step = policy_step(plan.policies["vllm"], plan.model, plan.settings)
    assert routes.pool_refusal(step, requests, transformers=True) is None
    shape = pool_shape(step, requests)
    assert shape is not None
    pooled = record_columns(pool_run(requests, step, shape, "vllm").records)
    assert tree["nodes_evicted"].sum() > 0
    assert (pooled["hit_tokens"] == tree["hit_tokens"].to_numpy()).all()


def test_the_timed_engine_runs_vllms_pool_where_the_route_table_says():
    spec = model("nemotron_h_8b")
    step = RequestStep.build(spec, 1e9, VLLM(), BlockLRU(), "vllm")
    shared = TimedEngine(hardware=A100, kv_pool="shared", running_memory_gb=1.0)
    assert routes.choose(routes.Case(step, shared, [])).taken == "pool_world" and step.pool
    step = RequestStep.build(spec, 1e9, VLLM(block_pool=False), BlockLRU(), "vllm")
    route = routes.choose(routes.Case(step, shared, []))
    assert route.taken == "timed_world" and not step.pool
    assert "does not model" in route.refused["pool_world"]


# ------------------------------------------------------------------ capabilities, not names
@dataclass
class RenamedLRU(LRU):
    """A subclass: it inherits LRU's declarations."""


@dataclass
class OwnFIFO(EvictionPolicy):
    """No relation to any shipped plug-in: it declares FIFO's order."""

    order = "fifo"

    def scores(self, cache, candidates):
        raise AssertionError("the heap never asks")


@pytest.mark.parametrize(
    ("eviction", "taken"),
    [
        (LRU(refreshes_insert_path=True), "stack_distances"),
        (RenamedLRU(refreshes_insert_path=True), "stack_distances"),
        (FIFO(), "block_heap"),
        (OwnFIFO(), "block_heap"),
        (LRU(), "request_step"),  # refreshes nothing on insertion: no inclusion property
    ],
)
def test_a_route_follows_the_declarations_not_the_class(eviction, taken):
    step = RequestStep.build(model("llama3_8b"), 1e9, VLLM(), eviction, "p")
    route = routes.choose(routes.Case(step, ReplayEngine(), [], compiled=False))
    assert route.taken == taken, route


def test_refusals_name_what_a_faster_route_needs():
    step = RequestStep.build(model("llama3_8b"), 1e9, VLLM(), EvictionPolicy(), "p")
    route = routes.choose(routes.Case(step, ReplayEngine(), [], compiled=False))
    assert route.taken == "request_step"
    assert route.refused["stack_distances"] == "eviction is custom (recency only)"
    assert route.refused["compiled_radix"].startswith("cache.compiled=False")
    assert route.to_dict() == {"taken": "request_step", "refused": route.refused}


def test_the_provenance_page_shows_each_policys_route(tmp_path):
    run([*LLAMA, "+policy=vllm", "cache.one_pass=false"], tmp_path, "run")
    lines = run_lines(load_run(tmp_path / "run"))
    at = lines.index("== Routes (the code that computed each policy) ==")
    assert lines[at + 1] == "vllm: request_step"
    assert "  not stack_distances: cache.one_pass=false" in lines[at + 2 : at + 6]
