"""Eviction: Marconi's rescoring (``FlopAware``) and LRU's heap, node by node until there
is room."""

# mypy: ignore-errors
from __future__ import annotations

import numpy as np

from simlab.fastpaths.radix.jit.decorators import leaf, njit
from simlab.fastpaths.radix.jit.heap import sift_down, sift_up, swap
from simlab.fastpaths.radix.jit.layout import (
    ALIVE,
    ALPHA,
    CAPACITY,
    CKPT,
    CKPT_BYTES,
    END,
    EVICTION,
    FLOATS,
    INTS,
    KID_SUM,
    KIDS,
    KV,
    KV_PER_TOKEN,
    LAST,
    LRU,
    NID,
    NODES,
    NOW,
    PARENT,
    PINS,
    R_EVICTED,
    R_FREED,
    ROOT,
    SAVED,
    SETTINGS,
    SIZE,
    SSM,
    START,
    TOP,
)
from simlab.fastpaths.radix.jit.nodes import numbers, release, relink
from simlab.fastpaths.radix.jit.table import child_key, drop, first_token, tidy


@njit
def free_bytes(st):
    ints = st[INTS]
    return st[SETTINGS][CAPACITY] - ints[KV] - ints[SSM]


@leaf
def evict_node(n, f, t, ints, p, free, tokens, s):
    """``PrefixCache.evict_node`` (over ``st``'s arrays): delete a leaf, or merge a one-child node into
    its child (its KV moves down); returns the bytes freed."""
    parent = n[PARENT, s]
    ckpt_freed = ints[CKPT_BYTES] if n[CKPT, s] else 0
    ints[SSM] -= ckpt_freed
    if n[KIDS, s] == 0:  # _drop_leaf
        drop(t, child_key(parent, first_token(n, tokens, s)))
        n[KIDS, parent] -= 1
        n[KID_SUM, parent] -= s
        kv = (n[END, s] - n[START, s]) * ints[KV_PER_TOKEN]
        ints[KV] -= kv
        release(n, f, ints, free, s)
        return kv + ckpt_freed
    c = n[KID_SUM, s]
    drop(t, child_key(s, first_token(n, tokens, c)))
    n[START, c] = n[START, s]
    f[LAST, c] = max(f[LAST, c], f[LAST, s])
    relink(n, t, ints, tokens, parent, s, c)
    numbers(n, f, ints, p, c)
    release(n, f, ints, free, s)
    return ckpt_freed


@njit
def unit(value, lo, hi):
    """``min_max`` of one value."""
    return 1.0 if hi == lo else (value - lo) / (hi - lo)


@njit
def flop_aware_ranges(n, f, top, now):
    """Min and max of the recency and of the FLOPs saved per byte over Marconi's candidates
    (unpinned nodes with at most one child), and how many there are."""
    r_lo, r_hi, e_lo, e_hi = np.inf, -np.inf, np.inf, -np.inf
    count = 0
    for s in range(1, top):
        if n[ALIVE, s] and n[PINS, s] == 0 and n[KIDS, s] <= 1:
            count += 1
            r = 1.0 / (1.0 + (now - f[LAST, s]))
            e = f[SAVED, s] / f[SIZE, s]
            r_lo, r_hi = min(r_lo, r), max(r_hi, r)
            e_lo, e_hi = min(e_lo, e), max(e_hi, e)
    return count, r_lo, r_hi, e_lo, e_hi


@njit
def next_victim(st):
    """``next_victim``: the lowest-scored candidate (ties: the oldest node), -1 if none.
    Marconi's utility (``FlopAware.scores``) over unpinned nodes with at most one child:
    recency ``1 / (1 + age)`` plus alpha times the FLOPs saved per byte, both min-max
    normalised over the candidates (recency alone at alpha 0); LRU: the last access, over
    unpinned leaves."""
    n, f, ints, p = st[NODES], st[FLOATS], st[INTS], st[SETTINGS]
    now, alpha, top = p[NOW], p[ALPHA], ints[TOP]
    lru = ints[EVICTION] == LRU
    most = 0 if lru else 1
    r_lo = r_hi = e_lo = e_hi = 0.0
    if not lru:
        count, r_lo, r_hi, e_lo, e_hi = flop_aware_ranges(n, f, top, now)
        if count == 0:
            return -1
    best, best_score = -1, 0.0
    for s in range(1, top):
        if not (n[ALIVE, s] and n[PINS, s] == 0 and n[KIDS, s] <= most):
            continue
        if lru:
            score = f[LAST, s]
        elif alpha == 0.0:
            score = 1.0 / (1.0 + (now - f[LAST, s]))
        else:
            r = 1.0 / (1.0 + (now - f[LAST, s]))
            e = f[SAVED, s] / f[SIZE, s]
            score = unit(r, r_lo, r_hi) + alpha * unit(e, e_lo, e_hi)
        if best < 0 or score < best_score or (score == best_score and n[NID, s] < n[NID, best]):
            best, best_score = s, score
    return best


@njit
def evict(st, need, result):
    """``evict``: the lowest-scored candidates until ``need`` bytes are free or none is left
    (Marconi's re-scored after every eviction, ``_evict_rescoring``; LRU's from a heap)."""
    if st[INTS][EVICTION] == LRU:
        evict_lru(st, need, result)
    else:
        n, f, t, ints, p, free, tokens = st
        while need > p[CAPACITY] - ints[KV] - ints[SSM]:  # free_bytes
            victim = next_victim(st)
            if victim < 0:
                break
            result[R_FREED] += evict_node(n, f, t, ints, p, free, tokens, victim)
            result[R_EVICTED] += 1
    tidy(st)  # an eviction adds no entry to the table: its drops leave tombstones


@njit
def evict_lru(st, need, result):
    """``_evict_heap`` for LRU: the unpinned leaves of the moment in a heap by (last access,
    node id), the lowest evicted until ``need`` bytes are free; a parent left a leaf joins it
    (the scores do not change during an eviction, so this is ``_evict_up``'s order)."""
    n, f, t, ints, p, free, tokens = st
    top = ints[TOP]
    keys, nids, slots = np.empty(top, np.float64), np.empty(top, np.int64), np.empty(top, np.int64)
    size = 0
    for s in range(1, top):
        if n[ALIVE, s] and n[PINS, s] == 0 and n[KIDS, s] == 0:
            keys[size], nids[size], slots[size] = f[LAST, s], n[NID, s], s
            size += 1
    for at in range(size // 2 - 1, -1, -1):
        sift_down(keys, nids, slots, at, size)
    while size and need > p[CAPACITY] - ints[KV] - ints[SSM]:  # free_bytes
        s = slots[0]
        size -= 1
        swap(keys, nids, slots, 0, size)
        sift_down(keys, nids, slots, 0, size)
        up = n[PARENT, s]
        result[R_FREED] += evict_node(n, f, t, ints, p, free, tokens, s)
        result[R_EVICTED] += 1
        if up != ROOT and n[KIDS, up] == 0 and n[PINS, up] == 0:
            keys[size], nids[size], slots[size] = f[LAST, up], n[NID, up], up
            size += 1
            sift_up(keys, nids, slots, size - 1)
