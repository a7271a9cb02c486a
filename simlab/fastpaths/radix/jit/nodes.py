"""Node slots: a node's numbers (bytes, FLOPs saved), its creation, linking, release, split and
pins."""

# mypy: ignore-errors
from __future__ import annotations

from simlab.fastpaths.radix.jit.decorators import leaf, njit
from simlab.fastpaths.radix.jit.layout import (
    ALIVE,
    CKPT,
    CKPT_BYTES,
    END,
    FLOATS,
    FREE,
    INTS,
    KID_SUM,
    KIDS,
    KV_PER_TOKEN,
    LAST,
    LIN,
    NEXT_NID,
    NID,
    NODES,
    NOW,
    PARENT,
    PINS,
    PQ,
    QQ,
    REF,
    ROOT,
    SAVED,
    SETTINGS,
    SIZE,
    START,
    TOP,
    UNIT,
)
from simlab.fastpaths.radix.jit.table import child_key, first_token, put


@leaf
def prefill_flops(p, prefix, new):
    """:meth:`simlab.model.spec.ModelSpec.prefill_flops`, the same float operations."""
    return new * (p[LIN] + p[PQ] * prefix + p[QQ] * new)


@njit
def refresh(st, s):
    """``NodeTable.refresh``: a node's bytes and FLOPs saved beyond its parent."""
    numbers(st[NODES], st[FLOATS], st[INTS], st[SETTINGS], s)


@leaf
def numbers(n, f, ints, p, s):
    """:func:`refresh` over the arrays themselves (the per-node helpers take them so: each
    array taken out of ``st`` costs two atomic reference counts). Positions count ids of
    ``UNIT`` tokens (a hybrid's short last id counts whole, as the cache counts it)."""
    length, unit = n[END, s] - n[START, s], ints[UNIT]
    held = ints[CKPT_BYTES] if n[CKPT, s] else 0
    f[SIZE, s] = length * ints[KV_PER_TOKEN] + held
    f[SAVED, s] = prefill_flops(p, n[START, s] * unit, length * unit) if length else 0.0


@leaf
def new_node(n, f, ints, p, free, parent, a, b, ref, ckpt):
    """``_new_node``: a node spanning ``[a, b)`` of the sequence at ``ref``, created now, with
    no link to its parent yet."""
    ints[FREE] -= 1
    s = free[ints[FREE]]
    ints[TOP] = max(ints[TOP], s + 1)
    n[PARENT, s], n[START, s], n[END, s], n[REF, s] = parent, a, b, ref
    n[NID, s] = ints[NEXT_NID]
    ints[NEXT_NID] += 1
    n[PINS, s], n[KIDS, s], n[KID_SUM, s], n[CKPT, s], n[ALIVE, s] = 0, 0, 0, ckpt, 1
    f[LAST, s] = p[NOW]
    numbers(n, f, ints, p, s)
    return s


@leaf
def adopt(n, t, ints, tokens, parent, s):
    """``_attach`` of a new child ``s``."""
    put(t, ints, child_key(parent, first_token(n, tokens, s)), s)
    n[KIDS, parent] += 1
    n[KID_SUM, parent] += s


@leaf
def relink(n, t, ints, tokens, parent, old, new):
    """``_attach(parent, new)`` where ``new`` takes ``old``'s place under the same first token
    (a split's upper half, a merge's child)."""
    put(t, ints, child_key(parent, first_token(n, tokens, new)), new)
    n[PARENT, new] = parent
    n[KID_SUM, parent] += new - old


@leaf
def release(n, f, ints, free, s):
    n[ALIVE, s] = 0
    f[SIZE, s] = 0.0
    free[ints[FREE]] = s
    ints[FREE] += 1


@njit
def split(st, s, pos):
    """``NodeTable.split``: a new upper node ``[start, pos)`` adopts ``s`` as its only child."""
    n, f, t, ints, p, free, tokens = st
    parent = n[PARENT, s]
    upper = new_node(n, f, ints, p, free, parent, n[START, s], pos, n[REF, s], 0)
    n[START, s] = pos
    relink(n, t, ints, tokens, parent, s, upper)
    put(t, ints, child_key(upper, first_token(n, tokens, s)), s)
    n[PARENT, s] = upper
    n[KIDS, upper], n[KID_SUM, upper], n[PINS, upper] = 1, s, n[PINS, s]
    numbers(n, f, ints, p, s)
    numbers(n, f, ints, p, upper)
    return upper


@leaf
def pin(n, s, by):
    """``pin`` (``by`` 1) / ``unpin`` (-1): ``s`` (-1: none) and its ancestors, root excluded."""
    while s > ROOT:
        n[PINS, s] += by
        s = n[PARENT, s]
