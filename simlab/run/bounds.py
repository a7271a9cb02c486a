"""The infinite-cache bound: the token hits no policy at any capacity can beat.

(The other bound, the clairvoyant policy at the run's capacity, is a policy:
:mod:`policies.clairvoyant`.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from simlab.cache.contract import CacheView, EvictionPolicy
from simlab.cache.keys import TokenKeys
from simlab.cache.prefix import PrefixCache
from simlab.model.spec import ModelSpec


@dataclass(frozen=True)
class _TokenUnits:
    """The parts of a model a prefix cache needs, for a bytes-free token-level tree."""

    kv_bytes_per_token: int = 1
    ssm_state_bytes: int = 0
    is_hybrid: bool = False

    def prefill_flops(self, prefix: int, new: int) -> float:
        return 0.0

    def prefill_flops_array(self, prefix: np.ndarray, new: np.ndarray) -> np.ndarray:
        return np.zeros(np.broadcast(prefix, new).shape)


class _Admit(EvictionPolicy):
    evicts_inner_nodes = False
    scores_depend_on_candidates = False

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        raise AssertionError("an infinite cache never evicts")


def infinite_cache_hits(
    requests: Sequence[Any], page_size: int = 1, committed: bool = False
) -> list[int]:
    """Ideal reuse in tokens: per request (in order) the longest prefix shared with any earlier
    input + output, rounded down to ``page_size`` ids and capped at ``input tokens - 1``;
    ``committed``: without each output's last token, whose KV an engine never computes (the
    production engines' keys, :attr:`simlab.cache.keys.TokenKeys.committed`).

    This is what an infinite cache gives a Transformer, and a hybrid whose every position is
    checkpointed; no policy at any capacity can hit more. On a hash-id trace (ids of many
    tokens) the ids are keyed as the token-keyed policies key them (a prompt's short last id
    apart, :class:`simlab.cache.keys.TokenKeys`) and the hit may end inside the last id.
    """
    unit = max((getattr(req, "block_size", 1) for req in requests), default=1)
    model = cast(ModelSpec, _TokenUnits())
    cache = PrefixCache(model, math.inf, page_size, unit_tokens=unit)
    admit = _Admit()
    keys = TokenKeys(committed)
    hits = []
    for req in requests:
        if unit > 1:  # Requests of a hash-id trace
            view = keys.view(req)
            hit = cache.lookup(view.lookup, page_size).hit
            hits.append(min(req.hit_tokens(hit), req.input_tokens - 1))
            cache.insert(view.sequence, [], int(view.sequence.shape[0]), admit, short=view.short)
            continue
        seq = np.asarray(getattr(req, "input_ids", req))
        hits.append(cache.lookup(seq, page_size).hit)
        out = getattr(req, "output_ids", None)
        if out is not None and committed:
            out = out[:-1]
        full = seq if out is None or len(out) == 0 else np.concatenate((seq, out))
        cache.insert(full, [], int(full.shape[0]), admit)
    return hits
