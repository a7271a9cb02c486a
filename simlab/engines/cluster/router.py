"""The routers (``cluster.router``; :mod:`simlab.engines.cluster`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from simlab.config import ClusterSettings
from traces.format import Request

#: routers whose choice reads the replicas' caches
CACHE_ROUTERS = ("prefix_aware", "hybrid_aware")


class Router:
    """Picks a replica per request (``settings.router``; see the module docstring)."""

    def __init__(self, settings: ClusterSettings, hybrid: bool, seed: int, n: int) -> None:
        self.settings, self.hybrid = settings, hybrid
        self.n = n  # the replicas it routes to (a disaggregated cluster's prefill replicas)
        self._count = 0
        self.routed = [0] * self.n  # requests sent to each replica so far
        self._sessions: dict[int, int] = {}
        self._rng = np.random.default_rng(seed)
        self._pick: Callable[..., int] = getattr(self, f"_{settings.router}")

    def choose(
        self,
        req: Request,
        seen: Callable[[], list[tuple[int, int]]],
        loads: Callable[[], list[int]],
    ) -> int:
        """The replica for ``req``; ``seen()``: (matched, hit) tokens per replica in the
        router's view; ``loads()``: load tokens per replica. Each is called only if needed."""
        k = self._pick(req, seen, loads)
        self.routed[k] += 1
        return k

    def _round_robin(self, req: Request, seen: Any, loads: Any) -> int:
        self._count += 1
        return (self._count - 1) % self.n

    def _session_affinity(self, req: Request, seen: Any, loads: Any) -> int:
        if req.session_id not in self._sessions:
            self._sessions[req.session_id] = len(self._sessions) % self.n
        return self._sessions[req.session_id]

    def _random(self, req: Request, seen: Any, loads: Any) -> int:
        return int(self._rng.integers(self.n))

    def _least_loaded(self, req: Request, seen: Any, loads: Callable[[], list[int]]) -> int:
        load = loads()
        return min(range(self.n), key=lambda k: (load[k], self.routed[k], k))

    def _prefix_aware(
        self, req: Request, seen: Callable[[], list[tuple[int, int]]], loads: Any
    ) -> int:
        return self._best([matched for matched, _hit in seen()], loads())

    def _hybrid_aware(
        self, req: Request, seen: Callable[[], list[tuple[int, int]]], loads: Any
    ) -> int:
        overlap = [hit if self.hybrid else matched for matched, hit in seen()]
        return self._best(overlap, loads())

    def _best(self, overlap: list[int], load: list[int]) -> int:
        """Largest ``overlap - load_weight x load``; ties: smaller load, fewer requests routed
        so far, lower index."""
        weight, routed = self.settings.load_weight, self.routed
        return min(
            range(self.n), key=lambda k: (weight * load[k] - overlap[k], load[k], routed[k], k)
        )
