"""The compiled kernel of :mod:`simlab.fastpaths.radix.kernel`: :func:`replay`, numba-compiled on first use
and cached beside this file (``cache=True``), so later processes load it. It imports numba:
import this module only when numba is installed and the compiled path is asked for.

Each function is the :class:`simlab.cache.prefix.PrefixCache` / :mod:`simlab.cache.evictor` method of the
same name (or the step it names), over a few flat arrays held in one tuple ``st``
(:data:`NODES` .. :data:`TOKENS`; few, because numba counts references to every array a function
takes out of a tuple, and those atomic counts cost more than the tree's work):

* ``NODES`` (int64, one column per node slot; the root is slot 0): ``PARENT``, ``START``,
  ``END``, ``REF`` (where in ``tokens`` a sequence through the node starts: ``tokens[ref + p]``
  is the token at position ``p`` of its path), ``NID``, ``PINS``, ``KIDS`` (children),
  ``KID_SUM`` (the sum of the children's slots: a one-child node's only child), ``CKPT`` and
  ``ALIVE`` (0 / 1);
* ``FLOATS`` (float64, per slot): ``LAST`` (last access), ``SIZE`` (``node_bytes``) and
  ``SAVED`` (``saved_flops``);
* ``TABLE``: the children, an open-addressing hash table (row 0 keys, row 1 values) from
  ``(parent slot, first token)`` to the child's slot;
* ``INTS`` (int64): the counters :data:`FREE` .. :data:`TOP` and the settings
  :data:`KV_PER_TOKEN` .. :data:`CHUNK`; ``SETTINGS`` (float64): :data:`NOW` .. :data:`QQ`;
  ``FREE_SLOTS``: the free slots (a stack); ``TOKENS``: every sequence's tokens.

Slots past ``TOP`` hold nothing (a copy leaves them uninitialised: a new node writes every
column), and no loop reads them.
"""

# mypy: ignore-errors
from __future__ import annotations

import numpy as np

from simlab.util.numba_import import import_numba

numba = import_numba()

njit = numba.njit(cache=True, nogil=True, error_model="numpy")
#: the per-node and per-edge helpers, inlined into their callers (numba's IR inlining): a call
#: that is not inlined counts references to the arrays it is passed
leaf = numba.njit(inline="always", error_model="numpy")

ROOT = 0
EMPTY = -1
TOMB = -2
# st
NODES, FLOATS, TABLE, INTS, SETTINGS, FREE_SLOTS, TOKENS = range(7)
# NODES rows
PARENT, START, END, REF, NID, PINS, KIDS, KID_SUM, CKPT, ALIVE = range(10)
# FLOATS rows
LAST, SIZE, SAVED = range(3)
# INTS: free slots, the next node id, KV bytes, SSM bytes, their peaks, table entries in use
# (tombstones too), slots ever used; then KV bytes per token, checkpoint bytes, hybrid, the
# eviction kind, round_down, the chunk
FREE, NEXT_NID, KV, SSM, PEAK_KV, PEAK_SSM, PEAK, FILL, TOP = range(9)
KV_PER_TOKEN, CKPT_BYTES, HYBRID, EVICTION, ROUND_DOWN, CHUNK = range(9, 15)
# ... the admission kind, a fine-grained admission's block, the page a Transformer's hit rounds
# down to
ADMISSION, BLOCK, PAGE = range(15, 18)
N_INTS = 18
# eviction kinds (radix_kernel.EVICTIONS)
FLOP_AWARE, LRU = 0, 1
# admission kinds (radix_kernel.ADMISSIONS)
JUDICIOUS, FINE_GRAINED = 0, 1
# why replay stopped: all served, after the first eviction, no room for the next request's nodes
DONE, EVICTED, ROOM = 0, 1, 2
# SETTINGS: the clock, capacity, alpha, the prefill FLOPs' coefficients (ModelSpec._lin, _attn_pq,
# _attn_qq)
NOW, CAPACITY, ALPHA, LIN, PQ, QQ = range(6)
# an admission's result (InsertResult): KV bytes, SSM bytes, states, bytes and nodes evicted,
# truncated
R_KV, R_SSM, R_CKPTS, R_FREED, R_EVICTED, R_TRUNCATED = range(6)


# ---------------------------------------------------------------------------- children table
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


# ---------------------------------------------------------------------------- nodes
@leaf
def prefill_flops(p, prefix, new):
    """:meth:`simlab.model.spec.ModelSpec.prefill_flops`, the same float operations."""
    return new * (p[LIN] + p[PQ] * prefix + p[QQ] * new)


@njit
def refresh(st, s):
    """``_refresh_numbers``: a node's bytes and FLOPs saved beyond its parent."""
    numbers(st[NODES], st[FLOATS], st[INTS], st[SETTINGS], s)


@leaf
def numbers(n, f, ints, p, s):
    """:func:`refresh` over the arrays themselves (the per-node helpers take them so: each
    array taken out of ``st`` costs two atomic reference counts)."""
    length = n[END, s] - n[START, s]
    held = ints[CKPT_BYTES] if n[CKPT, s] else 0
    f[SIZE, s] = length * ints[KV_PER_TOKEN] + held
    f[SAVED, s] = prefill_flops(p, n[START, s], length) if length else 0.0


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
    """``_split``: a new upper node ``[start, pos)`` adopts ``s`` as its only child."""
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


# ---------------------------------------------------------------------------- matching
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
    """``_walk`` of ``tokens[off:off + size]``, going on from the walk of its first ``pos``
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


# ---------------------------------------------------------------------------- eviction
@njit
def free_bytes(st):
    ints = st[INTS]
    return st[SETTINGS][CAPACITY] - ints[KV] - ints[SSM]


@leaf
def evict_node(n, f, t, ints, p, free, tokens, s):
    """``_evict_node`` (over ``st``'s arrays): delete a leaf, or merge a one-child node into
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


# ---------------------------------------------------------------------------- admission
@njit
def plan(st, path, depth, matched, end, wanted, n_wanted, out):
    """``plan_admission`` of ``wanted[:n_wanted]`` (sorted): the states on cached tokens not
    held yet (``out[:n_old]``), then those on the new tail; returns (n_old, n_new, plan end)."""
    if not st[INTS][HYBRID]:
        return 0, 0, end
    n = st[NODES]
    n_old = cached = j = 0
    while cached < n_wanted and wanted[cached] <= matched:
        c = wanted[cached]
        while j < depth and n[END, path[j]] < c:  # path ends and wanted ascend: one merge
            j += 1
        if not (j < depth and n[END, path[j]] == c and n[CKPT, path[j]]):
            out[n_old] = c
            n_old += 1
        cached += 1
    n_new = n_wanted - cached
    for k in range(n_new):
        out[n_old + k] = wanted[cached + k]
    return n_old, n_new, out[n_old + n_new - 1] if n_new else matched


@njit
def truncate(st, budget, matched, plan_end, ckpts, n_old, n_new):
    """``truncate`` (one budget): the longest prefix of the plan that fits ``budget``, the states
    kept moved to the front of ``ckpts``; returns (n_old, n_new, plan end)."""
    ints = st[INTS]
    kv, ckpt_bytes = ints[KV_PER_TOKEN], ints[CKPT_BYTES]
    old = 0
    while old < n_old and budget >= ckpt_bytes:
        budget -= ckpt_bytes
        old += 1
    if not ints[HYBRID]:
        return old, 0, min(plan_end, matched + np.int64(budget // kv))
    end = matched
    new = 0
    for k in range(n_old, n_old + n_new):
        cost = (ckpts[k] - end) * kv + ckpt_bytes
        if cost > budget:
            break
        budget -= cost
        end = ckpts[old + new] = ckpts[k]
        new += 1
    return old, new, end


@njit
def ending_at(st, along, n_along, pos, first):
    """``_node_ending_at``: the node on ``along[first:n_along]`` ending at ``pos``, split off
    an edge holding ``pos`` inside (and inserted into ``along``); returns (node, its index, new
    length). Positions asked for in ascending order are found from the last one's index."""
    n = st[NODES]
    for i in range(first, n_along):
        s = along[i]
        if n[END, s] == pos:
            return s, i, n_along
        if n[START, s] < pos < n[END, s]:
            upper = split(st, s, pos)
            for j in range(n_along, i, -1):
                along[j] = along[j - 1]
            along[i] = upper
            return upper, i, n_along + 1
    raise AssertionError("position not on the matched path")


@njit
def set_ckpt(st, s, result):
    """``_set_ckpt``: a state at the end of ``s``, admitted now."""
    n, ints = st[NODES], st[INTS]
    if n[CKPT, s]:
        return
    n[CKPT, s] = 1
    refresh(st, s)
    st[FLOATS][LAST, s] = st[SETTINGS][NOW]
    ints[SSM] += ints[CKPT_BYTES]
    result[R_SSM] += ints[CKPT_BYTES]
    result[R_CKPTS] += 1


@njit
def append_chain(st, top, off, a, b, ckpts, first, count):
    """``_append_chain``: ``[a, b)`` of the sequence at ``off`` under ``top``, as nodes cut after
    each of ``ckpts[first:first + count]`` (sorted, distinct, in ``(a, b]``; the node ending
    there holds it)."""
    n, f, t, ints, p, free, tokens = st
    pos = a
    k, last = first, first + count
    while pos < b:
        if k < last and ckpts[k] < b:  # a node ending at each state, then the rest
            stop, held = ckpts[k], 1
            k += 1
        else:
            stop, held = b, k < last and ckpts[k] == b
        s = new_node(n, f, ints, p, free, top, pos, stop, off, held)
        adopt(n, t, ints, tokens, top, s)
        top, pos = s, stop


@njit
def apply(st, path, depth, partial, along, off, matched, plan_end, ckpts, n_old, n_new, result):
    """``_apply``: the plan's states on cached tokens, then its new tail."""
    for j in range(depth):
        along[j] = path[j]
    n_along = depth
    if partial >= 0:
        along[n_along] = partial
        n_along += 1
    at = 0
    for k in range(n_old):
        s, at, n_along = ending_at(st, along, n_along, ckpts[k], at)
        set_ckpt(st, s, result)
    if plan_end <= matched:
        return
    top = ROOT
    if matched:
        top, at, n_along = ending_at(st, along, n_along, matched, at)
    append_chain(st, top, off, matched, plan_end, ckpts, n_old, n_new)
    ints = st[INTS]
    kv = ints[KV_PER_TOKEN] * (plan_end - matched)
    ssm = ints[CKPT_BYTES] * n_new
    ints[KV] += kv
    ints[SSM] += ssm
    result[R_KV] += kv
    result[R_SSM] += ssm
    result[R_CKPTS] += n_new


@njit
def make_room(st, path, depth, matched, partial, need, result):
    """``_insert``'s eviction: split the edge the match stops inside, so that only its matched
    part stays pinned (``_pin_matched_part``), then evict; returns (depth, partial, the
    deepest pinned node)."""
    deepest = partial
    if partial >= 0:
        n = st[NODES]
        pin(n, partial, -1)
        deepest = split(st, partial, matched)
        pin(n, deepest, 1)
        path[depth] = deepest
        depth += 1
    elif depth:
        deepest = path[depth - 1]
    evict(st, need, result)
    return depth, -1, deepest


@njit
def note_peaks(ints):
    ints[PEAK_KV] = max(ints[PEAK_KV], ints[KV])
    ints[PEAK_SSM] = max(ints[PEAK_SSM], ints[SSM])
    ints[PEAK] = max(ints[PEAK], ints[KV] + ints[SSM])


@njit
def cut_walk(st, path, depth, matched, partial, end):
    """A walk of ``end`` tokens from the walk of more of the same tokens that matched past
    them: the nodes up to ``end``, and the one holding it inside, if any."""
    n = st[NODES]
    if end <= 0:
        return 0, 0, -1
    for j in range(depth):
        s = path[j]
        if n[END, s] == end:
            return j + 1, end, -1
        if n[END, s] > end:
            return j, end, s
    return depth, end, partial


@njit
def admit(st, off, end, ckpts, n_ckpts, path, along, walked, planned, result):
    """``_insert`` of ``tokens[off:off + end]`` (the admission's end) with states at
    ``ckpts[:n_ckpts]`` (``planned``: the plan's room). ``walked``: the walk of the input,
    ``(input length, depth, matched, partial)`` in ``path``, with no change of the tree since:
    the admission's walk is the same, cut at ``end`` when it matched past it, and goes on from
    there when the input matched whole. ``result``: :data:`R_KV` .. :data:`R_TRUNCATED`."""
    n_in, depth, matched, partial = walked
    if matched > end:
        depth, matched, partial = cut_walk(st, path, depth, matched, partial, end)
    elif matched == n_in < end:
        depth, matched, partial = walk(st, off, end, path, depth, matched, partial)
    n_old, n_new, plan_end = plan(st, path, depth, matched, end, ckpts, n_ckpts, planned)
    deepest = partial if partial >= 0 else (path[depth - 1] if depth else -1)
    n, ints = st[NODES], st[INTS]
    pin(n, deepest, 1)
    need = max(0, plan_end - matched) * ints[KV_PER_TOKEN] + (n_old + n_new) * ints[CKPT_BYTES]
    if need > free_bytes(st):
        depth, partial, deepest = make_room(st, path, depth, matched, partial, need, result)
    if need > free_bytes(st):
        budget = free_bytes(st)
        n_old, n_new, plan_end = truncate(st, budget, matched, plan_end, planned, n_old, n_new)
        result[R_TRUNCATED] = 1
    apply(st, path, depth, partial, along, off, matched, plan_end, planned, n_old, n_new, result)
    pin(n, deepest, -1)
    note_peaks(ints)
    tidy(st)


# ---------------------------------------------------------------------------- the replay
@njit
def serve(st, off, n_in, size, path, along, work, result):
    """``RequestStep.serve`` of one request: tick, match the input, note the hit, plan its
    states (judicious or fine-grained admission), admit input + output (``work``: room for the
    plan's states twice); returns (matched, hit)."""
    st[SETTINGS][NOW] += 1.0
    depth, matched, partial = walk(st, off, n_in, path, 0, 0, -1)
    hit_node, hit = lookup(st, path, depth, matched, partial, n_in)
    on_hit(st, path, depth, hit_node)
    half = work.shape[0] // 2
    ckpts, planned = work[:half], work[half:]
    if st[INTS][ADMISSION] == FINE_GRAINED:
        n_ckpts, end = fine_grained(st, size, ckpts)
    else:
        n_ckpts, end = judicious(st, path, depth, matched, partial, size, ckpts), size
    for k in range(result.shape[0]):
        result[k] = 0
    walked = (n_in, depth, matched, partial)
    admit(st, off, end, ckpts, n_ckpts, path, along, walked, planned, result)
    return matched, hit


@njit
def room(st, size):
    """Node slots one request's admission may take: a split at its match, one per state on
    cached tokens and one per new state, and one more."""
    ints = st[INTS]
    states = size // ints[BLOCK] if ints[ADMISSION] == FINE_GRAINED else 2
    return 2 * states + 4


@njit
def replay(st, offs, in_lens, seq_lens, path, along, work, out, lo, hi, stop_at_eviction):
    """Requests ``lo`` .. ``hi - 1`` through :func:`serve` (``out`` columns ``lo`` ..: matched,
    hit, the admission's :data:`R_KV` .. :data:`R_TRUNCATED`, the cache's KV and SSM bytes
    after); with ``stop_at_eviction``, stops after the first request whose admission evicted.
    Returns the index after the last request served and why it stopped (:data:`DONE`,
    :data:`EVICTED`, or :data:`ROOM`: the next request may need more node slots than are free,
    or its path a longer ``path``)."""
    result = np.zeros(6, dtype=np.int64)
    ints = st[INTS]
    hi = min(hi, offs.shape[0])
    for i in range(lo, hi):
        need = room(st, seq_lens[i])
        if ints[FREE] < need or ints[TOP] + need + 4 > path.shape[0]:
            return i, ROOM
        matched, hit = serve(st, offs[i], in_lens[i], seq_lens[i], path, along, work, result)
        out[0, i], out[1, i] = matched, hit
        for k in range(6):
            out[2 + k, i] = result[k]
        out[8, i], out[9, i] = ints[KV], ints[SSM]
        if stop_at_eviction and result[R_EVICTED]:
            return i + 1, EVICTED
    return hi, DONE
