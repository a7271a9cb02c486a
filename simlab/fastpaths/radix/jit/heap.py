"""The binary heap of LRU's eviction: entries (last access, node id, slot) in three arrays."""

# mypy: ignore-errors
from __future__ import annotations

from simlab.fastpaths.radix.jit.decorators import leaf


@leaf
def below(keys, nids, a, b):
    """Entry ``a`` of the heap (last access, node id) is lower than entry ``b``."""
    return keys[a] < keys[b] or (keys[a] == keys[b] and nids[a] < nids[b])


@leaf
def swap(keys, nids, slots, a, b):
    keys[a], keys[b] = keys[b], keys[a]
    nids[a], nids[b] = nids[b], nids[a]
    slots[a], slots[b] = slots[b], slots[a]


@leaf
def sift_down(keys, nids, slots, at, size):
    while True:
        child = 2 * at + 1
        if child >= size:
            return
        if child + 1 < size and below(keys, nids, child + 1, child):
            child += 1
        if not below(keys, nids, child, at):
            return
        swap(keys, nids, slots, at, child)
        at = child


@leaf
def sift_up(keys, nids, slots, at):
    while at and below(keys, nids, at, (at - 1) >> 1):
        swap(keys, nids, slots, at, (at - 1) >> 1)
        at = (at - 1) >> 1
