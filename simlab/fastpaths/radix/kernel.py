"""Judicious admission (Marconi's, the paper's SGLang+) or fine-grained admission (the paper's
vLLM+) with FLOP-aware or LRU eviction on the token radix tree, compiled:
:meth:`simlab.engines.step.RequestStep.serve` over the whole trace as one numba kernel
(:mod:`simlab.fastpaths.radix.jit`) over flat arrays, with the same records request for request;
with Marconi's alpha tuning too (:mod:`simlab.fastpaths.radix.tuning`).

numba is an optional extra (``pip install simlab[fast]``, :func:`simlab.util.numba_import.available`);
``cache.compiled`` decides (:func:`use_compiled`), and without numba the request step runs,
giving the same records. What the kernel covers is what the route table accepts
(:func:`simlab.run.routes.radix_refusal`): the replay engine, a token trace or a hybrid's
hash-id trace (positions count ids of ``cache.unit`` tokens, :func:`keyed`), simlab's own cache
semantics (no reference-code flags), one shared budget (no SSM pool, no host tier), no
``cache.page_size``, no controller but the alpha tuner (with judicious admission), an admission
of kind ``judicious`` (on its input, unpaged) or ``fine_grained``, and an eviction of order
``flop_aware`` (the paper's terms, ties to the oldest node) or ``recency`` (ties to the oldest,
an insertion refreshing nothing). Everything else runs request by request.

The kernel is the cache's code path for these plug-ins, step for step (each function of
:mod:`simlab.fastpaths.radix.jit` names the method it follows), with three changes that give the
same results:

* a node's tokens are not copied: it keeps the offset of a sequence through it in one pool of
  every request's tokens (:class:`TokenPool`; a node's path never changes its tokens, so
  neither a split nor a merge needs new ones), and its children are an open-addressing hash
  table keyed by ``(parent, first token)``;
* a one-child node's child is the sum of its children's slots (its only one);
* an eviction finds the lowest-scored candidate of the moment: Marconi's re-scored over a scan
  of the live slots after every eviction, as the cache re-scores them; LRU's from a heap of the
  leaves, a parent pushed once it is a leaf (its scores do not change during an eviction, so
  this is the cache's heap's order). Ties go to the smallest creation id, so slot numbers never
  matter.

The floats are the cache's (IEEE doubles, the same operations in the same order: the kernel is
compiled without fast-math, so nothing is fused or reassociated), and every byte count stays
below 2**53, where int-to-float comparisons are exact as Python's are. The kernel's node slots
grow as requests need them (:class:`Kernel`). ``tests/test_radix_kernel.py`` checks every record
column against the request step on the real traces and on random token tries.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from simlab.cache.keys import key_scheme
from simlab.engines.records import RECORD_COLUMNS, Columns
from simlab.engines.tuning.tuner import AlphaTuner
from simlab.fastpaths.radix.jit import layout
from simlab.util.numba_import import available

if TYPE_CHECKING:
    from simlab.engines.step import RequestStep
    from simlab.fastpaths.blocks.replay import Walks
    from simlab.model.spec import ModelSpec
    from traces.format import Request

log = logging.getLogger(__name__)


class Peaks(NamedTuple):
    """The cache's peak bytes over a replay (``PrefixCache.peak_kv_bytes`` ...)."""

    kv: int
    ssm: int
    total: int


#: :func:`shared_pool`'s key in a run's shared arrays (:data:`simlab.fastpaths.blocks.replay.Walks`)
POOL = "radix_kernel.TokenPool"
#: ``cache.compiled=auto`` compiles a run the request step would take this long to serve
#: (:func:`step_seconds`): importing numba and loading the cached kernel take 0.31-0.35 s on a
#: 2-core machine (README, "Compiled radix replay")
COMPILED_MIN_SECONDS = 0.5
#: the request step's time per request served (ShareGPT and SWE-bench: 50-80 us) and per node
#: of a fine-grained admission's chains (1.8-2.3 us)
STEP_S_PER_REQUEST = 60e-6
STEP_S_PER_BLOCK = 2e-6
#: the plug-ins the kernel runs, by what they declare (``AdmissionPolicy.kind``,
#: ``EvictionPolicy.order``) -> the kinds of :mod:`simlab.fastpaths.radix.jit.layout`
ADMISSIONS = {"judicious": 0, "fine_grained": 1}
EVICTIONS = {"flop_aware": 0, "recency": 1}
#: nodes one request can add (a split at its match, two at its states, two new nodes)
NODES_PER_REQUEST = 5


def use_compiled(compiled: bool | str, requests: Sequence[Request], step: RequestStep) -> bool:
    """Whether a run the kernel can serve (:func:`simlab.run.routes.radix_refusal`) runs compiled: ``cache.compiled`` true, or
    auto with numba installed and at least :data:`COMPILED_MIN_SECONDS` of the request step's
    work (:func:`step_seconds`)."""
    if compiled == "auto":
        return step_seconds(requests, step) >= COMPILED_MIN_SECONDS and available()
    return compiled is True


def step_seconds(requests: Sequence[Request], step: RequestStep) -> float:
    """About how long the request step would take to serve ``requests``: per request served
    (with alpha tuning, each grid alpha replays about the whole trace again in windows), and
    per node a fine-grained admission chains (one a block)."""
    tuner = next(iter(step.controllers), None)
    serves = len(requests) * (
        1 + (len(tuner.settings.grid) if isinstance(tuner, AlphaTuner) else 0)
    )
    seconds = serves * STEP_S_PER_REQUEST
    if step.admission.kind == "fine_grained":
        tokens = sum(r.input_ids.shape[0] + r.output_ids.shape[0] for r in requests)
        seconds += tokens / int(vars(step.admission)["block_size"]) * STEP_S_PER_BLOCK
    return seconds


def _same_start(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two contiguous arrays of one element type start at the same address (so hold
    the same leading elements)."""
    x, y = a.__array_interface__, b.__array_interface__
    contiguous = x["strides"] is None and y["strides"] is None
    return contiguous and x["data"][0] == y["data"][0] and x["typestr"] == y["typestr"]


def _chained(requests: Sequence[Request], prev: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Which requests' inputs start with their session's last sequence (``prev``: that
    request, -1 for none; ``lens``: input and output lengths). The inputs of a session chain
    are views of one buffer (:mod:`traces.columnar`), so their shared starts are read off where
    their data start (else compared), and the last request's output is compared with the tokens
    that follow its input, all of them at once."""
    n_in, n_out = lens
    has = np.flatnonzero(prev >= 0)
    fits = n_in[has] >= n_in[prev[has]] + n_out[prev[has]]
    has = has[fits]
    pairs = [
        (requests[i], requests[j]) for i, j in zip(has.tolist(), prev[has].tolist(), strict=True)
    ]
    starts = [
        _same_start(r.input_ids, q.input_ids)
        or np.array_equal(r.input_ids[: q.input_len], q.input_ids)
        for r, q in pairs
    ]
    tails = [r.input_ids[q.input_len : q.input_len + q.output_ids.shape[0]] for r, q in pairs]
    outs = [q.output_ids for _, q in pairs]
    if tails and np.array_equal(np.concatenate(tails), np.concatenate(outs)):
        same = np.asarray(starts, dtype=bool)
    else:  # some output differs from what follows: find which
        same = np.array(
            [a and np.array_equal(t, o) for a, t, o in zip(starts, tails, outs, strict=True)],
            dtype=bool,
        )
    chained = np.zeros(len(requests), dtype=bool)
    chained[has[same]] = True
    return chained


@dataclass(frozen=True)
class TokenPool:
    """Every request's sequence (input then output: :class:`simlab.cache.keys.TokenKeys`, not
    committed) in one array, request ``i``'s at ``tokens[offs[i]:offs[i] + seq_lens[i]]``, its
    first ``in_lens[i]`` the input; and the record columns no policy changes
    (:func:`simlab.fastpaths.blocks.replay.request_columns`). A session's requests share one region while
    each input extends the session's last sequence (a conversation's history), so its history
    is stored once and the kernel never compares a session's sequences with each other's copies
    of it. Made once per request list (:func:`shared_pool`)."""

    tokens: np.ndarray
    offs: np.ndarray
    in_lens: np.ndarray
    seq_lens: np.ndarray
    model: ModelSpec  # whose FLOPs ``fixed`` holds
    fixed: dict[str, np.ndarray]


def shared_pool(requests: Sequence[Request], step: RequestStep, shared: Walks | None) -> TokenPool:
    """The :class:`TokenPool` of ``requests`` for ``step``'s model, taken from (or added to)
    ``shared`` under :data:`POOL` (several runs of one request list: policies, capacities)."""
    from simlab.fastpaths.blocks.replay import request_columns

    pool = None if shared is None else shared.get(POOL)
    model = step.cache.model
    if not isinstance(pool, TokenPool):
        tokens, offs, lens = token_pool(keyed(requests, step))
        fixed = request_columns(requests, step)
        pool = TokenPool(tokens, offs, lens[0], lens.sum(axis=0), model, fixed)
    elif pool.model != model:
        pool = replace(pool, model=model, fixed=request_columns(requests, step))
    if shared is not None:
        shared[POOL] = pool
    return pool


def token_pool(requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:class:`TokenPool`'s ``tokens`` and ``offs``, and the input and output lengths (2 rows)."""
    n = len(requests)
    lens = np.array([(r.input_ids.shape[0], r.output_ids.shape[0]) for r in requests], np.int64)
    lens = lens.reshape(n, 2).T
    sessions = np.fromiter((r.session_id for r in requests), np.int64, n)
    order = np.argsort(sessions, kind="stable")  # by session, in processing order within
    prev = np.full(n, -1, dtype=np.int64)
    follows = sessions[order[1:]] == sessions[order[:-1]]
    prev[order[1:][follows]] = order[:-1][follows]
    chained = _chained(requests, prev, lens)
    skip = np.zeros(n, dtype=np.int64)  # input tokens already in the region
    skip[chained] = lens[0][prev[chained]] + lens[1][prev[chained]]
    added = (lens[0] - skip + lens[1])[order]
    ends = np.cumsum(added)
    starts = np.where(chained[order], 0, ends - added)  # a region starts at each unchained
    offs = np.empty(n, dtype=np.int64)
    offs[order] = np.maximum.accumulate(starts) if n else starts
    parts = [
        x
        for i, k in zip(order.tolist(), skip[order].tolist(), strict=True)
        for x in (requests[i].input_ids[k:], requests[i].output_ids)
    ]
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    if tokens.size and not (int(tokens.min()) >= 0 and int(tokens.max()) < 2**31):
        raise ValueError("compiled radix replay: token ids must be in [0, 2**31)")
    return tokens.astype(np.int32, copy=False), offs, lens


def empty_state(step: RequestStep, tokens: np.ndarray, slots: int) -> tuple[np.ndarray, ...]:
    """The kernel's ``st`` (:mod:`simlab.fastpaths.radix.jit`) for ``step``'s empty cache of
    ``slots`` node slots (the root at slot 0)."""
    cache, admission, model = step.cache, step.admission, step.cache.model
    nodes = np.zeros((layout.N_ROWS, slots), dtype=np.int64)
    nodes[layout.ALIVE, layout.ROOT] = 1
    floats = np.zeros((3, slots), dtype=np.float64)
    table = table_for(slots)
    ints = np.zeros(layout.N_INTS, dtype=np.int64)
    ints[layout.FREE], ints[layout.NEXT_NID], ints[layout.TOP] = slots - 1, 1, 1
    ints[layout.KV_PER_TOKEN], ints[layout.CKPT_BYTES] = cache.kv_per_token, cache.ckpt_bytes
    ints[layout.HYBRID], ints[layout.EVICTION] = cache.hybrid, EVICTIONS[step.eviction.order]
    ints[layout.ADMISSION], ints[layout.PAGE] = ADMISSIONS[admission.kind], step.page_size
    ints[layout.UNIT] = cache.unit
    fields = vars(admission)  # Judicious's or FineGrained's
    ints[layout.ROUND_DOWN] = fields.get("alignment") == "round_down"
    ints[layout.CHUNK] = fields.get("chunk_size", 1)
    ints[layout.BLOCK] = fields.get("block_size", 1)
    alpha = getattr(step.eviction, "alpha", 0.0)
    coefficients = model.prefill_coefficients
    settings = np.array([0.0, cache.capacity, alpha, *coefficients], dtype=np.float64)
    free = np.arange(slots - 1, -1, -1, dtype=np.int64)  # pops 1, 2, ...
    return nodes, floats, table, ints, settings, free, tokens


def plan_states(step: RequestStep, pool: TokenPool) -> int:
    """The most states one of the pool's requests may plan: 2 (judicious), or its longest
    sequence's blocks (fine-grained)."""
    if step.admission.kind != "fine_grained" or not pool.seq_lens.size:
        return 2
    return int(pool.seq_lens.max()) // int(vars(step.admission)["block_size"])


@dataclass
class Kernel:
    """The kernel's state ``st`` and its working arrays: a walk's path, the matched path as it
    is split, and room for a plan's states twice. :meth:`serve` grows them when a request may
    need more than they have (a fine-grained admission's chains)."""

    st: tuple[np.ndarray, ...]
    path: np.ndarray
    along: np.ndarray
    work: np.ndarray

    @classmethod
    def of(cls, st: tuple[np.ndarray, ...], states: int) -> Kernel:
        slots = st[0].shape[1]
        work = np.zeros(2 * (states + 2), dtype=np.int64)
        return cls(st, np.zeros(slots + 8, np.int64), np.zeros(slots + 8, np.int64), work)

    def serve(
        self,
        offs: np.ndarray,
        in_lens: np.ndarray,
        seq_lens: np.ndarray,
        out: np.ndarray,
        lo: int,
        hi: int,
        stop_at_eviction: bool = False,
    ) -> int:
        """The requests ``lo`` .. ``hi - 1`` (of these sequences) through the kernel's
        ``replay``; returns the index after the last one served (before ``hi`` only when
        ``stop_at_eviction`` stopped it)."""
        from simlab.fastpaths.radix.jit.serve import replay

        while True:
            args = (offs, in_lens, seq_lens, self.path, self.along, self.work, out)
            lo, why = replay(self.st, *args, lo, hi, stop_at_eviction)
            if why != layout.ROOM:
                return int(lo)
            self.grow()

    def grow(self) -> None:
        """Twice the node slots (the live ones and the free ones kept, the table afresh) and
        a path as long."""
        from simlab.fastpaths.radix.jit.table import rehash

        nodes, floats, _table, ints, settings, free, tokens = self.st
        slots, top, n_free = nodes.shape[1], int(ints[layout.TOP]), int(ints[layout.FREE])
        rows = layout.N_ROWS
        bigger = (np.zeros((rows, 2 * slots), np.int64), np.zeros((3, 2 * slots), np.float64))
        bigger[0][:, :top], bigger[1][:, :top] = nodes[:, :top], floats[:, :top]
        stack = np.zeros(2 * slots, np.int64)  # room for every slot: releases push on it
        stack[: slots + n_free] = np.concatenate(
            (np.arange(2 * slots - 1, slots - 1, -1), free[:n_free])
        )
        ints = ints.copy()
        ints[layout.FREE] = slots + n_free
        self.st = (*bigger, table_for(2 * slots), ints, settings, stack, tokens)
        rehash(self.st)
        self.path = np.zeros(2 * slots + 8, np.int64)
        self.along = np.zeros(2 * slots + 8, np.int64)


def keyed(requests: Sequence[Request], step: RequestStep) -> list[Request]:
    """``requests`` keyed as a fresh request step on ``step``'s cache keys them, in order: a
    hash-id prompt's short last id becomes a key of its own (:class:`simlab.cache.keys.TokenKeys`),
    from a fresh id table, as the run's step and each of the tuner's window replays have one; its
    tokens count whole on a hybrid, as the cache counts them. The keys, negative, become ids
    below ``2**31`` (:func:`kernel_ids`)."""
    if all(r.block_size == 1 for r in requests):
        return list(requests)
    scheme = key_scheme(step.admission.keys)
    views = (scheme.view(r).lookup for r in requests)
    return [replace(r, input_ids=kernel_ids(ids)) for r, ids in zip(requests, views, strict=True)]


#: where a short last id's key ``k`` (< 0) goes among the kernel's ids: ``SHORT_KEYS + k``
SHORT_KEYS = 2**31


def kernel_ids(ids: np.ndarray) -> np.ndarray:
    """Cache ids as kernel ids: a short last id's key (negative) from ``2**31`` down; a trace's
    own id must stay below them all."""
    if not ids.size or int(ids.min()) >= 0:
        return ids
    lowest = SHORT_KEYS + int(ids.min())
    if int(ids.max()) >= lowest:
        raise ValueError(f"compiled radix replay: ids must stay below {lowest}")
    wide = ids.astype(np.int64)
    return np.where(wide < 0, wide + SHORT_KEYS, wide).astype(np.int32)


def table_for(nodes: int) -> np.ndarray:
    """An empty children table for up to ``nodes`` nodes (at most a quarter of it used)."""
    table = np.zeros((2, 1 << max(4, (4 * nodes - 1).bit_length())), dtype=np.int64)
    table[0] = layout.EMPTY
    return table


def copy_state(st: tuple[np.ndarray, ...], nodes: int | None = None) -> tuple[np.ndarray, ...]:
    """A copy of the kernel's state: the node slots in use and the free ones (past them the
    slots hold nothing yet: a new node writes every column), the token pool shared (the kernel
    never writes it). ``nodes``: the copy gets a children table of its own for up to that many
    nodes, filled afresh (a window's replay adds few nodes to a snapshot's)."""
    from simlab.fastpaths.radix.jit.table import rehash

    top, free = int(st[layout.INTS][layout.TOP]), int(st[layout.INTS][layout.FREE])

    def head(a: np.ndarray, k: int) -> np.ndarray:
        out = np.empty_like(a)
        out[..., :k] = a[..., :k]
        return out

    nodes_, floats, table, ints, settings, slots, tokens = st
    table = table.copy() if nodes is None else table_for(nodes)
    copy = (
        head(nodes_, top),
        head(floats, top),
        table,
        ints.copy(),
        settings.copy(),
        head(slots, free),
        tokens,
    )
    if nodes is not None:
        rehash(copy)
    return copy


def replay_columns(fixed: dict[str, np.ndarray], step: RequestStep, out: np.ndarray) -> Columns:
    """The records of the kernel's ``out`` rows (``fixed``: the request columns), column for
    column as :func:`simlab.engines.records.record_columns` makes them from the request step's records."""
    n = out.shape[1]
    matched, hit = in_tokens(out[0], fixed), in_tokens(out[1], fixed)
    columns = {
        "policy": np.full(n, step.policy, dtype=object),
        **{k: fixed[k] for k in ("request_id", "session_id", "turn", "arrival")},
        "input_tokens": fixed["input_tokens"],
        "output_tokens": fixed["output_tokens"],
        "matched_tokens": matched,
        "hit_tokens": hit,
        "prefill_flops": fixed["prefill_flops"],
        "flops_saved": step.cache.model.prefill_flops_array(0, hit),
        "kv_bytes_admitted": out[2],
        "ssm_bytes_admitted": out[3],
        "ckpts_admitted": out[4],
        "bytes_evicted": out[5],
        "nodes_evicted": out[6],
        "admission_truncated": out[7].astype(bool),
        "cache_kv_bytes": out[8],
        "cache_ssm_bytes": out[9],
    }
    nan = np.full(n, math.nan)
    return {name: columns[name] if name in columns else nan.copy() for name in RECORD_COLUMNS}


def in_tokens(ids: np.ndarray, fixed: dict[str, np.ndarray]) -> np.ndarray:
    """Tokens a match of ``ids`` ids reuses, request for request (``fixed``: their request
    columns): :meth:`traces.format.Request.hit_tokens`, ``min(ids x block, input tokens)``."""
    return np.minimum(ids * fixed["unit_tokens"], fixed["input_tokens"])
