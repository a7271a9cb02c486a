"""Matching: the walk of a sequence down the tree, the hit it gives, the eviction policy's
``on_hit``, and the states an admission plans (judicious or fine-grained)."""

# mypy: ignore-errors
from __future__ import annotations

from simlab.fastpaths.radix.jit.decorators import leaf, njit
from simlab.fastpaths.radix.jit.layout import (
    BLOCK,
    CHUNK,
    CKPT,
    END,
    EVICTION,
    FLOATS,
    HYBRID,
    INTS,
    KIDS,
    LAST,
    LRU,
    NODES,
    NOW,
    PAGE,
    REF,
    ROOT,
    ROUND_DOWN,
    SETTINGS,
    START,
    TABLE,
    TOKENS,
)
from simlab.fastpaths.radix.jit.table import child_key, find


@leaf
def common(tokens, a, b, span):
    """How many of ``span`` tokens from ``a`` and from ``b`` agree before the first mismatch:
    all of them when they are the same tokens (a session's sequences share its history), else
    compared in blocks of 16 without a branch, then token by token."""
    if a == b:
        return span
    k = 0
    while k + 16 <= span:
        diff = 0
        for j in range(16):
            diff |= tokens[a + k + j] ^ tokens[b + k + j]
        if diff:
            break
        k += 16
    while k < span and tokens[a + k] == tokens[b + k]:
        k += 1
    return k


@njit
def walk(st, off, size, path, depth, pos, partial):
    """``match.walk`` of ``tokens[off:off + size]``, going on from the walk of its first ``pos``
    tokens (``path[:depth]``, ``partial``; 0, 0, -1 for a fresh walk), which ended there at the
    end of its tokens: (nodes matched whole into ``path``, matched length, the node the match
    stops inside or -1)."""
    n, t, tokens = st[NODES], st[TABLE], st[TOKENS]
    node = path[depth - 1] if depth else ROOT
    if partial >= 0:  # the walk of the first pos tokens ran out inside this edge
        length = n[END, partial] - pos
        k = common(tokens, n[REF, partial] + pos, off + pos, min(length, size - pos))
        if k < length:
            return depth, pos + k, partial
        path[depth] = node = partial
        depth += 1
        pos += k
    while pos < size:
        c = find(t, child_key(node, tokens[off + pos]))
        if c < 0:
            return depth, pos, -1
        length = n[END, c] - n[START, c]
        k = common(tokens, n[REF, c] + n[START, c], off + pos, min(length, size - pos))
        if k < length:
            return depth, pos + k, c
        path[depth] = node = c
        depth += 1
        pos += length
    return depth, pos, -1


@njit
def lookup(st, path, depth, matched, partial, n_in):
    """``lookup``'s hit rule over the input's walk: (hit node or -1, hit length). A hybrid
    reuses the deepest state on the path; a Transformer any prefix, in whole pages; at most
    ``n_in - 1``."""
    n = st[NODES]
    limit = n_in - 1
    if st[INTS][HYBRID]:
        for j in range(depth - 1, -1, -1):
            s = path[j]
            if n[CKPT, s] and n[END, s] <= limit:
                return s, n[END, s]
        return -1, 0
    page = st[INTS][PAGE]
    hit = (min(matched, limit) // page) * page
    if hit <= 0:
        return -1, 0
    for j in range(depth):  # _node_covering
        if n[END, path[j]] >= hit:
            return path[j], hit
    return partial, hit


@njit
def on_hit(st, path, depth, hit_node):
    """The eviction policy's ``on_hit``: Marconi refreshes the hit node, LRU the whole path."""
    f, now = st[FLOATS], st[SETTINGS][NOW]
    if st[INTS][EVICTION] == LRU:
        for j in range(depth):
            f[LAST, path[j]] = now
    elif hit_node >= 0:
        f[LAST, hit_node] = now


@njit
def judicious(st, path, depth, matched, partial, size, ckpts):
    """``Judicious.plan`` (``Lookup.branch_point``, ``aligned``): the states to take, in
    ``ckpts``; returns how many (the branch point's, then the sequence's end)."""
    n, ints = st[NODES], st[INTS]
    branch = partial >= 0
    if not branch and depth:
        last = path[depth - 1]
        branch = n[KIDS, last] > 0 and not n[CKPT, last]
    count = 0
    if branch:
        chunk = ints[CHUNK]
        at = (matched // chunk) * chunk if ints[ROUND_DOWN] else matched
        if 0 < at < size:
            ckpts[0] = at
            count = 1
    ckpts[count] = size
    return count + 1


@njit
def fine_grained(st, size, ckpts):
    """``FineGrained.plan``: a state every block up to the sequence's last whole block, which
    is where its admission ends; returns (how many, the end)."""
    block = st[INTS][BLOCK]
    end = (size // block) * block
    count = end // block
    for k in range(count):
        ckpts[k] = (k + 1) * block
    return count, end
