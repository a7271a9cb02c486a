"""The measured attention of one iteration (:class:`MeasuredOps`' attention hooks): grouped-query
attention from the ``attention`` tables, its sliding-window layers at their window, and MLA
from the ``mla`` tables (the attention kernel alone: its projections are GEMMs of their own).

* Prefill: each kind of layer at ``b`` sequences of the compute-equivalent length ``L =
  sqrt(sum(new^2 + 2 new prefix) / b)`` -- exact for ``b`` equal chunks without a prefix (the
  tables' own shape); a cached prefix or unequal chunks are modelled (source ``interpolated``;
  :data:`~simlab.cost.measured.hooks.PREFIX_ATTENTION_UNCERTAINTY`), never below the time to
  read their KV at the peak bandwidth. A sliding-window layer runs ``b`` sequences of the mean
  new tokens per chunk: a prefix adds at most ``window^2 / 2`` pairs to a chunk (``interpolated``).
* Decode: each kind at the batch and the mean context (not with shared-prefix attention,
  which no table measures); a window's curve is flat past the window, so a context beyond the
  measured ones is read at the last measured one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simlab.cost.measured.interpolate import Curve
from simlab.cost.measured.sources import INTERPOLATED, worst
from simlab.cost.shapes import Op
from simlab.model import layers as kinds

if TYPE_CHECKING:
    from simlab.cost.measured.hooks import MeasuredOps, Timed

Part = tuple[Curve, int, int]  # (generation curve, layers, window)


def layer_kinds(ops: MeasuredOps) -> list[tuple[int, int]]:
    """``(window, layers)`` of each kind of attention layer the tables measure (0: full):
    MLA, or grouped-query attention with equal query and value head sizes (none otherwise)."""
    m = ops.model
    if m.attn_kind != "mla" and m.head_dim != m.v_head_dim:
        return []
    full, swa = m.n_attn_layers - m.n_swa_layers, m.n_swa_layers
    return [(w, n) for w, n in ((0, full), (m.swa_window, swa)) if n]


def prefill(ops: MeasuredOps, op: Op) -> Timed:
    if not ops.attention_layers:
        return None
    chunks, length, uniform, kv_tokens = op.query
    kv_bytes = kv_tokens * _kv_elements(ops) * ops.model.kv_dtype_bytes
    seconds, tags = 0.0, [] if uniform else [INTERPOLATED]
    for window, layers in ops.attention_layers:
        timed = _prefill_layer(ops, chunks, op.tokens / chunks if window else length, window)
        if timed is None:
            return None
        seconds += layers * max(timed[0] / 1e3, kv_bytes / ops.hw.mem_bw)
        tags.append(timed[1])
    return seconds, worst(tags)


def _prefill_layer(
    ops: MeasuredOps, chunks: int, length: float, window: int
) -> tuple[float, str] | None:
    """One layer's prefill attention (ms, source) from its table."""
    if ops.model.attn_kind == "mla":
        return ops.kernels.mla_context(chunks, length, ops.heads[0])
    heads, kv, head_dim = ops.heads
    return ops.kernels.context(chunks, length, heads, kv, head_dim, window)


def _kv_elements(ops: MeasuredOps) -> int:
    """Cached elements of one token in one layer on one GPU (MLA's latent is not split)."""
    if ops.model.attn_kind == "mla":
        return kinds.latent_elements(ops.model)
    _, kv, head_dim = ops.heads
    return 2 * kv * head_dim


def curves(ops: MeasuredOps, n: int) -> list[Part] | None:
    """Each kind's generation curve over the context at batch ``n`` (None: not covered)."""
    parts = []
    for window, layers in ops.attention_layers:
        if ops.model.attn_kind == "mla":
            curve = ops.kernels.mla_generation(n, ops.heads[0])
        else:
            heads, kv, head_dim = ops.heads
            curve = ops.kernels.generation(n, heads, kv, head_dim, window)
        if curve is None:
            return None
        parts.append((curve, layers, window))
    return parts or None


def _context(curve: Curve, window: int, x: float) -> float:
    """Where ``curve`` is read at mean context ``x``: past a window no further than the
    measured contexts, at the last measured one (as :func:`decode_seconds` reads it)."""
    return min(x, curve.x_max) if 0 < window <= curve.x_max else x


def decode_seconds(ops: MeasuredOps, n: int, context_sums: np.ndarray) -> np.ndarray | None:
    """Decode attention's seconds at each context sum of ``n`` requests (None: uncovered)."""
    parts = curves(ops, n)
    if parts is None:
        return None
    total = None
    for curve, layers, window in parts:
        x = context_sums / n
        ms = curve.at_many(np.minimum(x, curve.x_max) if 0 < window <= curve.x_max else x)
        if ms is None:
            return None
        seconds = layers * ms / 1e3  # as decode, per element
        total = seconds if total is None else total + seconds
    return total


def decode(ops: MeasuredOps, op: Op) -> Timed:
    n, context_sum, shared = op.query
    parts = None if shared else curves(ops, n)
    if parts is None:
        return None
    seconds, tags = 0.0, []
    for curve, layers, window in parts:
        timed = curve.at(_context(curve, window, float(context_sum) / n))
        if timed is None:
            return None
        seconds += layers * timed[0] / 1e3
        tags.append(timed[1])
    return seconds, worst(tags)
