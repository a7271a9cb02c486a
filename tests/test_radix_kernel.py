"""Judicious admission with Marconi's FLOP-aware or LRU eviction on the token tree, compiled
(simlab/fastpaths/radix/kernel.py, numba).

The oracle is the request step (simlab/engines/step.py over simlab/cache/prefix.py, itself checked against the
Marconi reference code and SGLang's cache): the kernel must give every record column bit for
bit, and the cache's peaks, on real traces (ShareGPT, the SWE-bench slice, LMSys; hybrids with
Mamba2 and Mamba1 layers and a Transformer; capacities that truncate, evict and never evict)
and on random token tries (hypothesis: sessions that extend or rewrite their history, shared
prefixes, splits, merges). A run with ``cache.compiled=true`` writes what one with ``false``
writes, and every run the kernel cannot take runs request by request."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies.fine_grained import FineGrained
from policies.flop_aware import FlopAware
from policies.judicious import Judicious
from policies.lru import LRU
from simlab.cache.contract import AdmissionPolicy
from simlab.engines.records import record_columns
from simlab.engines.replay import ReplayEngine, replay_step
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import TimedEngine
from simlab.fastpaths.radix import kernel as radix_kernel
from simlab.fastpaths.radix import replay as radix_replay
from simlab.run import routes
from simlab.run.simulate import plan_run, policy_step, trace_requests
from tests.fixtures import compose, model
from tests.test_capacities import results, run_list, run_scalar, without_timing
from tests.test_compat import needs_data
from traces.format import Request

pytest.importorskip("numba", reason="the compiled path needs numba (pip install simlab[fast])")

MARCONI = ["+policy=marconi", "policy.tuning.enabled=false"]


def configured(overrides: list[str]) -> tuple[list[Request], RequestStep, object]:
    """A configured run's requests, a fresh step of its one policy and its engine."""
    cfg = compose(["engine=replay", *overrides])
    plan = plan_run(cfg)
    trace, requests = trace_requests(plan.trace, plan.settings)
    (spec,) = plan.policies.values()
    step = policy_step(spec, plan.model, plan.settings, trace.block_size)
    return requests, step, plan.engine


def assert_compiled_equals_step(requests: list[Request], step: RequestStep, oracle: RequestStep):
    """``step`` (fresh) compiled gives the records and peaks the request step gives on
    ``oracle`` (a fresh twin of it)."""
    got, peaks = radix_replay.compiled_replay(requests, step)
    want = record_columns(replay_step(requests, oracle))
    assert list(got) == list(want)
    for name, column in want.items():
        assert got[name].dtype == column.dtype, name
        same = np.array_equal(got[name], column, equal_nan=column.dtype.kind == "f")
        assert same, (name, int(np.flatnonzero(got[name] != column)[0]))
    cache = oracle.cache
    assert tuple(peaks) == (cache.peak_kv_bytes, cache.peak_ssm_bytes, cache.peak_bytes)
    assert step.cache.used_bytes == 0  # the compiled run leaves the step's own cache alone
    return got


SHAREGPT = ["trace=sharegpt"]
SWEBENCH = ["trace=swebench", "trace.limit=10"]
TRACE_CASES = {
    "sharegpt, marconi 7B, alpha 1, 1 GB": [*SHAREGPT, "model=marconi_7b", *MARCONI],
    "sharegpt, Nemotron-H, alpha 0, 0.5 GB": [
        *SHAREGPT,
        "model=nemotron_h_8b",
        *MARCONI,
        "policy.alpha=0",
        "cache.size_gb=0.5",
    ],
    "sharegpt, Nemotron-H, SGLang+ (LRU), 0.5 GB": [
        *SHAREGPT,
        "model=nemotron_h_8b",
        "+policy=sglang_plus",
        "cache.size_gb=0.5",
    ],
    "sharegpt, Jamba (Mamba1), alpha 0.5, states rounded down to 64-token chunks, 2 GB": [
        *SHAREGPT,
        "model=jamba_1_5_mini",
        *MARCONI,
        "policy.alpha=0.5",
        "policy.admission.alignment=round_down",
        "policy.admission.chunk_size=64",
        "cache.size_gb=2",
    ],
    "sharegpt, marconi 7B, 0.06 GB (admissions truncated)": [
        *SHAREGPT,
        "model=marconi_7b",
        *MARCONI,
        "cache.size_gb=0.06",
    ],
    "sharegpt, Llama-3-8B, Marconi, 0.3 GB": [
        *SHAREGPT,
        "model=llama3_8b",
        *MARCONI,
        "cache.size_gb=0.3",
    ],
    "sharegpt, Llama-3-8B, SGLang+, 0.05 GB (admissions truncated)": [
        *SHAREGPT,
        "model=llama3_8b",
        "+policy=sglang_plus",
        "cache.size_gb=0.05",
    ],
    "sharegpt, marconi 7B, infinite cache": [
        *SHAREGPT,
        "model=marconi_7b",
        *MARCONI,
        "cache.size_gb=inf",
    ],
    "swebench slice, Nemotron-H, alpha 1, 1.5 GB": [
        *SWEBENCH,
        "model=nemotron_h_8b",
        *MARCONI,
        "cache.size_gb=1.5",
    ],
    "swebench slice, marconi 7B, SGLang+, 4 GB": [
        *SWEBENCH,
        "model=marconi_7b",
        "+policy=sglang_plus",
        "cache.size_gb=4",
    ],
    "sharegpt, marconi 7B, vLLM+ (a state every 32 tokens, LRU), 2 GB": [
        *SHAREGPT,
        "model=marconi_7b",
        "+policy=vllm_plus",
        "cache.size_gb=2",
    ],
    "sharegpt, Llama-3-8B, vLLM+ (32-token pages), 0.3 GB": [
        *SHAREGPT,
        "model=llama3_8b",
        "+policy=vllm_plus",
        "cache.size_gb=0.3",
    ],
    "swebench slice, Nemotron-H, vLLM+ with 64-token blocks, 20 GB": [
        *SWEBENCH,
        "model=nemotron_h_8b",
        "+policy=vllm_plus",
        "policy.admission.block_size=64",
        "cache.size_gb=20",
    ],
    "sharegpt, marconi 7B, fine-grained states with Marconi's eviction, 1 GB": [
        *SHAREGPT,
        "model=marconi_7b",
        "+policy=vllm_plus",
        "eviction@policy.eviction=flop_aware",
        "cache.size_gb=1",
    ],
    "lmsys, marconi 7B, alpha 2, 2 GB": [
        "trace=lmsys",
        "model=marconi_7b",
        *MARCONI,
        "policy.alpha=2",
        "cache.size_gb=2",
    ],
}


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_the_kernel_gives_the_request_steps_records_on_real_traces(case):
    overrides = TRACE_CASES[case]
    needs_data(overrides[0].removeprefix("trace="))
    requests, step, engine = configured(overrides)
    assert kernel_refusal(step, engine, requests) is None
    _, oracle, _ = configured(overrides)
    got = assert_compiled_equals_step(requests, step, oracle)
    if "truncated" in case:
        assert got["admission_truncated"].any()
    if "infinite" in case:
        assert not got["nodes_evicted"].any()
    else:
        assert got["nodes_evicted"].sum() > 50  # the cache evicts on and on


# ---------------------------------------------------------------------------- random tries
@st.composite
def sessions(draw):
    """Requests of a few sessions over 3 tokens, interleaved: each turn's input is its
    session's last sequence plus new tokens, or now and then a rewritten history (a new region
    of the pool); outputs of 0-5 tokens. The inputs of a session chain may be views of one
    buffer, as the trace codec gives them (:mod:`traces.columnar`), or copies."""
    n_sessions = draw(st.integers(1, 5))
    tokens = st.lists(st.integers(0, 2), min_size=1, max_size=12)
    history: dict[int, np.ndarray] = {}
    requests: list[Request] = []
    for sid in draw(st.lists(st.integers(0, n_sessions - 1), min_size=1, max_size=30)):
        last = history.get(sid)
        new = np.asarray(draw(tokens), dtype=np.int32)
        if last is None or draw(st.integers(0, 5)) == 0:
            last = np.asarray(draw(tokens), dtype=np.int32)
        prompt = np.concatenate((last, new))
        output = np.asarray(draw(st.lists(st.integers(0, 2), max_size=5)), dtype=np.int32)
        turn = sum(r.session_id == sid for r in requests)
        requests.append(Request(len(requests), sid, turn, float(len(requests)), prompt, output, len(output)))  # fmt: skip
        history[sid] = np.concatenate((prompt, output))
    return as_views(requests) if draw(st.booleans()) else requests


def as_views(requests: list[Request]) -> list[Request]:
    """``requests`` with the inputs of each session chain (each a prefix of the next) made
    views of the chain's longest input."""
    owner: dict[int, np.ndarray] = {}  # session -> the longest input of its current chain
    chains: list[list[int]] = []
    chain_of: dict[int, int] = {}
    for i, req in enumerate(requests):
        longest = owner.get(req.session_id)
        n = longest.shape[0] if longest is not None else 0
        if longest is not None and np.array_equal(req.input_ids[:n], longest):
            chains[chain_of[req.session_id]].append(i)
        else:
            chain_of[req.session_id] = len(chains)
            chains.append([i])
        owner[req.session_id] = req.input_ids
    out = list(requests)
    for chain in chains:
        buffer = requests[chain[-1]].input_ids.copy()
        for i in chain:
            out[i] = dataclasses.replace(requests[i], input_ids=buffer[: requests[i].input_len])
    return out


@settings(max_examples=200, deadline=None)
@given(
    requests=sessions(),
    hybrid=st.booleans(),
    lru=st.booleans(),
    alpha=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    round_down=st.booleans(),
    chunk=st.integers(1, 6),
    kv_tokens=st.integers(0, 40),
    states=st.integers(0, 4),
    spare=st.sampled_from([0.0, 0.5]),
    block=st.integers(0, 3),
)
def test_the_kernel_gives_the_request_steps_records_on_random_tries(
    requests, hybrid, lru, alpha, round_down, chunk, kv_tokens, states, spare, block
):
    """``block`` 0: judicious admission; else fine-grained, a state every ``block`` tokens."""
    spec = model("marconi_7b" if hybrid else "llama3_8b")
    capacity = kv_tokens * spec.kv_bytes_per_token + states * spec.ssm_state_bytes + spare
    if capacity < spec.kv_bytes_per_token:
        capacity = math.inf

    def make() -> RequestStep:
        alignment = "round_down" if round_down else "exact"
        admission: AdmissionPolicy = Judicious(alignment=alignment, chunk_size=chunk)
        if block:
            admission = FineGrained(block_size=block)
        eviction = LRU() if lru else FlopAware(alpha=alpha)
        return RequestStep.build(spec, capacity, admission, eviction, "random")

    assert_compiled_equals_step(requests, make(), make())


@pytest.mark.parametrize("policy", ["+policy=vllm_plus", "+policy=sglang_plus"])
def test_the_kernel_grows_its_state_as_it_needs(policy, monkeypatch):
    """Started with room for a handful of nodes, the kernel doubles its node slots, table and
    path as requests need them (a fine-grained admission's chains of hundreds of nodes): the
    same records."""
    monkeypatch.setattr(radix_replay, "NODES_PER_REQUEST", 0)  # where the replay reads it
    grown = []
    grow = radix_kernel.Kernel.grow
    monkeypatch.setattr(radix_kernel.Kernel, "grow", lambda k: grown.append(1) or grow(k))
    overrides = [*SHAREGPT, "model=nemotron_h_8b", policy, "cache.size_gb=1"]
    requests, step, _ = configured(overrides)
    _, oracle, _ = configured(overrides)
    assert_compiled_equals_step(requests, step, oracle)
    assert grown


@pytest.mark.parametrize("lru", [True, False])
def test_equally_scored_victims_go_oldest_first(lru):
    """Two leaves last touched at the same tick: the older node (smaller creation id) goes."""
    from simlab.fastpaths.radix.jit import layout
    from simlab.fastpaths.radix.jit.evict import evict

    spec = model("llama3_8b")
    ids = [[1, 2, 3], [4, 5, 6]]
    requests = [
        Request(i, i, 0, float(i), np.array(x, np.int32), np.zeros(0, np.int32), 0)
        for i, x in enumerate(ids)
    ]
    eviction = LRU() if lru else FlopAware(alpha=0.0)
    step = RequestStep.build(spec, math.inf, Judicious(), eviction, "ties")
    pool = radix_kernel.shared_pool(requests, step, None)
    kernel = radix_kernel.Kernel.of(radix_kernel.empty_state(step, pool.tokens, 16), 2)
    out = np.zeros((10, 2), dtype=np.int64)
    kernel.serve(pool.offs, pool.in_lens, pool.seq_lens, out, 0, 2)
    nodes, floats = kernel.st[layout.NODES], kernel.st[layout.FLOATS]
    leaves = [s for s in range(1, 3) if nodes[layout.ALIVE, s] and not nodes[layout.KIDS, s]]
    assert len(leaves) == 2
    floats[layout.LAST, leaves] = 7.0
    kernel.st[layout.SETTINGS][layout.CAPACITY] = 4 * spec.kv_bytes_per_token  # 6 tokens held
    evict(kernel.st, 0, np.zeros(6, dtype=np.int64))
    older = min(leaves, key=lambda s: nodes[layout.NID, s])
    assert not nodes[layout.ALIVE, older] and nodes[layout.ALIVE, max(leaves) + min(leaves) - older]


def test_an_lru_hit_refreshes_its_whole_path():
    """A request cached whole adds nothing, so only its hit's refresh keeps its prefix
    younger than a leaf admitted after it: LRU refreshes every node on the path."""
    spec = model("llama3_8b")
    ids = [[1, 2, 3], [4, 5], [1, 2, 3], [6, 7, 8], [1, 2, 3, 9]]
    requests = [
        Request(i, i, 0, float(i), np.array(x, np.int32), np.zeros(0, np.int32), 0)
        for i, x in enumerate(ids)
    ]

    def make() -> RequestStep:
        return RequestStep.build(spec, 7.5 * spec.kv_bytes_per_token, Judicious(), LRU(), "lru")

    got = assert_compiled_equals_step(requests, make(), make())
    assert got["hit_tokens"].tolist() == [0, 0, 2, 0, 3]  # [4, 5] went, not [1, 2, 3]


@settings(max_examples=300, deadline=None)
@example(hybrid=True, matched=5, old=[2], new=[], keep=1, tokens=0, offset=0.0)
@example(hybrid=True, matched=5, old=[2], new=[3], keep=2, tokens=0, offset=0.0)
@given(
    hybrid=st.booleans(),
    matched=st.integers(0, 20),
    old=st.lists(st.integers(1, 20), max_size=2, unique=True),
    new=st.lists(st.integers(1, 30), max_size=2, unique=True),
    keep=st.integers(0, 4),
    tokens=st.integers(0, 30),
    offset=st.sampled_from([-0.5, 0.0, 0.5]),
)
def test_the_kernels_truncation_is_the_caches(hybrid, matched, old, new, keep, tokens, offset):
    """Budgets just below, at and above what a prefix of the plan costs (its first ``keep``
    states; a Transformer: ``tokens`` of KV): the longest prefix of the plan that fits."""
    from simlab.cache.nodes import InsertPlan, truncate
    from simlab.fastpaths.radix.jit import admit, layout

    spec = model("marconi_7b" if hybrid else "llama3_8b")
    kv, ckpt = 7, 40 if hybrid else 0
    shape = dataclasses.make_dataclass(
        "Shape", ["hybrid", "page_size", "kv_per_token", "ckpt_bytes"]
    )
    old = sorted({matched - c for c in old if c < matched}) if hybrid else []  # cached tokens
    new = sorted(c + matched for c in new) if hybrid else []
    end = new[-1] if new else matched + 5
    costs = [ckpt] * len(old) + [
        (c - p) * kv + ckpt for p, c in itertools.pairwise([matched, *new])
    ]
    budget = max(0.0, (sum(costs[:keep]) if hybrid else tokens * kv) + offset)
    want = truncate(shape(hybrid, 1, kv, ckpt), InsertPlan(matched, end, old, new), budget)
    step = RequestStep.build(spec, 1e9, Judicious(), FlopAware(), "truncate")
    state = radix_kernel.empty_state(step, np.zeros(1, np.int32), 4)
    state[layout.INTS][layout.KV_PER_TOKEN], state[layout.INTS][layout.CKPT_BYTES] = kv, ckpt
    ckpts = np.array([*old, *new, 0, 0, 0, 0][:4], dtype=np.int64)
    n_old, n_new, got_end = admit.truncate(state, budget, matched, end, ckpts, len(old), len(new))
    assert ckpts[:n_old].tolist() == want.old_ckpts
    assert ckpts[n_old : n_old + n_new].tolist() == want.new_ckpts
    assert got_end == want.end


# ---------------------------------------------------------------------------- alpha tuning
TUNED = ["+policy=marconi", "policy.tuning.workers=1"]
TUNED_CASES = {
    "sharegpt, marconi 7B, 1 GB (robust: re-tuned every 50 requests)": [
        *SHAREGPT,
        "model=marconi_7b",
        "cache.size_gb=1",
    ],
    "sharegpt, Nemotron-H, 0.5 GB (paper: from the empty cache, FLOPs saved)": [
        *SHAREGPT,
        "model=nemotron_h_8b",
        "cache.size_gb=0.5",
        "policy.tuning.protocol=paper",
    ],
    "sharegpt, Jamba, 2 GB (robust, snapshots from the start, margin 0.01)": [
        *SHAREGPT,
        "model=jamba_1_5_mini",
        "cache.size_gb=2",
        "policy.tuning.snapshot=start",
        "policy.tuning.margin=0.01",
    ],
    "swebench slice, Nemotron-H, 1.5 GB (robust)": [
        *SWEBENCH,
        "model=nemotron_h_8b",
        "cache.size_gb=1.5",
    ],
    "sharegpt, marconi 7B, 2 GB, timed engine (its grid search on the kernel)": [
        *SHAREGPT,
        "model=marconi_7b",
        "cache.size_gb=2",
        "engine=timed",
    ],
    "swebench slice, Nemotron-H, 1.5 GB, timed engine (its grid search on the kernel)": [
        *SWEBENCH,
        "model=nemotron_h_8b",
        "cache.size_gb=1.5",
        "engine=timed",
    ],
}


def run(overrides: list[str], compiled: bool):
    from simlab.run.simulate import run_policy

    cfg = compose(["engine=replay", *overrides, f"cache.compiled={str(compiled).lower()}"])
    plan = plan_run(cfg)
    trace, requests = trace_requests(plan.trace, plan.settings)
    (spec,) = plan.policies.values()
    args = (plan.model, plan.settings, plan.engine, trace.block_size)
    return run_policy(spec, requests, *args)


@pytest.mark.parametrize("case", list(TUNED_CASES))
def test_a_tuned_compiled_run_tunes_as_the_request_step_does(case, caplog):
    """The same records and the same tunings: every window, every grid alpha's score, every
    adopted alpha (the alpha history), the bootstrap."""
    overrides = [*TUNED_CASES[case], *TUNED]
    needs_data(overrides[0].removeprefix("trace="))
    caplog.set_level("INFO", logger="simlab")
    got = run(overrides, compiled=True)
    timed = "engine=timed" in overrides
    assert ("the alpha grid search compiled" if timed else "route compiled_radix") in caplog.text
    assert got.route is not None
    assert got.route.taken == ("timed_world" if timed else "compiled_radix")
    want = run(overrides, compiled=False)
    for name, column in want.records.items():
        assert np.array_equal(got.records[name], column, equal_nan=column.dtype.kind == "f"), name
    timing = ("wall_s", "requests_per_s", "tuning_wall_s", "snapshot_wall_s")
    for key, value in want.summary.items():
        if key not in timing:
            assert got.summary[key] == value, key
    assert want.summary["alpha_tunings"] >= 1


# ---------------------------------------------------------------------------- the token pool
@pytest.mark.parametrize("trace", [SHAREGPT, SWEBENCH])
def test_the_pool_holds_each_sequence_and_a_sessions_history_once(trace):
    needs_data(trace[0].removeprefix("trace="))
    requests, _, _ = configured([*trace, "model=marconi_7b", *MARCONI])
    tokens, offs, lens = radix_kernel.token_pool(requests)
    for req, off, n in zip(requests, offs.tolist(), lens.sum(axis=0).tolist(), strict=True):
        assert np.array_equal(tokens[off : off + n], req.full_sequence())
    assert tokens.size < lens.sum() / 3  # each input repeats its session's history
    by_session: dict[int, set[int]] = {}
    for req, off in zip(requests, offs.tolist(), strict=True):
        by_session.setdefault(req.session_id, set()).add(off)
    assert sum(map(len, by_session.values())) == len(by_session)  # one region per session


def test_a_rewritten_history_gets_a_region_of_its_own():
    first = Request(0, 7, 0, 0.0, np.array([1, 2], np.int32), np.array([3], np.int32), 1)
    extends = Request(1, 7, 1, 1.0, np.array([1, 2, 3, 4], np.int32), np.zeros(0, np.int32), 0)
    rewrites = Request(2, 7, 2, 2.0, np.array([1, 2, 9, 4, 5], np.int32), np.zeros(0, np.int32), 0)
    tokens, offs, _ = radix_kernel.token_pool([first, extends, rewrites])
    assert offs.tolist() == [0, 0, 4]
    assert tokens.tolist() == [1, 2, 3, 4, 1, 2, 9, 4, 5]


# ---------------------------------------------------------------------------- runs
def test_a_compiled_run_writes_what_a_request_by_request_run_writes(tmp_path, caplog):
    base = [*SHAREGPT, "model=nemotron_h_8b", "engine=replay", "bounds.enabled=false"]
    base += ["+policy=sglang_plus"]
    caplog.set_level("INFO", logger="simlab.run.policy")
    run_scalar(base, "0.5", tmp_path / "compiled", "cache.compiled=true")
    assert "route compiled_radix" in caplog.text
    caplog.clear()
    run_scalar(base, "0.5", tmp_path / "python", "cache.compiled=false")
    assert "route request_step" in caplog.text and "route compiled_radix" not in caplog.text
    got, want = results(tmp_path / "compiled"), results(tmp_path / "python")
    assert got[2]["routes"]["sglang_plus"]["taken"] == "compiled_radix"
    assert "cache.compiled=False" in want[2]["routes"]["sglang_plus"]["refused"]["compiled_radix"]
    assert got[0].equals(want[0]) and got[1].equals(want[1])
    assert without_timing(got[2]) == without_timing(want[2])


def test_a_compiled_capacity_list_shares_one_token_pool(tmp_path, monkeypatch):
    base = [*SHAREGPT, "model=marconi_7b", *MARCONI, "engine=replay", "bounds.enabled=false"]
    base.append("reuse_breakdown=false")  # the list's own pools: no counterfactual replays
    pools = []
    build = radix_kernel.token_pool
    monkeypatch.setattr(radix_kernel, "token_pool", lambda r: pools.append(1) or build(r))
    compiled = run_list(base, ["0.5", "2"], tmp_path / "compiled", "cache.compiled=true")
    assert len(pools) == 1
    python = run_list(base, ["0.5", "2"], tmp_path / "python", "cache.compiled=false")
    for a, b in zip(compiled.points, python.points, strict=True):
        got, want = results(a.out_dir), results(b.out_dir)
        assert got[0].equals(want[0])
        assert without_timing(got[2]) == without_timing(want[2])


def kernel_refusal(step, engine, requests) -> str | None:
    """Why the route table does not run ``step`` compiled on ``engine`` (None: it does)."""
    route = routes.choose(routes.Case(step, engine, requests, compiled=True))
    return None if route.taken == "compiled_radix" else route.refused["compiled_radix"]


OBSTACLES = {
    "eviction is custom": ["+policy=marconi_plus"],
    "the reference code's semantics": [*MARCONI, "+policy.semantics.partial_descent=true"],
    "a host tier or SSM pool": [*MARCONI, "cache.host_gb=2", "cache.host_bw_gbps=10"],
    "pages or ids of many tokens": ["+policy=sglang_plus", "cache.page_size=16"],
    "admission": ["+policy=sglang"],
    "alpha tuning with a fine-grained admission": [
        "+policy=vllm_plus",
        "eviction@policy.eviction=flop_aware",
        "+policy.tuning.enabled=true",
    ],
    "eviction": ["+policy=gdsf"],
    "with the paper's terms": [*MARCONI, "policy.eviction.memory=path"],
}


@pytest.mark.parametrize("why", list(OBSTACLES))
def test_what_the_kernel_does_not_cover_runs_request_by_request(why):
    requests, step, engine = configured(["trace=lmsys", "model=marconi_7b", *OBSTACLES[why]])
    assert why in (kernel_refusal(step, engine, requests) or "")


def test_only_the_replay_engine_on_token_traces_runs_compiled():
    requests, step, timed = configured(
        ["trace=lmsys", "model=marconi_7b", *MARCONI, "engine=timed"]
    )
    assert isinstance(timed, TimedEngine)
    assert "compiled_radix" not in routes.engine_routes(timed)
    assert routes.choose(routes.Case(step, timed, requests, compiled=True)).taken == "timed_world"
    hashed = [
        Request(0, 0, 0, 0.0, np.array([5], np.int32), np.zeros(0, np.int32), 0, block_size=512)
    ]
    assert "a hash-id trace" in (kernel_refusal(step, ReplayEngine(), hashed) or "")


def test_auto_compiles_runs_that_would_take_the_request_step_long_enough(monkeypatch):
    """Half a second of the request step's work: a tuned run serves its requests once more per
    grid alpha (in windows), a fine-grained admission chains a node a block."""
    requests, fixed, _ = configured(["trace=lmsys", "model=marconi_7b", *MARCONI])
    _, tuned, _ = configured(["trace=lmsys", "model=marconi_7b", "+policy=marconi"])
    _, fine, _ = configured(["trace=lmsys", "model=marconi_7b", "+policy=vllm_plus"])
    n, tokens = len(requests), sum(r.full_sequence().shape[0] for r in requests)
    assert radix_kernel.step_seconds(requests, fixed) == pytest.approx(n * 60e-6)
    assert radix_kernel.step_seconds(requests, tuned) == pytest.approx(12 * n * 60e-6)
    blocks = tokens / 32 * 2e-6
    assert radix_kernel.step_seconds(requests, fine) == pytest.approx(n * 60e-6 + blocks)
    monkeypatch.setattr(radix_kernel, "COMPILED_MIN_SECONDS", 2 * n * 60e-6)
    assert radix_kernel.use_compiled("auto", requests, tuned)
    assert not radix_kernel.use_compiled("auto", requests, fixed)
    assert radix_kernel.use_compiled(True, requests, fixed)
    assert not radix_kernel.use_compiled(False, requests, tuned)
    monkeypatch.setattr(radix_kernel, "available", lambda: False)
    assert not radix_kernel.use_compiled("auto", requests, tuned)
