"""The children table: an open-addressing hash table (row 0 keys, row 1 values) from
``(parent slot, first token)`` to the child's slot, with tombstones for dropped entries."""

# mypy: ignore-errors
from __future__ import annotations

import numpy as np

from simlab.fastpaths.radix.jit.decorators import leaf, njit
from simlab.fastpaths.radix.jit.layout import (
    ALIVE,
    EMPTY,
    FILL,
    INTS,
    NODES,
    PARENT,
    REF,
    START,
    TABLE,
    TOKENS,
    TOMB,
    TOP,
)


@leaf
def _slot(key, mask):
    """Where ``key``'s probe starts (splitmix64's finalizer: every bit of the key moves the
    low bits)."""
    h = np.uint64(key)
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return np.int64(h & np.uint64(mask))


@leaf
def child_key(parent, token):
    return (np.int64(parent) << np.int64(32)) | np.int64(token)


@leaf
def probe(t, key):
    """Where ``key`` sits in the table, or -1."""
    mask = t.shape[1] - 1
    i = _slot(key, mask)
    while t[0, i] != EMPTY:
        if t[0, i] == key:
            return i
        i = (i + 1) & mask
    return -1


@leaf
def find(t, key):
    """The child slot under ``key``, or -1."""
    i = probe(t, key)
    return t[1, i] if i >= 0 else -1


@leaf
def put(t, ints, key, val):
    """Map ``key`` to ``val`` (replacing its value if present)."""
    mask = t.shape[1] - 1
    i = _slot(key, mask)
    spot = -1
    while t[0, i] != EMPTY:
        if t[0, i] == key:
            t[1, i] = val
            return
        if t[0, i] == TOMB and spot < 0:
            spot = i
        i = (i + 1) & mask
    if spot < 0:
        spot = i
        ints[FILL] += 1
    t[0, spot], t[1, spot] = key, val


@leaf
def drop(t, key):
    i = probe(t, key)
    if i >= 0:
        t[0, i] = TOMB


@leaf
def first_token(n, tokens, s):
    return tokens[n[REF, s] + n[START, s]]


@njit
def rehash(st):
    """The table afresh from the live nodes (it may be of another size than before)."""
    n, t, ints, tokens = st[NODES], st[TABLE], st[INTS], st[TOKENS]
    t[0, :] = EMPTY
    ints[FILL] = 0
    for s in range(1, ints[TOP]):
        if n[ALIVE, s]:
            put(t, ints, child_key(n[PARENT, s], first_token(n, tokens, s)), s)


@njit
def tidy(st):
    """:func:`rehash` once tombstones fill half of the table."""
    if 2 * st[INTS][FILL] > st[TABLE].shape[1]:
        rehash(st)
