"""FIFO and Belady over whole blocks at one capacity, on the block ids of one walk of the trace.

Neither has the inclusion property that gives an LRU every capacity in one pass
(:mod:`simlab.fastpaths.stack`; FIFO shows Belady's anomaly), but on a block pool both are a heap of
leaves with integer keys, so each capacity replays on the walk's node ids (:class:`Paths`)
instead of a prefix tree, with records identical to the request-by-request replay
(``tests/test_block_heap.py`` compares them frame for frame).

Which runs qualify: the route table's ``block_heap`` (:mod:`simlab.run.routes`): the block
pools of ``stack_distances`` with an eviction of order ``fifo`` (``policies.fifo.FIFO``) or
``next_use`` (``policies.clairvoyant.Clairvoyant`` on whole ids: a block's first id).

Why the keys are exact. The cache evicts the lowest-scored unpinned leaf, ties to the oldest
node (smallest creation id, ``nid``); a block pool's tree is one node per block and only ever
grows by one chain per request, so:

* FIFO scores a node by its birth, the clock of the request that admitted it; births never fall
  as creation ids rise, so (birth, nid) orders like nid alone.
* Belady scores a Transformer leaf by ``-next use``: the first later request (position after the
  current one) whose input passes the block and goes on for at least one id; never again is
  ``-inf``, one-child nodes ``+inf`` (never chosen while a leaf is, and an unpinned node always
  has an unpinned leaf below it). Two leaves are never on one input's path, so finite scores
  never tie; the ``-inf`` ones tie to the oldest node.

A node's next use changes only when a request passes it, and a resident node that a request
passes is on that request's matched path: pinned while it evicts, and pushed again afterwards
with its new key if it is a leaf (or, if not, when it next becomes one). So every unpinned
resident leaf has an up-to-date entry; older entries (another key, nid or a node that is gone,
has children or is pinned) are skipped when popped.

How many blocks each request evicts, truncates and admits does not depend on the policy
(:func:`simlab.fastpaths.blocks.walk.serve_blocks`); only which blocks go does.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right

from simlab.fastpaths.blocks.walk import CapacityColumns, Paths, serve_blocks

FIFO = "fifo"
BELADY = "belady"


def input_passes(paths: Paths) -> list[list[int]]:
    """Per node, the positions (ascending) of the requests whose input passes it: those whose
    lookup holds its block path and at least one more id (``policies.clairvoyant``: a hit never
    covers a whole input, so a block ending an input is no use to it)."""
    passes: list[list[int]] = [[] for _ in range(paths.n_nodes + 1)]
    for i, path in enumerate(paths.nodes):
        for node in path[: min(paths.lookup_full[i], paths.lookup_len[i] - 1)]:
            passes[node].append(i)
    return passes


class LeafHeap:
    """The resident blocks of one capacity (a prefix-closed set of block-trie nodes) and a heap
    of entries ``(key, nid, node)`` holding an up-to-date one for every unpinned resident leaf
    (module docstring). Keys: 0 (FIFO: ties to the oldest node) or ``-next use`` (Belady)."""

    def __init__(self, paths: Paths, passes: list[list[int]] | None):
        size = paths.n_nodes + 1
        self.parent = paths.parent
        self.passes = passes
        self.never = len(paths.nodes)  # a next use after every request
        self.resident = bytearray(size)
        self.kids = [0] * size
        self.nid = [0] * size  # creation id of the node's current incarnation
        self.key = [0] * size  # the key of the node's newest entry
        self.pinned = [-1] * size  # the request whose eviction pins it
        self.heap: list[tuple[int, int, int]] = []
        self.created = 0

    def resident_prefix(self, path: list[int]) -> int:
        """Leading blocks of ``path`` in the cache (the insertion's matched path)."""
        resident, n, end = self.resident, 0, len(path)
        while n < end and resident[path[n]]:
            n += 1
        return n

    def key_after(self, node: int, i: int) -> int:
        """``node``'s key during or after request ``i``: 0 (FIFO) or ``-next use`` (Belady)."""
        if self.passes is None:
            return 0
        uses = self.passes[node]
        at = bisect_right(uses, i)
        return -(uses[at] if at < len(uses) else self.never)

    def enter(self, node: int, i: int) -> None:
        """Push ``node`` (a resident leaf) with its key during or after request ``i``."""
        k = self.key[node] = self.key_after(node, i)
        heapq.heappush(self.heap, (k, self.nid[node], node))

    def evict(self, path: list[int], on_path: int, count: int, i: int) -> None:
        """Request ``i`` evicts ``count`` leaves, lowest entry first, its matched path
        (``path[:on_path]``) pinned; a parent left without children becomes a candidate, and
        goes at once when its entry is below the heap's top (the pop would return it next)."""
        pinned, key, nid = self.pinned, self.key, self.nid
        resident, kids, parent = self.resident, self.kids, self.parent
        for node in path[:on_path]:
            pinned[node] = i
        heap, pop, push = self.heap, heapq.heappop, heapq.heappush
        while count:
            k, n_id, node = pop(heap)
            if key[node] != k or nid[node] != n_id or not resident[node] or kids[node]:
                continue  # an older entry
            if pinned[node] == i:
                continue  # pushed again after the request if still a leaf
            while True:  # ``node`` goes, then maybe its chain of ancestors
                resident[node] = 0
                count -= 1
                up = parent[node]
                if not up:
                    break
                kids[up] -= 1
                if kids[up] or pinned[up] == i:
                    break
                k = key[up] = self.key_after(up, i)
                entry = (k, nid[up], up)
                if count and (not heap or entry < heap[0]):
                    node = up
                    continue
                push(heap, entry)
                break

    def admit(self, path: list[int], on_path: int, admitted: int, i: int) -> None:
        """Request ``i`` admits ``path[on_path : on_path + admitted]`` below its matched path;
        the path's deepest resident block, a leaf, gets an entry with its key after ``i``."""
        if not admitted:
            if on_path and not self.kids[path[on_path - 1]]:
                self.enter(path[on_path - 1], i)  # a new next use, or popped while pinned
            return
        kids, resident, nid = self.kids, self.resident, self.nid
        if on_path:
            kids[path[on_path - 1]] += 1
        last = on_path + admitted - 1
        for j in range(on_path, last + 1):
            node = path[j]
            resident[node] = 1
            self.created += 1
            nid[node] = self.created
            kids[node] = 1 if j < last else 0
        self.enter(path[last], i)


def heap_replay(
    paths: Paths,
    capacity: float,
    block_bytes: int,
    slack: int,
    passes: list[list[int]] | None = None,
) -> CapacityColumns:
    """Every request at one capacity under FIFO (``passes`` None) or Belady (``passes``:
    :func:`input_passes`) over whole blocks (module docstring)."""
    pool = LeafHeap(paths, passes)
    held = 0  # resident blocks
    out = CapacityColumns()
    for i, path in enumerate(paths.nodes):
        on_path = pool.resident_prefix(path)
        held = serve_blocks(paths, i, on_path, held, capacity, block_bytes, slack, out)
        if out.evicted[-1]:
            pool.evict(path, on_path, out.evicted[-1], i)
        pool.admit(path, on_path, out.admitted[-1], i)
    return out
