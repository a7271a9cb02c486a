"""Admission: ``_insert`` of a request's sequence, its planned states truncated to the room
there is, evicting first when needed."""

# mypy: ignore-errors
from __future__ import annotations

import numpy as np

from simlab.fastpaths.radix.jit.decorators import njit
from simlab.fastpaths.radix.jit.evict import evict, free_bytes
from simlab.fastpaths.radix.jit.layout import (
    CKPT,
    CKPT_BYTES,
    END,
    FLOATS,
    HYBRID,
    INTS,
    KV,
    KV_PER_TOKEN,
    LAST,
    NODES,
    NOW,
    PEAK,
    PEAK_KV,
    PEAK_SSM,
    R_CKPTS,
    R_KV,
    R_SSM,
    R_TRUNCATED,
    ROOT,
    SETTINGS,
    SSM,
    START,
)
from simlab.fastpaths.radix.jit.match import walk
from simlab.fastpaths.radix.jit.nodes import adopt, new_node, pin, refresh, split
from simlab.fastpaths.radix.jit.table import tidy


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
