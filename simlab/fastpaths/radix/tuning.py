"""Marconi's alpha tuning on the compiled radix replay (:mod:`simlab.fastpaths.radix.kernel`):
the one :class:`simlab.engines.tuning.tuner.AlphaTuner` and its protocol, given the kernel's
snapshots and grid search (:class:`simlab.engines.tuning.tuner.Imaging`).

* A replay the kernel serves (:func:`tuned_replay`) runs in stretches that end where the tuner
  snapshots the cache or tunes, and shows the tuner every admission in order, as the request
  step's controller hook does; the grid search (:class:`KernelSearch`) replays each window on
  copies of the kernel's state.
* A run on an engine the kernel does not serve (the timed engine, a cluster's replicas) keeps
  the request step and its snapshots (``CacheImage``); its grid search (:class:`ImageSearch`)
  makes each snapshot kernel state (:func:`image_state`) and replays the windows there
  (:func:`search_compiled`; :func:`simlab.run.routes.with_compiled_search` decides); so does a
  hybrid's run on a hash-id trace, its windows keyed as the request step keys them
  (:func:`simlab.fastpaths.radix.kernel.keyed`), its hits in tokens (``Request.hit_tokens``).

Both give the request step's tunings: the same windows, grid scores (summed in the order
``WindowResult.add`` sums them) and alphas (``tests/test_radix_kernel.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simlab.engines.tuning.settings import TuningSettings
from simlab.engines.tuning.tuner import AlphaTuner, Imaging
from simlab.engines.tuning.window import WindowResult
from simlab.fastpaths.radix.jit import layout
from simlab.fastpaths.radix.kernel import (
    NODES_PER_REQUEST,
    Kernel,
    TokenPool,
    copy_state,
    empty_state,
    kernel_ids,
    keyed,
    shared_pool,
    token_pool,
)

if TYPE_CHECKING:
    from simlab.cache.snapshot import CacheImage
    from simlab.engines.step import RequestStep
    from traces.format import Request


def search_compiled(step: RequestStep, tuner: AlphaTuner) -> None:
    """Have ``tuner`` (``step``'s) replay its grid search's windows on the kernel
    (:class:`ImageSearch`): a tuned run the kernel does not serve whole (the timed engine, a
    cluster's replicas; :func:`simlab.run.routes.with_compiled_search` decides)."""
    tuner.imaging = Imaging(search=ImageSearch(step), workers=False)


def tuned_replay(
    requests: Sequence[Request],
    step: RequestStep,
    tuner: AlphaTuner,
    pool: TokenPool,
    kernel: Kernel,
    out: np.ndarray,
) -> None:
    """The replay with Marconi's alpha tuning: the kernel serves the requests in stretches
    that end where the tuner snapshots the cache or tunes (:meth:`AlphaTuner.next_event`; the
    first eviction, before it is known), and the tuner is shown every admission in order, as
    the request step's controller hook shows it, with the kernel's snapshots and grid search
    (:class:`KernelSearch`): the same protocol, the same alphas."""
    slots = kernel.st[layout.NODES].shape[1]
    tuner.imaging = Imaging(
        snapshot=copy_state,
        empty=lambda _st: empty_state(step, pool.tokens, slots),
        search=KernelSearch(
            pool,
            {id(r): i for i, r in enumerate(requests)},
            kernel,
            step if step.cache.unit > 1 else None,
        ),
        workers=False,
    )
    evicted = out[2 + layout.R_EVICTED]
    i, n = 0, len(requests)
    while i < n:
        event = tuner.next_event()
        stop = tuner.bootstrap_requests is None  # the first eviction schedules the tunings
        hi = n if event is None else min(event, n)
        j = kernel.serve(pool.offs, pool.in_lens, pool.seq_lens, out, i, hi, stop)
        for k in range(i, j):
            tuner.evicted = tuner.evicted or bool(evicted[k])
            alpha = tuner.account(kernel.st, requests[k], step.admission)
            if alpha is not None:
                kernel.st[layout.SETTINGS][layout.ALPHA] = alpha
                step.eviction.set_alpha(alpha)  # type: ignore[attr-defined]
        i = j


@dataclass(frozen=True)
class KernelSearch:
    """:func:`simlab.engines.tuning.search.grid_results` on the kernel: each grid alpha replays
    the window on a copy of the snapshot (with ``kernel``'s working arrays), and its scored
    requests are summed in order, as :class:`~simlab.engines.tuning.window.WindowResult` adds
    records."""

    pool: TokenPool
    index: dict[int, int]  # id of a request -> its position in the pool
    kernel: Kernel
    #: ids of many tokens: each window keyed afresh for this step, as the request step's window
    #: replays key it (a short last id's key may differ from the run's), after the pool's tokens
    rekey: RequestStep | None = None

    def __call__(
        self,
        image: tuple[np.ndarray, ...],
        window: Sequence[Request],
        admission: object,
        template: object,
        settings: TuningSettings,
    ) -> dict[float, WindowResult]:
        pool, n = self.pool, len(window)
        idx = np.fromiter((self.index[id(r)] for r in window), np.int64, n)
        offs, in_lens, seq_lens = pool.offs[idx], pool.in_lens[idx], pool.seq_lens[idx]
        tokens = image[layout.TOKENS]
        if self.rekey is not None:
            own, offs, lens = token_pool(keyed(window, self.rekey))
            offs = offs + tokens.shape[0]
            tokens, in_lens, seq_lens = np.concatenate((tokens, own)), lens[0], lens.sum(axis=0)
        scored = idx[0 if settings.score_last is None else max(0, n - settings.score_last) :]
        inputs = pool.fixed["input_tokens"][scored]
        units = pool.fixed["unit_tokens"][scored]
        prefill = pool.fixed["prefill_flops"][scored].tolist()
        live = int(image[layout.NODES][layout.ALIVE, : image[layout.INTS][layout.TOP]].sum())
        results = {}
        for alpha in settings.grid:
            st = (*copy_state(image, live + NODES_PER_REQUEST * n)[: layout.TOKENS], tokens)
            st[layout.SETTINGS][layout.ALPHA] = alpha
            out = np.zeros((10, n), dtype=np.int64)
            kernel = Kernel(st, self.kernel.path, self.kernel.along, self.kernel.work)
            kernel.serve(offs, in_lens, seq_lens, out, 0, n)
            hit = np.minimum(out[1][n - scored.size :] * units, inputs)  # in_tokens
            saved = pool.model.prefill_flops_array(0, hit).tolist()
            results[alpha] = WindowResult(
                int(hit.sum()), int(inputs.sum()), running_sum(saved), running_sum(prefill)
            )
        return results


@dataclass(frozen=True)
class ImageSearch:
    """:class:`KernelSearch` from a snapshot of the request step's cache (a
    :class:`~simlab.cache.snapshot.CacheImage`, as the tuner takes it on any engine): the snapshot
    becomes kernel state (:func:`image_state`) beside the window's token pool."""

    step: RequestStep

    def __call__(
        self,
        image: CacheImage,
        window: Sequence[Request],
        admission: object,
        template: object,
        settings: TuningSettings,
    ) -> dict[float, WindowResult]:
        pool = shared_pool(window, self.step, None)  # keyed as the window's step keys it
        st = image_state(image, self.step, pool.tokens, NODES_PER_REQUEST * len(window))
        index = {id(r): i for i, r in enumerate(window)}
        search = KernelSearch(pool, index, Kernel.of(st, 2))
        return search(st, window, admission, template, settings)


def image_state(
    image: CacheImage, step: RequestStep, tokens: np.ndarray, room: int
) -> tuple[np.ndarray, ...]:
    """The kernel's state of the cache ``image`` holds, with ``room`` node slots more and
    ``tokens`` (a token pool) at the head of its token pool. Each node refers to the path, from
    the root, of a leaf below it, appended to the pool (a split or merge keeps a node's path,
    so it holds every token a node of it will need); the numbers (recency, bytes, FLOPs, node
    ids, the clock) are the image's own."""
    from simlab.fastpaths.radix.jit.table import rehash

    rows, attrs, root = image.nodes, image.attrs, image.root
    live = [i for i, row in enumerate(rows) if row is not None and i != root]
    slot_of = {root: 0} | {py: k for k, py in enumerate(live, start=1)}
    ref: dict[int, int] = {}
    parts, size = [tokens], int(tokens.shape[0])
    for py in live:
        row = rows[py]
        if row is None or row["children"]:
            continue  # leaves only: each one's path from the root, once
        chain = [py]
        while (parent := rows[chain[-1]]["parent"]) != root:  # type: ignore[index]
            chain.append(parent)
        parts += [kernel_ids(rows[q]["tokens"]) for q in reversed(chain)]  # type: ignore[index]
        for q in chain:
            ref.setdefault(q, size)
        size += int(row["end"])
    slots = len(live) + 1 + room + 8
    st = empty_state(step, np.concatenate(parts), slots)
    _fill_nodes(st, image, live, slot_of, ref)
    ints, top = st[layout.INTS], len(live) + 1
    ints[layout.NEXT_NID] = image.next_nid
    ints[layout.TOP], ints[layout.FREE] = top, slots - top
    ints[layout.KV], ints[layout.SSM] = attrs["kv_bytes"], attrs["ssm_bytes"]
    st[layout.FREE_SLOTS][: slots - top] = np.arange(slots - 1, top - 1, -1)
    st[layout.SETTINGS][layout.NOW] = attrs["now"]
    rehash(st)
    return st


def _fill_nodes(
    st: tuple[np.ndarray, ...],
    image: CacheImage,
    live: list[int],
    slot_of: dict[int, int],
    ref: dict[int, int],
) -> None:
    """The node columns of ``image``'s ``live`` slots at their kernel slots (``slot_of``)."""
    nodes, floats, attrs = st[layout.NODES], st[layout.FLOATS], image.attrs
    root = image.nodes[image.root]
    assert root is not None
    kids = [slot_of[c] for c in root["children"].values()]
    nodes[layout.KIDS, layout.ROOT], nodes[layout.KID_SUM, layout.ROOT] = len(kids), sum(kids)
    for py in live:
        row = image.nodes[py]
        assert row is not None
        k, kids = slot_of[py], [slot_of[c] for c in row["children"].values()]
        nodes[:, k] = (slot_of[row["parent"]], row["start"], row["end"], ref[py], row["nid"],
                       0, len(kids), sum(kids), row["ckpt"], 1)  # fmt: skip
    py_slots = np.asarray(live, dtype=np.int64)
    idx = np.arange(1, len(live) + 1)
    floats[layout.LAST, idx] = attrs["last_access"][py_slots]
    floats[layout.SIZE, idx] = attrs["node_bytes"][py_slots]
    floats[layout.SAVED, idx] = attrs["saved_flops"][py_slots]


def running_sum(values: list[float]) -> float:
    """``values`` added one by one from 0.0 (``WindowResult.add``'s order and rounding)."""
    total = 0.0
    for value in values:
        total += value
    return total
