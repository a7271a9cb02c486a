"""Marconi's retrospective tuning of ``alpha`` (paper Sec. 4.2, "Managing the balance").

Protocol, as the paper describes it:

1. ``alpha = 0`` (recency only) until the first eviction.
2. At the first eviction the cache is snapshotted and the bootstrap period starts; its length is
   ``bootstrap_multiplier x N`` requests, ``N`` = requests seen up to and including the one whose
   admission caused that eviction (the paper: "the number of requests seen before the first
   eviction"; its reference code uses a multiplier of 5). ``alpha`` stays 0 meanwhile.
3. When the window is full, a grid search replays it on copies of the snapshot, one per grid
   value (in parallel across processes), and the value with the best objective is adopted for
   every later request. Objective ``token_hit_rate`` (the paper) or ``flops_saved``; ties go to
   the smallest alpha, so the result never depends on the number of workers or their order.
4. Beyond the paper (``retune_every = K``): every ``K`` requests after that, the last ``window``
   requests (default: the bootstrap window's length) are replayed again from a snapshot taken at
   their start (never earlier than the first eviction), and the winner adopted.

Snapshot (:func:`simlab.snapshot.pack` / :func:`simlab.snapshot.unpack`). A :class:`CacheImage` is the cache as plain data: its
attributes with every per-slot array copied and each tree node flattened to a row whose
parent/children are slot numbers. Packing is iterative (no recursion, so no depth limit, unlike
``copy.deepcopy`` or ``pickle`` of a deep tree) and shares the token arrays, which the cache never
writes in place. Pins are cleared: a replay has nothing in flight.

The tuner is an engine-level controller (:class:`simlab.step.Controller`): the request step
calls :meth:`AlphaTuner.observe` after every admission, for any eviction policy that is
:class:`policies.base.Tunable` (``set_alpha``), Marconi's and Marconi+'s. The window is the
*admission order*: the arrival order with ``engine=replay``, the completion order with
``engine=timed``. Window replays run through the same request step (without time, queueing or
pins), one fresh copy of the policy per alpha. The first eviction is the first admission that
evicted a node. Adoption is immediate: the grid search costs wall time, not simulated time
(the paper runs it asynchronously in seconds).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from policies.base import AdmissionPolicy, EvictionPolicy, Tunable
from simlab.cache import PrefixCache
from simlab.config import ConfigError
from simlab.nodes import InsertResult
from simlab.snapshot import CacheImage, pack, unpack
from simlab.step import RequestStep
from traces.format import Request

log = logging.getLogger(__name__)

OBJECTIVES = ("token_hit_rate", "flops_saved")
#: The paper's reference code used a multiplier of 5.
DEFAULT_GRID = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)


# ---------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class TuningSettings:
    """``policy.tuning`` (validated; a bad value raises ``ValueError`` naming the key)."""

    enabled: bool = False
    grid: tuple[float, ...] = DEFAULT_GRID
    bootstrap_multiplier: float = 5.0
    objective: str = "token_hit_rate"
    retune_every: int | None = None
    window: int | None = None
    workers: int = 2

    def __post_init__(self) -> None:
        grid = tuple(sorted({float(a) for a in self.grid}))
        object.__setattr__(self, "grid", grid)
        if not grid or not all(math.isfinite(a) and a >= 0 for a in grid):
            raise ValueError(f"policy.tuning.grid must be finite alphas >= 0, got {self.grid!r}")
        if not self.bootstrap_multiplier > 0:
            raise ValueError(
                f"policy.tuning.bootstrap_multiplier must be > 0, got {self.bootstrap_multiplier!r}"
            )
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"policy.tuning.objective must be one of {OBJECTIVES}, got {self.objective!r}"
            )
        for key, nullable in (("retune_every", True), ("window", True), ("workers", False)):
            _check_count(key, getattr(self, key), nullable)

    @classmethod
    def from_config(cls, cfg: Any) -> TuningSettings | None:
        """Settings from a ``policy.tuning`` mapping (or settings); None when disabled/absent."""
        if cfg is None:
            return None
        if isinstance(cfg, TuningSettings):
            return cfg if cfg.enabled else None
        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
        if not isinstance(cfg, Mapping):
            raise ValueError(f"policy.tuning must be a mapping, got {cfg!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ValueError(f"policy.tuning: unknown key(s) {unknown}; known: {sorted(known)}")
        values = dict(cfg)
        if "grid" in values:
            values["grid"] = tuple(values["grid"] or ())
        settings = cls(**values)
        return settings if settings.enabled else None


def _check_count(key: str, value: Any, nullable: bool) -> None:
    """``policy.tuning.KEY`` must be an integer >= 1 (or null when ``nullable``)."""
    if (value is None and nullable) or (isinstance(value, int) and value >= 1):
        return
    null = " or null" if nullable else ""
    raise ValueError(f"policy.tuning.{key} must be an integer >= 1{null}, got {value!r}")


# ---------------------------------------------------------------------------------- snapshot
def snapshot(cache: PrefixCache) -> PrefixCache:
    """An independent copy of ``cache`` with no pins."""
    return unpack(pack(cache))


# ---------------------------------------------------------------------------------- replay
@dataclass
class WindowResult:
    hit_tokens: int = 0
    input_tokens: int = 0
    flops_saved: float = 0.0

    def objective(self, name: str) -> float:
        if name == "token_hit_rate":
            return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0
        return self.flops_saved


def replay_window(
    cache: PrefixCache,
    requests: Sequence[Request],
    admission: AdmissionPolicy,
    eviction: EvictionPolicy,
) -> WindowResult:
    """Replay ``requests`` on ``cache`` through the one request step."""
    step = RequestStep(cache, admission, eviction, "alpha-tuning")
    result = WindowResult()
    for req in requests:
        record = step.serve(req)
        result.hit_tokens += record.hit_tokens
        result.input_tokens += record.input_tokens
        result.flops_saved += record.flops_saved
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


def with_alpha(template: EvictionPolicy, alpha: float) -> EvictionPolicy:
    """A fresh copy of the (never run) ``template`` policy with ``alpha`` set."""
    policy = copy.deepcopy(template)
    policy.set_alpha(alpha)  # type: ignore[attr-defined]
    return policy


def evaluate(
    image: CacheImage,
    window: Sequence[Request] | WindowImage,
    admission: AdmissionPolicy,
    template: Any,
    alphas: Sequence[float],
    objective: str,
) -> list[float]:
    """Objective of each alpha: the window replayed on a fresh copy of the snapshot."""
    if isinstance(window, WindowImage):
        window = window.requests()
    return [
        replay_window(unpack(image), window, admission, with_alpha(template, a)).objective(
            objective
        )
        for a in alphas
    ]


def grid_scores(
    image: CacheImage,
    window: Sequence[Request],
    admission: AdmissionPolicy,
    template: Any,
    settings: TuningSettings,
) -> dict[float, float]:
    """Objective per grid alpha; worker processes take round-robin shares of the grid (each
    replay is a pure function of snapshot, window and alpha: the scores do not depend on
    ``workers``; inside a joblib worker, joblib runs the shares in threads)."""
    grid = list(settings.grid)
    n = min(settings.workers, len(grid))
    shares = [grid[i::n] for i in range(n)]
    if n == 1:
        results = [evaluate(image, window, admission, template, shares[0], settings.objective)]
    else:
        from joblib import Parallel, delayed

        args = (image, WindowImage.pack(window), admission, template)
        results = Parallel(n_jobs=n)(
            delayed(evaluate)(*args, share, settings.objective) for share in shares
        )
    scores: dict[float, float] = {}
    for share, values in zip(shares, results, strict=True):
        scores.update(zip(share, values, strict=True))
    return {a: scores[a] for a in grid}


def best_alpha(scores: Mapping[float, float]) -> float:
    """The alpha with the highest objective; ties go to the smallest alpha."""
    return min(scores, key=lambda a: (-scores[a], a))


# ---------------------------------------------------------------------------------- tuner
@dataclass
class AlphaTuner:
    """Bookkeeping of the protocol in the module docstring; see :meth:`observe`.

    ``template`` is the eviction policy, as built and never run, that the grid search copies
    once per alpha.
    ``history`` lists each adopted alpha with the 0-based admission index of the first request
    that runs under it.
    """

    settings: TuningSettings
    template: EvictionPolicy
    seen: int = 0
    evicted: bool = False
    bootstrap_requests: int | None = None  # N: requests seen up to the first eviction
    first_eviction: int | None = None  # admissions when the first snapshot was taken
    window: int | None = None  # replay window length of later re-tunes
    history: list[dict[str, Any]] = field(default_factory=lambda: [{"request": 0, "alpha": 0.0}])
    tuning_wall_s: float = 0.0
    snapshot_wall_s: float = 0.0
    _tunes: list[int] = field(default_factory=list)  # upcoming tune points (admission counts)
    _pending: dict[int, tuple[int, CacheImage, Any]] = field(default_factory=dict)
    _recent: deque[Request] = field(default_factory=deque)
    _next_snap: int = 0  # index into the schedule of the next snapshot to take

    @classmethod
    def for_policy(cls, tuning: Any, eviction: EvictionPolicy, policy: str) -> AlphaTuner | None:
        """The tuner a policy's ``tuning`` config asks for (None when off); sets the policy's
        alpha to 0 for the bootstrap period (:class:`ConfigError` if it cannot be tuned)."""
        try:
            settings = TuningSettings.from_config(tuning)
        except ValueError as err:
            raise ConfigError(f"policy {policy!r}: {err}") from err
        if settings is None:
            return None
        if not isinstance(eviction, Tunable):
            raise ConfigError(
                f"policy {policy!r}: tuning.enabled needs an eviction policy with set_alpha "
                f"({type(eviction).__name__} has none)"
            )
        template = copy.deepcopy(eviction)
        eviction.set_alpha(0.0)
        return cls(settings, template)

    def observe(self, step: RequestStep, request: Request, admitted: InsertResult) -> None:
        """Controller hook after each admission: account it, adopt a tuned alpha."""
        self.evicted = self.evicted or admitted.evicted_nodes > 0
        alpha = self.account(step.cache, request, step.admission)
        if alpha is not None:
            step.eviction.set_alpha(alpha)  # type: ignore[attr-defined]

    def account(self, cache: PrefixCache, req: Request, admission: AdmissionPolicy) -> float | None:
        """Account one admitted request; returns the new alpha when one is adopted."""
        self.seen += 1
        if self.first_eviction is None:
            if not self.evicted:
                return None
            self._start(cache)
        else:
            self._recent.append(req)
        self._take_snapshots(cache, admission)
        if self._tunes and self.seen == self._tunes[0]:
            return self._tune(self._tunes.pop(0))
        return None

    # -- schedule
    def _start(self, cache: PrefixCache) -> None:
        s = self.settings
        self.bootstrap_requests = self.first_eviction = self.seen
        first_window = max(1, round(s.bootstrap_multiplier * self.seen))
        self.window = s.window or first_window
        self._recent = deque(maxlen=max(self.window, first_window))
        self._tunes = [self.seen + first_window]
        log.info(
            "alpha tuning: first eviction after %d requests; bootstrap window %d requests",
            self.seen,
            first_window,
        )

    def _snapshot_at(self, tune: int) -> int:
        """Admission count at which the window of the tune at ``tune`` starts."""
        assert self.first_eviction is not None and self.window is not None
        if tune == self._first_tune:
            return self.first_eviction
        return max(tune - self.window, self.first_eviction)

    @property
    def _first_tune(self) -> int:
        assert self.first_eviction is not None and self.bootstrap_requests is not None
        return self.first_eviction + max(
            1, round(self.settings.bootstrap_multiplier * self.bootstrap_requests)
        )

    def _schedule(self, j: int) -> int:
        """Admission count of the ``j``-th tune (0 = the bootstrap one)."""
        every = self.settings.retune_every
        return self._first_tune + j * (every or 0)

    def _take_snapshots(self, cache: PrefixCache, admission: Any) -> None:
        every = self.settings.retune_every
        while True:
            j = self._next_snap
            if j > 0 and every is None:
                return
            tune = self._schedule(j)
            if self._snapshot_at(tune) != self.seen:
                return
            start = time.perf_counter()
            self._pending[tune] = (self.seen, pack(cache), _copy_admission(admission))
            self.snapshot_wall_s += time.perf_counter() - start
            if j > 0 and tune not in self._tunes:
                self._tunes.append(tune)
            self._next_snap += 1

    # -- grid search
    def _tune(self, tune: int) -> float:
        start_at, image, admission = self._pending.pop(tune)
        window = list(self._recent)[len(self._recent) - (tune - start_at) :]
        start = time.perf_counter()
        scores = grid_scores(image, window, admission, self.template, self.settings)
        elapsed = time.perf_counter() - start
        self.tuning_wall_s += elapsed
        return self._adopt(tune, start_at, scores, elapsed)

    def _adopt(self, tune: int, start_at: int, scores: dict[float, float], elapsed: float) -> float:
        """The grid search's winner, recorded in the history (and the log)."""
        alpha, objective = best_alpha(scores), self.settings.objective
        self.history.append(
            {
                "request": tune,
                "alpha": alpha,
                "window": [start_at, tune],
                "objective": objective,
                "scores": {repr(a): v for a, v in scores.items()},
            }
        )
        grid = ", ".join(f"{a:g}: {v:.4g}" for a, v in scores.items())
        log.info("alpha tuning at request %d: window [%d, %d), %s %s -> alpha %g (%.2f s)",
                 tune, start_at, tune, objective, grid, alpha, elapsed)  # fmt: skip
        return alpha

    def summary(self) -> dict[str, Any]:
        """Items for the policy's run summary (``summary.json``)."""
        return {
            "alpha_final": self.history[-1]["alpha"],
            "alpha_tunings": len(self.history) - 1,
            "alpha_history": self.history,
            "bootstrap_requests": self.bootstrap_requests,
            "tuning_wall_s": self.tuning_wall_s,
            "snapshot_wall_s": self.snapshot_wall_s,
        }


def _copy_admission(admission: Any) -> Any:
    """The admission policy as it is now (dataclass policies are copied, others shared)."""
    if dataclasses.is_dataclass(admission) and not isinstance(admission, type):
        return dataclasses.replace(admission)
    return admission
