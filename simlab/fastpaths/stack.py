"""One replay for many capacities: LRU stack distances over whole blocks (Mattson et al., 1970).

Which runs qualify (the route table's ``stack_distances``, :mod:`simlab.run.routes`): the replay
engine, a pure Transformer, a block pool's keys (an admission of kind ``blocks``: one tree node per
block, only full blocks cached, hybrids excluded) and a recency order whose insertion refreshes the
path it walks (``BlockLRU``, or ``LRU`` / ``RadixLRU`` with ``refreshes_insert_path``), leaves only, ties
to the oldest node, simlab's cache semantics or ``whole_input_hit`` alone; no host tier, no
separate SSM pool, no controllers. FIFO and Belady on the same pools replay each capacity on
block ids (:mod:`simlab.fastpaths.blocks.heap`); everything else (hybrids, FLOP-aware eviction, the
reference code's semantics, timed and cluster engines) runs back to back
(:mod:`simlab.run.capacities`).

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

The pass. Ranks come from the walk's block paths (:func:`simlab.fastpaths.blocks.walk.block_paths`):
``rank(b) = #(blocks last touched after b's stamp s) + #(blocks of the request's path before b
also stamped s)``, the first a Fenwick tree over request stamps, the second read off the path
(its stamps fall with depth). Each
capacity then needs only integer arithmetic per request (:func:`simlab.fastpaths.blocks.walk.serve_blocks`):
the match, the evictions the insertion makes to hold the running request (``held_from``: its
whole sequence past the hit, partial tail block included), the truncation when even an empty
cache (less the pinned matched path) is too small, and the blocks admitted; ``K_C`` follows. The
byte comparisons repeat the cache's own float expressions (``need > capacity - kv_bytes``), so
the records are the replay's exactly (``tests/test_capacities.py`` compares them frame for
frame).
"""

from __future__ import annotations

import numpy as np

from simlab.fastpaths.blocks.walk import CapacityColumns, Paths, serve_blocks


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


#: per request, ``(first path index, blocks, rank of the first)`` per run of equal stamps along
#: the seen part of its block path (ranks rise by one within a run)
Groups = list[list[tuple[int, int, int]]]


def lru_ranks(paths: Paths) -> Groups:
    """The rank of every seen block on each request's path just before the request (module
    docstring), from the block paths."""
    last = np.full(paths.n_nodes + 1, -1, dtype=np.int64)  # node -> stamp of its last touch
    stamps = Fenwick(len(paths.nodes))
    seen = 0  # blocks ever touched
    out: Groups = []
    for t, path in enumerate(paths.nodes, start=1):
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
        out.append(groups)
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


def replay_capacity(
    paths: Paths, ranks: Groups, capacity: float, block_bytes: int, slack: int
) -> CapacityColumns:
    """Every request at one capacity from the pass's ranks (the LRU's resident blocks are the
    top ``resident`` of the order): :func:`serve_blocks` per request."""
    out = CapacityColumns()
    resident = 0
    for i, groups in enumerate(ranks):
        on_path = matched_blocks(groups, resident)  # the insertion's walk (input + output)
        resident = serve_blocks(paths, i, on_path, resident, capacity, block_bytes, slack, out)
    return out
