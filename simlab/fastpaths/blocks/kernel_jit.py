"""The compiled kernel of :mod:`simlab.fastpaths.blocks.kernel`: :func:`replay`, numba-compiled on first use
and cached beside this file (``cache=True``), so later processes load it. It imports numba:
import this module only when numba is installed and the compiled path is asked for.

Each helper is :class:`simlab.fastpaths.blocks.heap.LeafHeap`'s or :mod:`simlab.fastpaths.blocks.walk`'s function of
the same name, over flat arrays (inlined into :func:`replay`). ``Heap``: the entries' keys,
creation ids and nodes (three arrays, an entry compared as the tuple ``(key, nid, node)``).
``Pool``: per node ``resident``, ``kids``, ``nid``, ``key``, ``pinned`` and, for Belady, the
``cursor`` into its uses and their ``end``.
"""

# mypy: ignore-errors
from __future__ import annotations

import numpy as np

from simlab.util.numba_import import import_numba

numba = import_numba()

njit = numba.njit(cache=True, nogil=True)
inline = numba.njit(inline="always")


@inline
def below(heap, a, b):
    """Entry ``a`` is lower than entry ``b``."""
    keys, nids, nodes = heap
    if keys[a] != keys[b]:
        return keys[a] < keys[b]
    if nids[a] != nids[b]:
        return nids[a] < nids[b]
    return nodes[a] < nodes[b]


@inline
def swap(heap, a, b):
    for column in heap:
        column[a], column[b] = column[b], column[a]


@inline
def push(heap, size, key, nid, node):
    """Add the entry ``(key, nid, node)``; returns the new size."""
    keys, nids, nodes = heap
    at = size
    keys[at], nids[at], nodes[at] = key, nid, node
    while at:
        up = (at - 1) >> 1
        if not below(heap, at, up):
            break
        swap(heap, at, up)
        at = up
    return size + 1


@inline
def pop(heap, size):
    """Move the lowest entry to slot ``size - 1`` (read it there); returns the new size."""
    if size == 0:
        raise RuntimeError("block heap kernel: no eviction candidate left")
    last = size - 1
    swap(heap, 0, last)
    at = 0
    while True:
        child = 2 * at + 1
        if child >= last:
            break
        if child + 1 < last and below(heap, child + 1, child):
            child += 1
        if not below(heap, child, at):
            break
        swap(heap, at, child)
        at = child
    return last


@inline
def below_top(heap, size, key, nid, node):
    """The entry would be lower than the heap's top (or the heap is empty)."""
    keys, nids, nodes = heap
    if size == 0:
        return True
    if key != keys[0]:
        return key < keys[0]
    if nid != nids[0]:
        return nid < nids[0]
    return node < nodes[0]


@inline
def key_after(pool, belady, uses, never, node, i):
    """0 (FIFO: no uses), or minus the first use after request ``i`` (Belady); ``i`` only grows
    during a replay, so the node's cursor only moves forward."""
    cursor, end = pool[5], pool[6]
    if not belady:
        return 0
    at = cursor[node]
    while at < end[node] and uses[at] <= i:
        at += 1
    cursor[node] = at
    return -(uses[at] if at < end[node] else never)


@inline
def blocks_to_evict(need, capacity, resident, block_bytes, candidates):
    deficit = need - (capacity - resident * block_bytes)
    count = min(candidates, max(0, int(np.ceil(deficit / block_bytes))))
    while count > 0 and not need > capacity - (resident - count + 1) * block_bytes:
        count -= 1
    while count < candidates and need > capacity - (resident - count) * block_bytes:
        count += 1
    return count


@inline
def serve_blocks(walk, i, on_path, held, capacity, block_bytes, slack, out):
    """Request ``i``'s match, hit, eviction count, truncation and admission, written to
    ``out``; returns the blocks resident after it."""
    cacheable, lookup_full, lookup_len, sequence = walk[3], walk[4], walk[5], walk[6]
    end = cacheable[i]
    matched = min(on_path, lookup_full[i])
    hit = min(matched, lookup_len[i] - slack)
    need = max(max(0, end - on_path), sequence[i] - hit) * block_bytes
    evicted = 0
    if need > capacity - held * block_bytes:
        evicted = blocks_to_evict(need, capacity, held, block_bytes, held - on_path)
    held -= evicted
    free = capacity - held * block_bytes
    admitted = end - on_path
    truncated = need > free and not admitted * block_bytes <= free
    if truncated:
        admitted = min(admitted, int(free // block_bytes))
    admitted = max(0, admitted)
    held += admitted
    matched_out, hit_out, admitted_out, evicted_out, resident_out, truncated_out = out
    matched_out[i], hit_out[i], admitted_out[i] = matched, hit, admitted
    evicted_out[i], resident_out[i], truncated_out[i] = evicted, held, truncated
    return held


@inline
def evict(pool, heap, size, parent, belady, uses, never, path, on_path, count, i):
    """Request ``i`` evicts ``count`` leaves, lowest entry first, its matched path pinned;
    returns the heap's size."""
    resident, kids, nid, key, pinned = pool[0], pool[1], pool[2], pool[3], pool[4]
    for j in range(on_path):
        pinned[path[j]] = i
    while count:
        size = pop(heap, size)
        k, n_id, node = heap[0][size], heap[1][size], heap[2][size]
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
            k = key[up] = key_after(pool, belady, uses, never, up, i)
            if count and below_top(heap, size, k, nid[up], up):
                node = up
                continue
            size = push(heap, size, k, nid[up], up)
            break
    return size


@inline
def enter(pool, heap, size, belady, uses, never, node, i):
    """Push ``node`` with its key after request ``i``; returns the heap's size."""
    k = pool[3][node] = key_after(pool, belady, uses, never, node, i)
    return push(heap, size, k, pool[2][node], node)


@inline
def admit(pool, heap, size, created, belady, uses, never, path, on_path, admitted, i):
    """Request ``i`` admits ``path[on_path : on_path + admitted]``; returns the heap's size and
    the creation count."""
    resident, kids, nid = pool[0], pool[1], pool[2]
    if not admitted:
        if on_path and not kids[path[on_path - 1]]:
            size = enter(pool, heap, size, belady, uses, never, path[on_path - 1], i)
        return size, created
    if on_path:
        kids[path[on_path - 1]] += 1
    last = on_path + admitted - 1
    for j in range(on_path, last + 1):
        node = path[j]
        resident[node] = 1
        created += 1
        nid[node] = created
        kids[node] = 1 if j < last else 0
    return enter(pool, heap, size, belady, uses, never, path[last], i), created


@njit
def replay(walk, capacity, block_bytes, slack, belady, pass_offsets, uses, out):
    """Every request at one capacity (``heap_replay``). ``walk``: path offsets and nodes (CSR),
    parent, cacheable, lookup_full, lookup_len and sequence per request; ``belady``: Belady's
    keys (else FIFO's); ``pass_offsets`` / ``uses``: per node the requests whose input passes
    it (CSR; empty for FIFO);
    ``out``: matched, hit, admitted, evicted, resident and truncated per request."""
    path_offsets, path_nodes, parent = walk[0], walk[1], walk[2]
    n_requests, size = path_offsets.shape[0] - 1, parent.shape[0]
    pool = (
        np.zeros(size, dtype=np.uint8),  # resident
        np.zeros(size, dtype=np.int64),  # kids
        np.zeros(size, dtype=np.int64),  # nid
        np.zeros(size, dtype=np.int64),  # key
        np.full(size, -1, dtype=np.int64),  # pinned
        pass_offsets[:-1].copy(),  # cursor
        pass_offsets[1:],  # end
    )
    # a push per request and at most one per evicted block (at most one per admitted one)
    room = n_requests + path_nodes.shape[0] + 1
    heap = (np.zeros(room, np.int64), np.zeros(room, np.int64), np.zeros(room, np.int64))
    entries = created = held = 0
    for i in range(n_requests):
        path = path_nodes[path_offsets[i] : path_offsets[i + 1]]
        on_path = 0
        while on_path < path.shape[0] and pool[0][path[on_path]]:
            on_path += 1
        held = serve_blocks(walk, i, on_path, held, capacity, block_bytes, slack, out)
        evicted, admitted = out[3][i], out[2][i]
        if evicted:
            entries = evict(
                pool, heap, entries, parent, belady, uses, n_requests, path, on_path, evicted, i
            )
        entries, created = admit(
            pool, heap, entries, created, belady, uses, n_requests, path, on_path, admitted, i
        )
