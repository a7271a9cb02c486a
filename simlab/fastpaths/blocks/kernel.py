"""FIFO and Belady over whole blocks, compiled: :func:`simlab.fastpaths.blocks.heap.heap_replay` as one
numba kernel over flat integer arrays, with the same columns request for request.

numba is an optional extra (``pip install simlab[fast]``); :func:`available` says whether it
imports, and without it the pure-Python heap runs (``cache.compiled``: :mod:`simlab.fastpaths.blocks.replay`).
The kernel is that module's :class:`~simlab.fastpaths.blocks.heap.LeafHeap` and
:func:`~simlab.fastpaths.blocks.walk.serve_blocks` line for line, with two changes that give the same
results:

* the heap of entries ``(key, nid, node)`` is a binary heap over three integer arrays compared
  lexicographically: a pop returns the lowest entry, as ``heapq``'s does (equal entries are equal
  tuples, so which copy goes first cannot matter);
* a node's next use (Belady's key) is read with a per-node cursor into its ascending uses instead
  of a bisection: the request index only grows during a replay, so the cursor only moves forward.

The float arithmetic is the cache's (IEEE doubles, Python's floor division), and every integer
stays below 2**53 (bytes of at most a few million blocks), where int-to-float comparisons are
exact as Python's are. ``tests/test_block_kernel.py`` checks the columns against the
pure-Python heap on real traces and random block tries, both policies, capacities that evict
and truncate and an infinite one.
"""

from __future__ import annotations

import sys

import numpy as np

from simlab.fastpaths.blocks.walk import CapacityColumns, Paths


def loaded() -> bool:
    """Whether this process has loaded the kernel already (numba's import is paid)."""
    return "simlab.fastpaths.blocks.kernel_jit" in sys.modules


def flat(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``lists`` as CSR arrays: offsets (``len(lists) + 1``) and the concatenated values."""
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    values = np.fromiter((v for x in lists for v in x), np.int64, int(offsets[-1]))
    return offsets, values


class FlatPaths:
    """A walk's :class:`Paths` (and Belady's passes) as the kernel's arrays, made once per walk."""

    def __init__(self, paths: Paths, passes: list[list[int]] | None):
        self.path_offsets, self.path_nodes = flat(paths.nodes)
        self.parent = np.asarray(paths.parent, dtype=np.int64)
        self.cacheable = np.asarray(paths.cacheable, dtype=np.int64)
        self.lookup_full = np.asarray(paths.lookup_full, dtype=np.int64)
        self.lookup_len = np.asarray(paths.lookup_len, dtype=np.int64)
        self.sequence = np.asarray(paths.sequence, dtype=np.int64)
        self.belady = passes is not None
        if passes is None:
            passes = [[] for _ in paths.parent]
        self.pass_offsets, self.pass_positions = flat(passes)


def compiled_heap_replay(
    flat_paths: FlatPaths, capacity: float, block_bytes: int, slack: int
) -> CapacityColumns:
    """:func:`simlab.fastpaths.blocks.heap.heap_replay` on ``flat_paths``, compiled (numba must import)."""
    from simlab.fastpaths.blocks.kernel_jit import replay

    n = flat_paths.cacheable.shape[0]
    counts = [np.zeros(n, dtype=np.int64) for _ in range(5)]  # matched .. resident
    out = (*counts, np.zeros(n, dtype=np.bool_))  # and truncated
    walk = (
        flat_paths.path_offsets,
        flat_paths.path_nodes,
        flat_paths.parent,
        flat_paths.cacheable,
        flat_paths.lookup_full,
        flat_paths.lookup_len,
        flat_paths.sequence,
    )
    args = (float(capacity), int(block_bytes), int(slack), flat_paths.belady)
    replay(walk, *args, flat_paths.pass_offsets, flat_paths.pass_positions, out)
    matched, hit, admitted, evicted, resident, truncated = (column.tolist() for column in out)
    return CapacityColumns(matched, hit, admitted, evicted, truncated, resident)
