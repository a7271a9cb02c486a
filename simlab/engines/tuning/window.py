"""A tuning window's replay: the cache snapshot it starts from, the replay through the request
step and the totals it is scored on, and the window as one array for the worker processes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simlab.cache.contract import AdmissionPolicy, EvictionPolicy
from simlab.cache.prefix import PrefixCache
from simlab.cache.snapshot import pack, unpack
from simlab.engines.records import RequestRecord
from simlab.engines.step import RequestStep
from traces.format import Request


def snapshot(cache: PrefixCache) -> PrefixCache:
    """An independent copy of ``cache`` with no pins."""
    return unpack(pack(cache))


def empty_like(cache: PrefixCache) -> PrefixCache:
    """A fresh, empty cache of ``cache``'s model, capacities, units and semantics: the cache
    before the first request (the ``start`` snapshot)."""
    return PrefixCache(
        cache.model,
        cache.capacity,
        cache.page_size,
        cache.unit,
        cache.block_nodes,
        cache.ssm_capacity,
        cache.semantics,
        ckpt_states=cache.ckpt_states,
        block_keys=cache.block_keys,
    )


@dataclass
class WindowResult:
    """Totals of the scored requests of one replay."""

    hit_tokens: int = 0
    input_tokens: int = 0
    flops_saved: float = 0.0
    prefill_flops: float = 0.0

    def add(self, record: RequestRecord) -> None:
        self.hit_tokens += record.hit_tokens
        self.input_tokens += record.input_tokens
        self.flops_saved += record.flops_saved
        self.prefill_flops += record.prefill_flops

    def objective(self, name: str) -> float:
        """The value the grid search maximises: token hit rate, or FLOPs saved (absolute, as
        the reference code)."""
        if name == "token_hit_rate":
            return self.share(name)
        return self.flops_saved

    def share(self, name: str) -> float:
        """The objective as a share in [0, 1]: token hit rate, or FLOPs saved / prefill FLOPs
        (the scale of ``margin``; it ranks replays of the same requests as :meth:`objective`)."""
        if name == "token_hit_rate":
            return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0
        return self.flops_saved / self.prefill_flops if self.prefill_flops else 0.0


def replay_window(
    cache: PrefixCache,
    requests: Sequence[Request],
    admission: AdmissionPolicy,
    eviction: EvictionPolicy,
    score_last: int | None = None,
) -> WindowResult:
    """Replay ``requests`` on ``cache`` through the one request step; the result counts the last
    ``score_last`` of them (all when None)."""
    step = RequestStep(cache, admission, eviction, "alpha-tuning")
    scored_from = 0 if score_last is None else max(0, len(requests) - score_last)
    result = WindowResult()
    for i, req in enumerate(requests):
        record = step.serve(req)
        if i >= scored_from:
            result.add(record)
    return result


@dataclass
class WindowImage:
    """Requests with all their token ids in one array: sent to worker processes as one block
    (joblib memory-maps it) instead of thousands of small arrays."""

    ids: np.ndarray
    spans: np.ndarray  # per request: start, end of input, end of output in ``ids``
    fields: list[dict[str, Any]]  # the other Request fields

    @classmethod
    def pack(cls, requests: Sequence[Request]) -> WindowImage:
        parts, spans, fields, pos = [], [], [], 0
        for req in requests:
            n_in, n_out = req.input_ids.shape[0], req.output_ids.shape[0]
            parts += [req.input_ids, req.output_ids]
            spans.append((pos, pos + n_in, pos + n_in + n_out))
            pos += n_in + n_out
            fields.append(
                {f.name: getattr(req, f.name) for f in dataclasses.fields(req)}
                | {"input_ids": None, "output_ids": None}
            )
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return cls(ids, np.asarray(spans, dtype=np.int64).reshape(-1, 3), fields)

    def requests(self) -> list[Request]:
        return [
            Request(**(f | {"input_ids": self.ids[a:b], "output_ids": self.ids[b:c]}))
            for f, (a, b, c) in zip(self.fields, self.spans.tolist(), strict=True)
        ]
