"""One walk of a trace over whole blocks, and what a block pool does per request.

A block pool (vLLM's, ``policies.production.VLLM`` / ``BlockPool``: one tree node per full
block, only full blocks cached) sees a request as its block path. :func:`block_paths` gives every
request's path as node ids of one block trie (a node: a block under its parent, the block hash
chain), once for a whole run. :func:`serve_blocks` is the cache's arithmetic for one request on
a pool holding a prefix-closed set of blocks: the match, the hit rule, how many blocks
evict-until-fits frees, truncation and admission. Which blocks go is the eviction policy's:
stack distances for an LRU (:mod:`simlab.fastpaths.stack`), a heap for FIFO and Belady
(:mod:`simlab.fastpaths.blocks.heap`); :mod:`simlab.fastpaths.blocks.replay` says which runs qualify.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from simlab.cache.keys import BlockKeys, shared_prefix
from traces.format import Request


@dataclass
class Paths:
    """What one walk of the trace learns of each request, capacity- and policy-independent
    (request ``i`` of the run).

    ``nodes[i]``: its block path (input + output full blocks, root first) as block-trie node
    ids ``1..n_nodes`` (a node: a block under its parent, i.e. the block hash chain);
    ``parent[node]``: the node above it (0: the root); ``cacheable``: its full blocks (the path's
    length); ``lookup_full``: full blocks of its input (a prefix of the path); ``lookup_len``: ids
    it is matched with (a partial tail block included); ``sequence``: ids the running request
    holds (a partial tail block included)."""

    nodes: list[list[int]] = field(default_factory=list)
    parent: list[int] = field(default_factory=lambda: [0])
    cacheable: list[int] = field(default_factory=list)
    lookup_full: list[int] = field(default_factory=list)
    lookup_len: list[int] = field(default_factory=list)
    sequence: list[int] = field(default_factory=list)

    @property
    def n_nodes(self) -> int:
        return len(self.parent) - 1


def block_paths(requests: Sequence[Request], keys: BlockKeys) -> Paths:
    """The one walk: each request's block path as trie node ids (:class:`Paths`). A request
    takes the nodes of the leading blocks it shares with its session's previous request (a
    node is its path's block ids, so equal leading ids are equal nodes) and walks the trie
    only below them (with ``keys.share_prefixes`` false it walks every block: the same paths,
    ``tests/test_block_walk.py``)."""
    trie: dict[tuple[int, int], int] = {}
    out = Paths()
    parents = out.parent
    latest: dict[int, tuple[np.ndarray, list[int]]] = {}  # session -> its last ids and path
    for req in requests:
        view = keys.view(req)
        ids = view.sequence[: view.cacheable]
        path: list[int] = []
        previous = latest.get(req.session_id) if keys.share_prefixes else None
        if previous is not None:
            path = previous[1][: shared_prefix(ids, previous[0])]
        parent = path[-1] if path else 0
        for block in ids[len(path) :].tolist():
            node = trie.get((parent, block))
            if node is None:
                node = trie[(parent, block)] = len(parents)
                parents.append(parent)
            path.append(node)
            parent = node
        latest[req.session_id] = (ids, path)
        out.nodes.append(path)
        out.cacheable.append(view.cacheable)
        out.lookup_full.append(keys.input_blocks(req))
        out.lookup_len.append(int(view.lookup.shape[0]))
        out.sequence.append(int(view.sequence.shape[0]))
    return out


@dataclass
class CapacityColumns:
    """One capacity's per-request results, in block ids (what the records need)."""

    matched: list[int] = field(default_factory=list)
    hit: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    resident: list[int] = field(default_factory=list)


def serve_blocks(
    paths: Paths,
    i: int,
    on_path: int,
    resident: int,
    capacity: float,
    block_bytes: int,
    slack: int,
    out: CapacityColumns,
) -> int:
    """Request ``i`` on a cache holding ``resident`` blocks, ``on_path`` of them leading its
    block path: the cache's match, hit rule, evict-until-fits for the held sequence, truncation
    and admission, in block counts, with the cache's own float comparisons
    (:func:`simlab.cache.insertion.insert`), appended to ``out``. Returns the blocks resident
    after it (which blocks go is the policy's; how many is not)."""
    end = paths.cacheable[i]
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
    return resident


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
