"""One request's service (``RequestStep.serve``) and :func:`replay`, the kernel's entry point over
a stretch of requests."""

# mypy: ignore-errors
from __future__ import annotations

import numpy as np

from simlab.fastpaths.radix.jit.admit import admit
from simlab.fastpaths.radix.jit.decorators import njit
from simlab.fastpaths.radix.jit.layout import (
    ADMISSION,
    BLOCK,
    DONE,
    EVICTED,
    FINE_GRAINED,
    FREE,
    INTS,
    KV,
    NOW,
    R_EVICTED,
    ROOM,
    SETTINGS,
    SSM,
    TOP,
)
from simlab.fastpaths.radix.jit.match import fine_grained, judicious, lookup, on_hit, walk


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
