"""The block pool's fast paths: their records.

A pure Transformer on a block pool, on the replay engine, with an LRU refreshing its insert path
(stack distances, every capacity in one pass: :mod:`simlab.fastpaths.stack`), FIFO or Belady (a heap over
block ids per capacity: :mod:`simlab.fastpaths.blocks.heap`), gives the same records as the
request-by-request replay from one walk of the trace (:mod:`simlab.fastpaths.blocks.walk`), shared by every
capacity of a ``cache.size_gb`` list. Which runs take them is the route table's choice
(:mod:`simlab.run.routes`: ``stack_distances``, ``block_heap``); ``cache.one_pass=false``
replays request by request.
FIFO's and Belady's heaps run compiled (:mod:`simlab.fastpaths.blocks.kernel`, numba) per
``cache.compiled`` (:func:`use_compiled`), with the same columns.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simlab.cache.contract import EvictionPolicy
from simlab.cache.keys import BlockKeys, key_scheme
from simlab.engines.records import RECORD_COLUMNS, Columns
from simlab.engines.step import RequestStep
from simlab.fastpaths.blocks import kernel as block_kernel
from simlab.fastpaths.blocks.heap import BELADY, FIFO, heap_replay, input_passes
from simlab.fastpaths.blocks.walk import CapacityColumns, Paths, block_paths
from simlab.fastpaths.stack import lru_ranks, replay_capacity
from simlab.util.numba_import import available
from traces.format import Request

LRU = "lru"
#: ``cache.compiled=auto`` compiles FIFO's and Belady's heaps from this many block visits (path
#: blocks x capacities) on: loading numba and its cached kernel takes 0.29-0.31 s on a 2-core
#: machine, the pure-Python heap about 1 us per visit, the kernel 0.03-0.07 us; at 0.97 M visits
#: both take as long (README, "Compiled heaps")
COMPILED_MIN_VISITS = 2_000_000

log = logging.getLogger(__name__)


def heap_order(eviction: EvictionPolicy) -> str:
    """How a run routed to the block paths (:mod:`simlab.run.routes`) evicts: ``lru`` (a
    recency order: stack distances), ``fifo`` or ``belady`` (a heap over block ids)."""
    return {"fifo": FIFO, "next_use": BELADY}.get(eviction.order, LRU)


def step_keys(step: RequestStep) -> object:
    """A fresh key scheme of the step's admission (the ids its own scheme would give)."""
    return key_scheme(step.admission.keys)


@dataclass
class BlockRun:
    """One capacity's records, its cache peaks (bytes) and whether its heap ran compiled."""

    records: Columns
    peak_kv_bytes: int
    compiled: bool = False


#: what several runs (policies, capacities) of one request list share, keyed by what each
#: depends on: its walks by :func:`walk_scheme` (:class:`simlab.fastpaths.blocks.walk.Paths`; block ids
#: depend on content alone), and the compiled radix replay's token pool under
#: :data:`simlab.fastpaths.radix.kernel.POOL`
Walks = dict[object, Any]


def walk_scheme(keys: BlockKeys, requests: Sequence[Request]) -> tuple[int, bool, bool]:
    """What a walk of ``requests`` depends on in ``keys``: the block size, whether the last
    output token is dropped (only token traces have one to drop: :func:`simlab.cache.keys.sequence_ids`)
    and whether a prompt's partial last id counts as a whole one."""
    trims = keys.committed and any(r.block_size == 1 for r in requests)
    return keys.block_size, trims, keys.whole_last_id


def use_compiled(compiled: bool | str, paths: Paths, capacities: int, heap_runs: int = 1) -> bool:
    """Whether FIFO's and Belady's heaps run compiled: ``cache.compiled`` true, or auto with
    numba installed and at least :data:`COMPILED_MIN_VISITS` block visits to make in the
    ``heap_runs`` heap policies of the run (they share one load of numba), or with the kernel
    loaded already (its load is paid)."""
    if compiled == "auto":
        if block_kernel.loaded():
            return True
        visits = sum(map(len, paths.nodes)) * capacities * heap_runs
        return visits >= COMPILED_MIN_VISITS and available()
    return compiled is True


def block_replay(
    requests: Sequence[Request],
    steps: Sequence[RequestStep],
    walks: Walks | None = None,
    compiled: bool | str = "auto",
    heap_runs: int = 1,
) -> list[BlockRun]:
    """The records the replay engine would give for each of ``steps`` (one policy's steps at
    several capacities, each routed to the block paths), from one walk of the trace
    (taken from, or added to, ``walks`` of these ``requests``): an LRU's capacities from one
    stack-distance pass, FIFO's and Belady's each from a heap, compiled per ``compiled``
    (``cache.compiled``: :func:`use_compiled`, ``heap_runs``: the run's heap policies)."""
    first = steps[0]
    keys = step_keys(first)
    assert isinstance(keys, BlockKeys)
    order = heap_order(first.eviction)
    walks = {} if walks is None else walks
    scheme = walk_scheme(keys, requests)
    paths = walks.get(scheme)
    if not isinstance(paths, Paths):
        paths = walks[scheme] = block_paths(requests, keys)
    ranks = lru_ranks(paths) if order == LRU else None
    passes = input_passes(paths) if order == BELADY else None
    flat = None
    if ranks is None and use_compiled(compiled, paths, len(steps), heap_runs):
        log.info("%s: the heap compiled (cache.compiled=%s)", first.policy, compiled)
        flat = block_kernel.FlatPaths(paths, passes)
    fixed = request_columns(requests, first)
    runs = []
    for step in steps:
        cache = step.cache
        slack = 0 if cache.semantics.whole_input_hit else 1
        args = (cache.capacity, cache.kv_per_token, slack)
        if ranks is not None:
            cols = replay_capacity(paths, ranks, *args)
        elif flat is not None:
            cols = block_kernel.compiled_heap_replay(flat, *args)
        else:
            cols = heap_replay(paths, *args, passes)
        run = capacity_run(step, fixed, cols, keys.block_size)
        run.compiled = flat is not None
        runs.append(run)
    return runs


def request_columns(requests: Sequence[Request], step: RequestStep) -> dict[str, np.ndarray]:
    """The record columns no capacity changes."""
    model = step.cache.model
    inputs = np.fromiter((r.input_tokens for r in requests), np.int64, len(requests))
    return {
        "request_id": np.fromiter((r.request_id for r in requests), np.int64, len(requests)),
        "session_id": np.fromiter((r.session_id for r in requests), np.int64, len(requests)),
        "turn": np.fromiter((r.turn for r in requests), np.int64, len(requests)),
        "arrival": np.fromiter((r.arrival for r in requests), np.float64, len(requests)),
        "input_tokens": inputs,
        "output_tokens": np.fromiter((r.output_len for r in requests), np.int64, len(requests)),
        "prefill_flops": np.array([model.prefill_flops(0, int(n)) for n in inputs.tolist()]),
        "unit_tokens": np.fromiter((r.block_size for r in requests), np.int64, len(requests)),
    }


def capacity_run(
    step: RequestStep, fixed: dict[str, np.ndarray], cols: CapacityColumns, ids_per_key: int
) -> BlockRun:
    """One capacity's records, column for column as :func:`simlab.engines.records.record_columns`
    makes them from the replay's records."""
    n = len(cols.hit)
    model, block_bytes = step.cache.model, step.cache.kv_per_token

    def tokens(blocks: list[int]) -> np.ndarray:  # Request.hit_tokens, vectorised
        units = np.asarray(blocks, dtype=np.int64) * ids_per_key
        return np.minimum(units * fixed["unit_tokens"], fixed["input_tokens"])

    hit = tokens(cols.hit)
    saved = [model.prefill_flops(0, h) if h else 0.0 for h in hit.tolist()]
    nan = np.full(n, math.nan)
    zeros = np.zeros(n, dtype=np.int64)
    resident = np.asarray(cols.resident, dtype=np.int64) * block_bytes
    columns = {
        "policy": np.full(n, step.policy, dtype=object),
        "request_id": fixed["request_id"],
        "session_id": fixed["session_id"],
        "turn": fixed["turn"],
        "arrival": fixed["arrival"],
        "input_tokens": fixed["input_tokens"],
        "output_tokens": fixed["output_tokens"],
        "matched_tokens": tokens(cols.matched),
        "hit_tokens": hit,
        "prefill_flops": fixed["prefill_flops"],
        "flops_saved": np.asarray(saved, dtype=np.float64),
        "kv_bytes_admitted": np.asarray(cols.admitted, dtype=np.int64) * block_bytes,
        "ssm_bytes_admitted": zeros,
        "ckpts_admitted": zeros.copy(),
        "bytes_evicted": np.asarray(cols.evicted, dtype=np.int64) * block_bytes,
        "nodes_evicted": np.asarray(cols.evicted, dtype=np.int64),
        "admission_truncated": np.asarray(cols.truncated, dtype=bool),
        "cache_kv_bytes": resident,
        "cache_ssm_bytes": zeros.copy(),
    }
    for name in RECORD_COLUMNS:  # the rest are the timed engine's columns: NaN in replay
        columns.setdefault(name, nan.copy())
    records = {name: columns[name] for name in RECORD_COLUMNS}
    return BlockRun(records, int(resident.max()) if n else 0)
