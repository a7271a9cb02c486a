"""FIFO and Belady over whole blocks on block ids (simlab/fastpaths/blocks/heap.py).

The oracle is simlab's own request-by-request replay (``cache.one_pass=false``: the prefix tree,
the evictor, ``policies.fifo`` and ``policies.clairvoyant``): every capacity of a list, and a
scalar run, must give its records, occupancy and summary exactly, on real trace slices (Mooncake
hash ids of 512 tokens, ShareGPT tokens in 16- and 32-token blocks with partial tail blocks), at
capacities that evict and truncate and an infinite one, under vLLM's hit rule and under
whole-input hits."""

from __future__ import annotations

import pytest

from simlab.fastpaths.blocks import replay as block_replay
from simlab.fastpaths.blocks.heap import LeafHeap, input_passes
from simlab.fastpaths.blocks.walk import Paths
from simlab.run.capacities import point_dir_name
from tests.test_capacities import (
    MOONCAKE,
    QUIET,
    assert_point_equals_scalar,
    results,
    run_list,
    run_scalar,
)

MOONCAKE_BLOCKS = [
    "trace=mooncake",
    "trace.limit=300",
    "model=llama3_8b",
    "policy.block_size=512",
    "arrivals.mode=timestamps",
    *QUIET,
]
SHAREGPT_BLOCKS = ["trace=sharegpt", "trace.limit=60", "model=llama3_8b", *QUIET]
FIFO = ["+policy=vllm", "eviction@policy.eviction=fifo"]
BELADY = ["+policy=clairvoyant_blocks"]
WHOLE = ["+policy.semantics.whole_input_hit=true"]

CASES = {
    "mooncake, FIFO, whole-input hits (kvcache-simulator's fifo)": (
        [*FIFO, *MOONCAKE_BLOCKS, *WHOLE],
        ["0.3", "2", "20", "inf"],
    ),
    "mooncake, FIFO, vLLM's hit rule": ([*FIFO, *MOONCAKE_BLOCKS], ["0.3", "20"]),
    "mooncake, Belady, whole-input hits (kvcache-simulator's optimal)": (
        [*BELADY, *MOONCAKE_BLOCKS, *WHOLE],
        ["0.3", "2", "20", "inf"],
    ),
    "mooncake, Belady, vLLM's hit rule": ([*BELADY, *MOONCAKE_BLOCKS], ["0.3", "20"]),
    "sharegpt, FIFO, 16-token blocks": (
        [*FIFO, *SHAREGPT_BLOCKS, "policy.block_size=16"],
        ["0.003", "0.02", "inf"],
    ),
    "sharegpt, Belady, 16-token blocks": (
        [*BELADY, *SHAREGPT_BLOCKS, "policy.block_size=16"],
        ["0.003", "0.02", "inf"],
    ),
    "sharegpt, Belady, 32-token blocks, whole-input hits": (
        [*BELADY, *SHAREGPT_BLOCKS, "policy.block_size=32", *WHOLE],
        ["0.003", "0.02"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_block_heap_records_equal_the_request_by_request_replay(case, tmp_path):
    base, sizes = CASES[case]
    if "trace=mooncake" in base and not MOONCAKE.is_file():
        pytest.skip(f"no trace at {MOONCAKE}")
    run = run_list(base, sizes, tmp_path / "list")
    assert all(set(p.replay.values()) == {"block_heap"} for p in run.points)  # not a fallback
    evicted = truncated = 0
    for size in sizes:
        point = tmp_path / "list" / point_dir_name(float(size))
        records = assert_point_equals_scalar(base, size, point, tmp_path / f"scalar_{size}")
        evicted += int(records["nodes_evicted"].sum())
        truncated += int(records["admission_truncated"].sum())
    assert evicted > 0 and truncated > 0  # the small capacities evict and truncate


def test_policies_sharing_one_walk_equal_their_replays(tmp_path, monkeypatch):
    """kvcache-simulator's three policies as one run's ``compare`` set (``bench/peers.py``):
    FIFO, the LRU and Belady share one walk of the trace (Belady's block pool keeps the last
    output token and vLLM's drops it, which a hash-id trace does not have), and each gives its
    replay's records."""
    from bench.peers import compare_overrides

    if not MOONCAKE.is_file():
        pytest.skip(f"no trace at {MOONCAKE}")
    walks = []
    walk = block_replay.block_paths
    monkeypatch.setattr(block_replay, "block_paths", lambda *a: walks.append(1) or walk(*a))
    trace = [o for o in MOONCAKE_BLOCKS if not o.startswith("policy.")]
    # the list's own walk: no reuse breakdown, whose infinite-cache replays walk again
    base = [*trace, *compare_overrides(["fifo", "lru", "optimal"]), "reuse_breakdown=false"]
    sizes = ["0.3", "20"]
    run = run_list(base, sizes, tmp_path / "list")
    assert len(walks) == 1
    replays = [p.replay for p in run.points]
    assert replays == [{"fifo": "block_heap", "lru": "one_pass", "optimal": "block_heap"}] * 2
    for size in sizes:
        point = tmp_path / "list" / point_dir_name(float(size))
        records = assert_point_equals_scalar(base, size, point, tmp_path / f"scalar_{size}")
        assert set(records["policy"]) == {"fifo", "lru", "optimal"}
    run_scalar(base, "0.3", tmp_path / "one_run")  # a scalar run's policies share it too
    assert results(tmp_path / "one_run")[0].equals(results(tmp_path / "scalar_0.3")[0])


#: two LRUs over whole blocks whose walks of a hash-id trace differ: ``b`` takes a prompt's
#: partial last id for a whole block (kvcache-simulator's rule), ``a`` never caches it (vLLM's)
LAST_ID_PAIR = [
    "~policy@compare.vllm_plus",
    "~policy@compare.sglang_plus",
    "~policy@compare.marconi",
    "+policy@compare.a=vllm",
    "+policy@compare.b=vllm",
    "compare.a.name=a",
    "compare.b.name=b",
    "compare.a.block_size=512",
    "compare.b.block_size=512",
    "compare.b.admission.whole_last_id=true",
]


def test_policies_keyed_differently_do_not_share_a_walk(tmp_path):
    """A walk is shared only by policies that key the trace the same way: two LRUs of one run
    differing in ``whole_last_id`` each give their own replay's records (they once shared the
    first one's walk, and ``b`` got ``a``'s admissions)."""
    if not MOONCAKE.is_file():
        pytest.skip(f"no trace at {MOONCAKE}")
    trace = [o for o in MOONCAKE_BLOCKS if not o.startswith("policy.")]
    base = [*trace, *LAST_ID_PAIR]
    run = run_list(base, ["2"], tmp_path / "list")
    assert run.points[0].replay == {"a": "one_pass", "b": "one_pass"}
    point = tmp_path / "list" / point_dir_name(2.0)
    records = assert_point_equals_scalar(base, "2", point, tmp_path / "scalar")
    admitted = records.groupby("policy")["kv_bytes_admitted"].sum()
    assert admitted["b"] > admitted["a"]  # the partial last ids, cached whole


@pytest.mark.parametrize("policy", [FIFO, BELADY], ids=["fifo", "belady"])
def test_a_scalar_run_takes_the_block_heap(policy, tmp_path, caplog):
    base = [*policy, *SHAREGPT_BLOCKS, "policy.block_size=16", "cache.compiled=false"]
    caplog.set_level("INFO", logger="simlab.run.policy")
    run_scalar(base, "0.01", tmp_path / "heap")
    assert "route block_heap" in caplog.text
    caplog.clear()
    run_scalar(base, "0.01", tmp_path / "replay", "cache.one_pass=false")
    assert "route request_step" in caplog.text and "route block_heap" not in caplog.text
    (route,) = results(tmp_path / "replay")[2]["routes"].values()
    assert route["refused"]["block_heap"] == "cache.one_pass=false"
    got, want = results(tmp_path / "heap"), results(tmp_path / "replay")
    assert got[0].equals(want[0]) and got[1].equals(want[1])
    assert got[0]["nodes_evicted"].sum() > 0


# ------------------------------------------------------------------------ the heap by hand
def tiny_paths(nodes: list[list[int]]) -> Paths:
    """Branches ``1-b`` under one shared block 1 (nodes ``2..``); each request's input is its
    whole path plus a partial tail id."""
    n = len(nodes)
    return Paths(
        nodes=nodes,
        parent=[0, 0] + [1] * (max(max(p) for p in nodes) - 1),
        cacheable=[2] * n,
        lookup_full=[2] * n,
        lookup_len=[3] * n,
        sequence=[3] * n,
    )


def test_passes_need_one_more_id():
    paths = tiny_paths([[1, 2], [1, 3], [1, 2], [1, 3]])
    assert input_passes(paths) == [[], [0, 1, 2, 3], [0, 2], [1, 3]]
    paths.lookup_len = [2, 2, 2, 2]  # an input ending on a block: no hit can use that block
    assert input_passes(paths) == [[], [0, 1, 2, 3], [], []]


@pytest.mark.parametrize(("belady", "gone"), [(False, 2), (True, 3)])
def test_fifo_evicts_the_oldest_leaf_belady_the_one_used_last(belady, gone):
    """Leaves 2 (admitted first, used again at 3) and 3 (used again at 4); request 2 brings
    block 4 and evicts one leaf, with block 1 pinned."""
    paths = tiny_paths([[1, 2], [1, 3], [1, 4], [1, 2], [1, 3]])
    heap = LeafHeap(paths, input_passes(paths) if belady else None)
    heap.admit([1, 2], 0, 2, 0)
    heap.admit([1, 3], 1, 1, 1)
    heap.evict([1, 4], 1, 1, 2)
    heap.admit([1, 4], 1, 1, 2)
    assert [n for n in (2, 3, 4) if not heap.resident[n]] == [gone]
    assert heap.kids[1] == 2 and heap.resident[1]
