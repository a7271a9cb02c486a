"""A compiled radix replay from start to end: the kernel's plain serve, or the alpha tuner's
windows (:mod:`simlab.fastpaths.radix.tuning`) when the step has a tuner."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from simlab.engines.records import Columns
from simlab.engines.tuning.tuner import AlphaTuner
from simlab.fastpaths.radix.jit import layout
from simlab.fastpaths.radix.kernel import (
    NODES_PER_REQUEST,
    Kernel,
    Peaks,
    empty_state,
    plan_states,
    replay_columns,
    shared_pool,
)
from simlab.fastpaths.radix.tuning import tuned_replay

if TYPE_CHECKING:
    from simlab.engines.step import RequestStep
    from simlab.fastpaths.blocks.replay import Walks
    from traces.format import Request


def compiled_replay(
    requests: Sequence[Request], step: RequestStep, shared: Walks | None = None
) -> tuple[Columns, Peaks]:
    """The replay of ``requests`` through ``step`` (which passes :func:`obstacle`), compiled:
    the records as :func:`simlab.engines.records.record_columns` makes them, and the cache's peak KV,
    SSM and total bytes. ``step`` itself is left untouched (its cache stays empty);
    ``shared``: `shared_pool`'s."""
    pool = shared_pool(requests, step, shared)
    states = plan_states(step, pool)
    st = empty_state(step, pool.tokens, NODES_PER_REQUEST * len(requests) + 2 * states + 8)
    kernel = Kernel.of(st, states)
    out = np.zeros((10, len(requests)), dtype=np.int64)
    tuner = next(iter(step.controllers), None)
    if isinstance(tuner, AlphaTuner):
        tuned_replay(requests, step, tuner, pool, kernel, out)
    else:
        kernel.serve(pool.offs, pool.in_lens, pool.seq_lens, out, 0, len(requests))
    ints = kernel.st[layout.INTS]
    peaks = Peaks(int(ints[layout.PEAK_KV]), int(ints[layout.PEAK_SSM]), int(ints[layout.PEAK]))
    return replay_columns(pool.fixed, step, out), peaks
