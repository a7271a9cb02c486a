"""FIFO and Belady over whole blocks, compiled (simlab/fastpaths/blocks/kernel.py, numba).

The oracle is the pure-Python heap (simlab/fastpaths/blocks/heap.py), itself checked against the
request-by-request replay (tests/test_block_heap.py): the kernel must give its columns request
for request, on the walks of real trace slices (Mooncake hash ids, ShareGPT tokens in 16-token
blocks) at capacities that evict and truncate and an infinite one, and on random tries
(hypothesis). A run with ``cache.compiled=true`` writes what one with ``false`` writes."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simlab.config import ConfigError
from simlab.fastpaths.blocks import kernel as block_kernel
from simlab.fastpaths.blocks import replay as block_replay
from simlab.fastpaths.blocks.heap import heap_replay, input_passes
from simlab.fastpaths.blocks.walk import Paths, block_paths
from simlab.run.simulate import plan_run, policy_step, trace_requests
from simlab.util import numba_import
from tests.fixtures import compose
from tests.test_block_heap import BELADY, FIFO, MOONCAKE_BLOCKS, SHAREGPT_BLOCKS, WHOLE
from tests.test_capacities import MOONCAKE, results, run_list, without_timing

pytest.importorskip("numba", reason="the compiled path needs numba (pip install simlab[fast])")

COLUMNS = [f.name for f in dataclasses.fields(block_replay.CapacityColumns)]


def walk_of(overrides: list[str]) -> tuple[Paths, int, int, bool]:
    """The block walk of a configured run, its block bytes, hit slack and eviction order."""
    cfg = compose(overrides)
    plan = plan_run(cfg)
    _, requests = trace_requests(plan.trace, plan.settings)
    (spec,) = plan.policies.values()
    step = policy_step(spec, plan.model, plan.settings, requests[0].block_size)
    keys = block_replay.step_keys(step)
    slack = 0 if step.cache.semantics.whole_input_hit else 1
    belady = block_replay.heap_order(step.eviction) == "belady"
    return block_paths(requests, keys), step.cache.kv_per_token, slack, belady


def assert_kernel_equals_heap(paths: Paths, capacities, block_bytes: int, slack: int, belady: bool):
    passes = input_passes(paths) if belady else None
    flat = block_kernel.FlatPaths(paths, passes)
    for capacity in capacities:
        want = heap_replay(paths, capacity, block_bytes, slack, passes)
        got = block_kernel.compiled_heap_replay(flat, capacity, block_bytes, slack)
        for column in COLUMNS:
            assert getattr(got, column) == getattr(want, column), (capacity, column)


TRACE_CASES = {
    "mooncake, FIFO, whole-input hits": ([*FIFO, *MOONCAKE_BLOCKS, *WHOLE], "trace.limit=1000"),
    "mooncake, Belady, vLLM's hit rule": ([*BELADY, *MOONCAKE_BLOCKS], "trace.limit=1000"),
    "sharegpt, FIFO, 16-token blocks": ([*FIFO, *SHAREGPT_BLOCKS, "policy.block_size=16"], None),
    "sharegpt, Belady, 16-token blocks": (
        [*BELADY, *SHAREGPT_BLOCKS, "policy.block_size=16"],
        None,
    ),
}


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_the_kernel_gives_the_heaps_columns_on_real_traces(case):
    base, limit = TRACE_CASES[case]
    if "trace=mooncake" in base and not MOONCAKE.is_file():
        pytest.skip(f"no trace at {MOONCAKE}")
    paths, block_bytes, slack, belady = walk_of([*base, *([limit] if limit else [])])
    blocks = sum(map(len, paths.nodes))
    # from a few blocks (truncating) to all of them, and an infinite cache
    capacities = [block_bytes * n + 0.5 for n in (3, blocks // 50, blocks // 5, blocks)]
    assert_kernel_equals_heap(paths, [*capacities, float("inf")], block_bytes, slack, belady)


@st.composite
def random_walks(draw):
    """Requests walking a random block trie: each extends the path of a random earlier request
    (or starts afresh) with new blocks; inputs end at or inside the path, with or without a
    partial last id, and the running sequence covers the input."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    paths = Paths()
    for _ in range(draw(st.integers(1, 60))):
        base = rng.choice(paths.nodes) if paths.nodes and rng.random() < 0.8 else []
        path = base[: rng.randint(0, len(base))]
        for _ in range(rng.randint(0 if path else 1, 6)):
            paths.parent.append(path[-1] if path else 0)
            path.append(len(paths.parent) - 1)
        full = rng.randint(0, len(path))
        lookup = full + rng.randint(0, 1)
        paths.nodes.append(path)
        paths.cacheable.append(len(path))
        paths.lookup_full.append(full)
        paths.lookup_len.append(max(lookup, 1))
        paths.sequence.append(max(len(path), lookup, 1) + rng.randint(0, 1))
    return paths


@settings(max_examples=150, deadline=None)
@given(
    paths=random_walks(), blocks=st.integers(1, 40), slack=st.integers(0, 1), belady=st.booleans()
)
def test_the_kernel_gives_the_heaps_columns_on_random_tries(paths, blocks, slack, belady):
    block_bytes = 1000
    capacities = [blocks * block_bytes + 0.25, blocks * block_bytes, float("inf")]
    assert_kernel_equals_heap(paths, capacities, block_bytes, slack, belady)


def test_a_compiled_run_writes_what_the_pure_python_heap_writes(tmp_path, caplog):
    if not MOONCAKE.is_file():
        pytest.skip(f"no trace at {MOONCAKE}")
    base = [*BELADY, *MOONCAKE_BLOCKS, "trace.limit=400"]
    caplog.set_level("INFO", logger="simlab.fastpaths.blocks.replay")
    compiled = run_list(base, ["0.5", "5"], tmp_path / "compiled", "cache.compiled=true")
    assert "the heap compiled (cache.compiled=True)" in caplog.text
    caplog.clear()
    python = run_list(base, ["0.5", "5"], tmp_path / "python", "cache.compiled=false")
    assert "the heap compiled" not in caplog.text
    assert [p.replay for p in compiled.points] == [p.replay for p in python.points]
    for a, b in zip(compiled.points, python.points, strict=True):
        got, want = results(a.out_dir), results(b.out_dir)
        assert got[0].equals(want[0]) and got[1].equals(want[1])
        assert without_timing(got[2]) == without_timing(want[2])


def test_auto_compiles_only_walks_large_enough_to_repay_numba(monkeypatch):
    paths = Paths(nodes=[[1, 2], [1, 3]], parent=[0, 0, 1, 1])  # 4 block visits per capacity
    monkeypatch.setattr(block_replay, "COMPILED_MIN_VISITS", 8)
    monkeypatch.setattr(block_kernel, "loaded", lambda: False)
    assert not block_replay.use_compiled("auto", paths, 1)
    assert block_replay.use_compiled("auto", paths, 2)
    assert block_replay.use_compiled("auto", paths, 1, heap_runs=2)  # they share one load
    assert block_replay.use_compiled(True, paths, 1)
    assert not block_replay.use_compiled(False, paths, 2)
    monkeypatch.setattr(block_kernel, "loaded", lambda: True)  # paid for: any walk
    assert block_replay.use_compiled("auto", paths, 1)
    assert not block_replay.use_compiled(False, paths, 1)
    monkeypatch.setattr(block_kernel, "loaded", lambda: False)
    monkeypatch.setattr(block_replay, "available", lambda: False)  # no numba
    assert not block_replay.use_compiled("auto", paths, 2, heap_runs=2)


def test_a_capacity_list_counts_its_heap_policies_for_the_numba_load(tmp_path, monkeypatch):
    """FIFO and Belady beside an LRU (``bench/peers.py``'s compare set): both heaps are counted
    (the LRU's stack distances are not), whichever policy asks first."""
    from bench.peers import compare_overrides

    if not MOONCAKE.is_file():
        pytest.skip(f"no trace at {MOONCAKE}")
    asked = []
    decide = block_replay.use_compiled
    monkeypatch.setattr(block_replay, "use_compiled", lambda *a: asked.append(a[3]) or decide(*a))
    trace = [o for o in MOONCAKE_BLOCKS if not o.startswith("policy.")]
    compare = compare_overrides(["fifo", "lru", "optimal"])
    # the list's own heaps: no reuse breakdown, whose infinite-cache replays ask again
    run_list([*trace, *compare, "reuse_breakdown=false"], ["0.3", "20"], tmp_path)
    assert asked == [2, 2]


@pytest.mark.parametrize("value", ["maybe", "1", "0"])
def test_a_bad_compiled_setting_is_an_error_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"cache\.compiled: must be auto, true or false"):
        plan_run(compose(["+policy=vllm", f"cache.compiled={value}"]))


def test_compiled_true_without_numba_is_an_error_naming_the_extra(monkeypatch):
    monkeypatch.setattr(numba_import, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"cache\.compiled=true: numba is not installed"):
        plan_run(compose(["+policy=vllm", "cache.compiled=true"]))
