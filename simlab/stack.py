"""One replay for many capacities: LRU stack distances over whole blocks (Mattson et al., 1970).

Which runs qualify (:func:`one_pass_obstacle`): the replay engine, a pure Transformer, a block
pool's keys (``policies.production.VLLM`` or ``BlockPool``: one tree node per block, only full
blocks cached, hybrids excluded) and an LRU whose insertion refreshes the path it walks
(``BlockLRU``, or ``LRU`` / ``RadixLRU`` with ``refreshes_insert_path``), leaves only, ties to the
oldest node, simlab's cache semantics or ``whole_input_hit`` alone; no host tier, no separate
SSM pool, no controllers. Everything else (hybrids, FLOP-aware or FIFO eviction, the reference
code's semantics, timed and cluster engines) runs back to back (:mod:`simlab.capacities`).

Why those runs have the inclusion property. A request ``t`` touches its block path ``P_t`` (the
full blocks of input + output, root first): the hit refreshes the hit path, the insertion
refreshes the matched path and creates the rest, all at clock ``t``. So a parent's
``last_access`` is never older than its child's, the blocks stamped ``s`` are one contiguous
chain of ``P_s``, and the leaf-only LRU (ties: oldest node) always evicts the block lowest in
one order over all blocks ever touched: older stamp first, within a stamp the deeper block first.
That order does not depend on the capacity, evictions take its bottom and insertions put
``P_t`` on its top, so at every capacity ``C`` the cache holds exactly the top ``K_C(t)`` blocks
(a truncated admission, which happens only once every unpinned block is gone, keeps the top of
``P_t``). A block path's ranks in the order increase with depth, so request ``t`` matches the
leading blocks of its path whose rank is below ``K_C``.

The pass. Ranks come from one walk over the requests: ``rank(b) = #(blocks last touched after
b's stamp s) + #(blocks of the request's path before b also stamped s)``, the first a Fenwick
tree over request stamps, the second read off the path (its stamps fall with depth). Each
capacity then needs only integer arithmetic per request: the match, the evictions the
insertion makes to hold the running request (``held_from``: its whole sequence past the hit,
partial tail block included), the truncation when even an empty cache (less the pinned matched
path) is too small, and the blocks admitted; ``K_C`` follows. The byte comparisons repeat the
cache's own float expressions (``need > capacity - kv_bytes``), so the records are the replay's
exactly (``tests/test_capacities.py`` compares them frame for frame).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from policies.base import Semantics
from simlab.engine import Engine
from simlab.keys import BlockKeys, key_scheme
from simlab.records import RECORD_COLUMNS
from simlab.replay import ReplayEngine
from simlab.step import RequestStep
from traces.format import Request

#: eviction classes whose hit refreshes (at least) the hit path and whose insertion refreshes
#: the matched path, leaves only (``policies.lru``, ``policies.production``)
_LRU_TARGETS = ("policies.lru.LRU", "policies.production.BlockLRU", "policies.production.RadixLRU")
#: admission classes keyed by whole blocks (one node per block)
_BLOCK_TARGETS = ("policies.production.VLLM", "policies.production.BlockPool")


def _qualname(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def one_pass_obstacle(step: RequestStep, engine: Engine) -> str | None:
    """Why ``step`` run by ``engine`` cannot be computed by :func:`stack_replay` (None: it
    can, with records identical to the replay's; see the module docstring)."""
    cache, eviction, admission = step.cache, step.eviction, step.admission
    checks = (
        (type(engine) is ReplayEngine, f"engine {engine.name} (only the replay engine)"),
        (not cache.hybrid, "a hybrid model (states make it no LRU over blocks)"),
        (_qualname(admission) in _BLOCK_TARGETS, f"admission {_qualname(admission)}"),
        (isinstance(step_keys(step), BlockKeys), "token keys (not whole blocks)"),
        (_qualname(eviction) in _LRU_TARGETS, f"eviction {_qualname(eviction)}"),
        (getattr(eviction, "refreshes_insert_path", False), "an insertion that refreshes nothing"),
        (eviction.ties == "oldest" and not eviction.evicts_inner_nodes, "eviction tie order"),
        (
            cache.semantics in (Semantics(), Semantics(whole_input_hit=True)),
            "the reference code's semantics",
        ),
        (cache.host is None and cache.ssm_capacity is None, "a host tier or SSM pool"),
        (not step.controllers and step.page_size == 1, "controllers or pages"),
    )
    for ok, why in checks:
        if not ok:
            return why
    return None


def step_keys(step: RequestStep) -> object:
    """A fresh key scheme of the step's admission (the ids its own scheme would give)."""
    return key_scheme(step.admission.keys)


class Fenwick:
    """Counts per request stamp ``1..n`` with prefix sums in O(log n) (a binary indexed tree)."""

    __slots__ = ("size", "tree")

    def __init__(self, n: int):
        self.size = n
        self.tree = [0] * (n + 1)

    def add(self, i: int, delta: int) -> None:
        tree, n = self.tree, self.size
        while i <= n:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of the counts at stamps ``1..i``."""
        tree, total = self.tree, 0
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total


@dataclass
class Paths:
    """What the pass learns of each request, capacity-independent (request ``i`` of the run).

    ``groups[i]``: ``(first path index, blocks, rank of the first)`` per run of equal stamps
    along the seen part of its block path (ranks rise by one within a run); ``cacheable``: its
    full blocks (input + output, the path); ``lookup_full``: full blocks of its input;
    ``lookup_len``: ids it is matched with (a partial tail block included); ``sequence``: ids
    the running request holds (a partial tail block included)."""

    groups: list[list[tuple[int, int, int]]] = field(default_factory=list)
    cacheable: list[int] = field(default_factory=list)
    lookup_full: list[int] = field(default_factory=list)
    lookup_len: list[int] = field(default_factory=list)
    sequence: list[int] = field(default_factory=list)


def block_paths(requests: Sequence[Request], keys: BlockKeys) -> Paths:
    """The one pass: each request's block path, and the rank of every seen block on it just
    before the request (module docstring)."""
    trie: dict[tuple[int, int], int] = {}
    last = np.full(1024, -1, dtype=np.int64)  # block -> stamp of its last touch
    stamps = Fenwick(len(requests))
    seen = 0  # blocks ever touched
    out = Paths()
    for t, req in enumerate(requests, start=1):
        view = keys.view(req)
        full = view.sequence[: view.cacheable].tolist()
        path, parent = [], 0
        for block in full:  # the node of each block: its parent's and its own id
            node = trie.get((parent, block))
            if node is None:
                node = trie[(parent, block)] = len(trie) + 1
            path.append(node)
            parent = node
        if parent >= last.shape[0]:
            last = np.concatenate((last, np.full(max(parent + 1, last.shape[0]), -1, np.int64)))
        ids = np.asarray(path, dtype=np.int64)
        prev = last[ids]
        n_seen = int(np.count_nonzero(prev >= 0))  # seen blocks lead the path
        groups = []
        if n_seen:
            cuts = (np.flatnonzero(prev[1:n_seen] != prev[: n_seen - 1]) + 1).tolist()
            starts, ends = [0, *cuts], [*cuts, n_seen]
            for a, b in zip(starts, ends, strict=True):
                stamp = int(prev[a])
                groups.append((a, b - a, seen - stamps.prefix(stamp)))
            for a, b in zip(starts, ends, strict=True):
                stamps.add(int(prev[a]), a - b)
        stamps.add(t, len(path))
        seen += len(path) - n_seen
        last[ids] = t
        out.groups.append(groups)
        out.cacheable.append(view.cacheable)
        out.lookup_full.append(req.input_len // keys.block_size)
        out.lookup_len.append(int(view.lookup.shape[0]))
        out.sequence.append(int(view.sequence.shape[0]))
    return out


def matched_blocks(groups: list[tuple[int, int, int]], resident: int) -> int:
    """Leading blocks of a path whose rank is below ``resident`` (the blocks in the cache)."""
    matched = 0
    for start, length, rank in groups:
        room = resident - rank
        if room <= 0:
            return matched
        if room < length:
            return start + room
        matched = start + length
    return matched


@dataclass
class CapacityColumns:
    """One capacity's per-request results, in block ids (what the records need)."""

    matched: list[int] = field(default_factory=list)
    hit: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    resident: list[int] = field(default_factory=list)


def replay_capacity(paths: Paths, capacity: float, block_bytes: int, slack: int) -> CapacityColumns:
    """Every request at one capacity from the pass's ranks: the cache's match, hit rule,
    evict-until-fits for the held sequence, truncation and admission, in block counts, with the
    cache's own float comparisons (:meth:`simlab.cache.PrefixCache._insert`)."""
    out = CapacityColumns()
    resident = 0
    for i, groups in enumerate(paths.groups):
        end = paths.cacheable[i]
        on_path = matched_blocks(groups, resident)  # the insertion's walk (input + output)
        matched = min(on_path, paths.lookup_full[i])  # the lookup (a partial block never hits)
        hit = min(matched, paths.lookup_len[i] - slack)
        need = max(max(0, end - on_path), paths.sequence[i] - hit) * block_bytes
        evicted = 0
        if need > capacity - resident * block_bytes:
            evicted = blocks_to_evict(need, capacity, resident, block_bytes, resident - on_path)
        resident -= evicted
        free = capacity - resident * block_bytes
        admitted = end - on_path
        truncated = need > free and not admitted * block_bytes <= free
        if truncated:
            admitted = min(admitted, int(free // block_bytes))
        admitted = max(0, admitted)
        resident += admitted
        out.matched.append(matched)
        out.hit.append(hit)
        out.admitted.append(admitted)
        out.evicted.append(evicted)
        out.truncated.append(truncated)
        out.resident.append(resident)
    return out


def blocks_to_evict(
    need: float, capacity: float, resident: int, block_bytes: int, candidates: int
) -> int:
    """Blocks the cache evicts, one at a time, while ``need > capacity - kv_bytes`` and an
    unpinned block is left (``candidates``)."""
    deficit = need - (capacity - resident * block_bytes)
    count = min(candidates, max(0, math.ceil(deficit / block_bytes)))
    while count > 0 and not need > capacity - (resident - count + 1) * block_bytes:
        count -= 1
    while count < candidates and need > capacity - (resident - count) * block_bytes:
        count += 1
    return count


@dataclass
class StackRun:
    """One capacity's records frame and its cache peaks (bytes)."""

    frame: pd.DataFrame
    peak_kv_bytes: int


def stack_replay(requests: Sequence[Request], steps: Sequence[RequestStep]) -> list[StackRun]:
    """The records the replay engine would give for each of ``steps`` (one policy's steps at
    several capacities, each passing :func:`one_pass_obstacle`), from one pass."""
    first = steps[0]
    keys = step_keys(first)
    assert isinstance(keys, BlockKeys)
    paths = block_paths(requests, keys)
    fixed = request_columns(requests, first)
    runs = []
    for step in steps:
        cache = step.cache
        slack = 0 if cache.semantics.whole_input_hit else 1
        cols = replay_capacity(paths, cache.capacity, cache.kv_per_token, slack)
        runs.append(capacity_run(step, fixed, cols, keys.block_size))
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
) -> StackRun:
    """One capacity's records frame, column for column as :func:`simlab.records.records_frame`
    makes it from the replay's records."""
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
        "policy": [step.policy] * n,
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
    frame = pd.DataFrame({name: columns[name] for name in RECORD_COLUMNS})
    return StackRun(frame, int(resident.max()) if n else 0)
