"""Marconi's retrospective tuning of ``alpha`` (paper Sec. 4.2, "Managing the balance").

``policy.tuning.protocol`` selects a whole protocol (:data:`PROTOCOLS`); every other
``policy.tuning`` key left null takes that protocol's value, an explicit value overrides it.

Common to every protocol. ``alpha = 0`` (recency only) until the first tuning. ``N`` is the
number of requests seen up to and including the one whose admission first evicted a node. A
tuning replays a *window* of requests on copies of a snapshot of the cache taken at the
window's start, one copy per grid alpha (in parallel across ``workers`` processes: this one
and ``workers - 1`` workers, :func:`grid_results`), scores each
replay on ``objective`` over its last ``score_last`` requests (all of them when null) and
adopts the winner for every later request. Invariants: 0 is always in the grid (a grid without
it is rejected), so recency only is always a candidate; the adopted alpha scores at least as well
on the window as the alpha it replaces, and as alpha 0 up to ``margin`` (exactly, with the
default margin 0); ties go to the smallest alpha, so the
result never depends on the number of workers or their order; the same seed gives the same run.

``paper``: what the Marconi reference code does (``../shared/notes/marconi_reference.md``
Sec. 2.5; ``radix_cache_hybrid.py``, ``config_tuner.py``).

* ``snapshot: start``: the snapshot is the *empty* cache before the first request, and the
  window is the first ``max(N, round(bootstrap_multiplier x N))`` requests of the trace, from its
  start. ``bootstrap_multiplier`` 5 (the reference sets 15 for LMSys).
* Each alpha replays the whole window from the empty snapshot and is scored on its last
  ``score_last: 500`` requests, objective ``flops_saved``; grid 0, 0.1, ..., 2.0 (21 values).
* Tuned exactly once (``retune_every: null``); if the trace ends before the window fills,
  ``alpha`` stays 0.
* Deviation: the reference breaks ties between equally scored alphas by its worker processes'
  completion order (nondeterministic, and ties are common); simlab takes the smallest alpha.
* The paper's *text* differs from its code: it snapshots at the first eviction and replays the
  bootstrap requests from there (``snapshot: first_eviction``), and adopts the alpha that
  maximises the hit rate (``objective: token_hit_rate``), over the whole window.

``robust`` (the default): grid 0, 0.1, ..., 1.0 (:data:`ROBUST_GRID` says why not above 1);
``snapshot: first_eviction``, so the first window is the ``round(bootstrap_multiplier x N)``
requests after the first eviction (multiplier 5), replayed from the cache as it was then;
objective ``token_hit_rate`` on the last ``score_last: 50`` requests of each replay; re-tuned
every ``retune_every: 50`` requests on the last ``window`` requests (default: the first window's
length), replayed from a snapshot taken at their start (never earlier than the first eviction); hysteresis: the alpha in
force (the *incumbent*, scored like every grid alpha) is kept unless another beats it by more
than ``margin`` (default 0: a tie keeps it), in the objective's share (token hit rate, or FLOPs
saved / prefill FLOPs of the scored requests). Why each of these: :data:`PROTOCOLS`. That tuned
Marconi stays within 0.5 points of SGLang+'s token hit rate is measured, not guaranteed: a
window replay cannot see what the cache it leaves behind is worth.

Snapshot (:func:`simlab.cache.snapshot.pack` / :func:`simlab.cache.snapshot.unpack`). A :class:`CacheImage` is the cache as plain data: its
attributes with every per-slot array copied and each tree node flattened to a row whose
parent/children are slot numbers. Packing is iterative (no recursion, so no depth limit, unlike
``copy.deepcopy`` or ``pickle`` of a deep tree) and shares the token arrays, which the cache never
writes in place. Pins are cleared: a replay has nothing in flight. The ``start`` snapshot is an
empty cache of the same shape (:func:`empty_like`).

The tuner is an engine-level controller (:class:`simlab.engines.step.Controller`): the request step
calls :meth:`AlphaTuner.observe` after every admission, for any eviction policy that is
:class:`simlab.cache.contract.Tunable` (``set_alpha``), Marconi's and Marconi+'s. The window is the
*admission order*: the arrival order with ``engine=replay``, the completion order with
``engine=timed``. Window replays run through the same request step (without time, queueing or
pins), one fresh copy of the policy per alpha. The first eviction is the first admission that
evicted a node. Adoption is immediate: the grid search costs wall time, not simulated time
(the paper runs it asynchronously in seconds).
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from simlab.cache.contract import AdmissionPolicy, EvictionPolicy, Tunable
from simlab.cache.nodes import InsertResult
from simlab.cache.prefix import PrefixCache
from simlab.cache.snapshot import CacheImage, pack, unpack
from simlab.config import ConfigError
from simlab.engines.records import RequestRecord
from simlab.engines.step import RequestStep
from simlab.util.collector import collector_paused
from traces.format import Request

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

log = logging.getLogger(__name__)

OBJECTIVES = ("token_hit_rate", "flops_saved")
SNAPSHOTS = ("start", "first_eviction")
#: The reference code's grid (``ConfigTuner.tune_config``): 0, 0.1, ..., 2.0.
PAPER_GRID = tuple(round(0.1 * i, 1) for i in range(21))
#: 0, 0.1, ..., 1.0. Both terms of Marconi's utility are min-max normalised over the candidates,
#: so with alpha > 1 the most FLOP-efficient candidate outlives even the most recent one however
#: old it is: stale long prefixes are never evicted. Measured (replay, fixed alpha, 29 points of
#: ShareGPT, SWE-bench and LMSys): the best alpha <= 1 beats the best alpha > 1 at every point
#: (by 0.3 to 39 points of token hit rate), and every alpha in 1.1-2.0 is below SGLang+ at 17 of
#: the 18 ShareGPT points and at all 8 SWE-bench ones (by up to 45 points), yet a short replay
#: window rates them well (it is too short to see the cache fill with stale prefixes): that is
#: how the paper's protocol lands 20 points below SGLang+.
ROBUST_GRID = PAPER_GRID[:11]

#: Each protocol's value of every ``policy.tuning`` key that the config leaves null. ``robust``
#: is the measured default: tuned Marconi within 0.5 points of SGLang+'s token hit rate at every
#: point of the Figs. 7-8 grids and Fig. 11 (ShareGPT, LMSys, SWE-bench; README "Alpha
#: tuning"). It re-tunes every 50 requests so that a choice that stopped paying is replaced
#: soon, and scores each replay on its last 50 requests only: the whole window is replayed to
#: build the cache each alpha would leave, but its early requests say how an alpha did, not what
#: its cache is worth next. Scoring the whole window let an alpha that wins a thrashing window
#: (SWE-bench at high contention) leave a cache worth less for the long requests after it: 14
#: of the 72 SWE-bench points fell more than 0.5 points below SGLang+ (worst -4.0). A ``margin``
#: (0.005 and 0.01 measured) did not lower the worst point, so it is 0.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "paper": {
        "grid": PAPER_GRID,
        "bootstrap_multiplier": 5.0,
        "objective": "flops_saved",
        "snapshot": "start",
        "score_last": 500,
        "retune_every": None,
        "window": None,
        "margin": 0.0,
    },
    "robust": {
        "grid": ROBUST_GRID,
        "bootstrap_multiplier": 5.0,
        "objective": "token_hit_rate",
        "snapshot": "first_eviction",
        "score_last": 50,
        "retune_every": 50,
        "window": None,
        "margin": 0.0,
    },
}


# ---------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class TuningSettings:
    """``policy.tuning``, resolved against its protocol and validated (a bad value raises
    ``ValueError`` naming the key). Build it with :meth:`resolve` (or :meth:`from_config`): the
    field defaults are the ``robust`` protocol's."""

    enabled: bool = False
    protocol: str = "robust"
    grid: tuple[float, ...] = ROBUST_GRID
    bootstrap_multiplier: float = PROTOCOLS["robust"]["bootstrap_multiplier"]
    objective: str = PROTOCOLS["robust"]["objective"]
    snapshot: str = PROTOCOLS["robust"]["snapshot"]
    score_last: int | None = PROTOCOLS["robust"]["score_last"]
    retune_every: int | None = PROTOCOLS["robust"]["retune_every"]
    window: int | None = PROTOCOLS["robust"]["window"]
    margin: float = PROTOCOLS["robust"]["margin"]
    workers: int = 2

    def __post_init__(self) -> None:
        _check_choice("protocol", self.protocol, tuple(PROTOCOLS))
        object.__setattr__(self, "grid", _checked_grid(self.grid))
        if not (_is_number(self.bootstrap_multiplier) and self.bootstrap_multiplier > 0):
            raise ValueError(
                f"policy.tuning.bootstrap_multiplier must be > 0, got {self.bootstrap_multiplier!r}"
            )
        _check_choice("objective", self.objective, OBJECTIVES)
        _check_choice("snapshot", self.snapshot, SNAPSHOTS)
        if not (_is_number(self.margin) and 0 <= self.margin < math.inf):
            raise ValueError(f"policy.tuning.margin must be a number >= 0, got {self.margin!r}")
        for key, nullable in (
            ("score_last", True),
            ("retune_every", True),
            ("window", True),
            ("workers", False),
        ):
            _check_count(key, getattr(self, key), nullable)

    @classmethod
    def resolve(cls, **values: Any) -> TuningSettings:
        """Settings of ``values`` (``policy.tuning`` keys); null/absent keys take the value of
        ``protocol`` (default ``robust``)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"policy.tuning: unknown key(s) {unknown}; known: {sorted(known)}")
        protocol = values.get("protocol") or "robust"
        _check_choice("protocol", protocol, tuple(PROTOCOLS))
        given = {k: v for k, v in values.items() if v is not None}
        if "grid" in given:
            given["grid"] = tuple(given["grid"])
        return cls(**(PROTOCOLS[protocol] | given | {"protocol": protocol}))

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
        settings = cls.resolve(**{str(k): v for k, v in cfg.items()})
        return settings if settings.enabled else None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"policy.tuning.{key} must be one of {allowed}, got {value!r}")


def _checked_grid(grid: Any) -> tuple[float, ...]:
    """The grid sorted and deduplicated: finite alphas >= 0, 0 among them."""
    try:
        alphas = tuple(sorted({float(a) for a in grid}))
    except (TypeError, ValueError):
        raise ValueError(f"policy.tuning.grid must be a list of alphas, got {grid!r}") from None
    if not alphas or not all(math.isfinite(a) and a >= 0 for a in alphas):
        raise ValueError(f"policy.tuning.grid must be finite alphas >= 0, got {list(grid)!r}")
    if alphas[0] != 0.0:
        raise ValueError(
            "policy.tuning.grid must contain 0 (recency only: the alpha of the bootstrap "
            f"period, always a candidate), got {list(grid)!r}"
        )
    return alphas


def _check_count(key: str, value: Any, nullable: bool) -> None:
    """``policy.tuning.KEY`` must be an integer >= 1 (or null when ``nullable``)."""
    if value is None and nullable:
        return
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return
    null = " or null" if nullable else ""
    raise ValueError(f"policy.tuning.{key} must be an integer >= 1{null}, got {value!r}")


# ---------------------------------------------------------------------------------- snapshot
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


# ---------------------------------------------------------------------------------- replay
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
    score_last: int | None = None,
) -> list[WindowResult]:
    """Each alpha's result: the window replayed on a fresh copy of the snapshot (dismantled
    once replayed: :meth:`simlab.cache.prefix.PrefixCache.dismantle`)."""
    if isinstance(window, WindowImage):
        window = window.requests()
    results = []
    with collector_paused():  # in a worker process too
        for alpha in alphas:
            cache = unpack(image)
            policy = with_alpha(template, alpha)
            results.append(replay_window(cache, window, admission, policy, score_last))
            cache.dismantle()
    return results


def grid_results(
    image: CacheImage,
    window: Sequence[Request],
    admission: AdmissionPolicy,
    template: Any,
    settings: TuningSettings,
) -> dict[float, WindowResult]:
    """Result per grid alpha. The grid is dealt round-robin into ``workers`` shares: this
    process replays the first while ``workers - 1`` worker processes (:func:`worker_pool`)
    replay the others; while the workers are still starting (the first tuning may come
    before they have imported simlab), and in a process that is itself a joblib worker (a
    sweep's point), every share runs here, one after the other. Each replay is a pure
    function of snapshot, window and alpha, so the results depend on neither."""
    grid = list(settings.grid)
    n = min(settings.workers, len(grid))
    shares = [grid[i::n] for i in range(n)]
    pool = worker_pool(n - 1)
    futures = []
    if pool is not None:
        args = (image, WindowImage.pack(window), admission, template)
        futures = [pool.submit(evaluate, *args, share, settings.score_last) for share in shares[1:]]
    here = shares if pool is None else shares[:1]
    results = [evaluate(image, window, admission, template, s, settings.score_last) for s in here]
    results += [future.result() for future in futures]
    out: dict[float, WindowResult] = {}
    for share, values in zip(shares, results, strict=True):
        out.update(zip(share, values, strict=True))
    return {a: out[a] for a in grid}


#: the grid search's worker processes: their count -> (the pool, its first task's future),
#: kept for the whole run
_POOLS: dict[int, tuple[Executor, Future[None]]] = {}


def worker_pool(processes: int, wait: bool = False) -> Executor | None:
    """A pool of ``processes`` worker processes, started by the first call and kept between
    tunings (each worker imports simlab once per run), private to the grid search (joblib's
    own reusable pool, which a sweep launcher may hold, is left alone). None when
    ``processes`` < 1, when this process is itself a joblib worker (joblib would run nested
    work in threads: no faster here), and while the workers are starting, unless ``wait``."""
    from joblib.externals.loky import ProcessPoolExecutor  # joblib: imported when tuning
    from joblib.parallel import get_active_backend

    if processes < 1 or get_active_backend()[0].nesting_level > 0:
        return None
    if processes not in _POOLS:
        for pool, _ in _POOLS.values():
            pool.shutdown(wait=False)
        _POOLS.clear()
        pool = ProcessPoolExecutor(max_workers=processes)
        atexit.register(pool.shutdown)  # before interpreter teardown, which loky's own misses
        _POOLS[processes] = (pool, pool.submit(_ready))
    pool, ready = _POOLS[processes]
    if wait:
        ready.result()
    return pool if ready.done() else None


def _ready() -> None:
    """A no-op task: unpickling it makes a new worker import this module (and simlab)."""


def warm_up(settings: TuningSettings) -> None:
    """Start the grid search's worker processes now, in the background."""
    worker_pool(min(settings.workers, len(settings.grid)) - 1)


def best_alpha(scores: Mapping[float, float]) -> float:
    """The alpha with the highest objective; ties go to the smallest alpha."""
    return min(scores, key=lambda a: (-scores[a], a))


def choose_alpha(
    results: Mapping[float, WindowResult], objective: str, incumbent: float, margin: float
) -> float:
    """:func:`best_alpha`, unless it does not beat ``incumbent`` (when scored) by more than
    ``margin`` in the objective's share: then the incumbent is kept. With ``margin`` 0 a tie
    with the incumbent keeps it."""
    best = best_alpha({a: r.objective(objective) for a, r in results.items()})
    if incumbent not in results or best == incumbent:
        return best
    gain = results[best].share(objective) - results[incumbent].share(objective)
    return best if gain > margin else incumbent


# ---------------------------------------------------------------------------------- tuner
Image = tuple[Any, Any]  # a snapshot (a CacheImage, or Imaging's) and the admission then
#: the grid search: (snapshot, window, admission, template, settings) -> result per grid alpha
Search = Callable[[Any, Sequence[Request], Any, Any, TuningSettings], dict[float, WindowResult]]


def _empty_image(cache: PrefixCache) -> CacheImage:
    return pack(empty_like(cache))


@dataclass(frozen=True)
class Imaging:
    """How a tuner snapshots the cache it is shown and searches the grid from a snapshot: the
    request step's :class:`~simlab.cache.prefix.PrefixCache` by default (:func:`simlab.cache.snapshot.pack`,
    :func:`grid_results` across ``policy.tuning.workers``); a compiled replay
    (:mod:`simlab.fastpaths.radix.kernel`) gives its own, over its own state. ``workers``: whether the
    search uses the grid search's worker processes (started at the first eviction)."""

    snapshot: Callable[[Any], Any] = pack
    empty: Callable[[Any], Any] = _empty_image
    search: Search = grid_results
    workers: bool = True


CACHE_IMAGING = Imaging()


@dataclass
class AlphaTuner:
    """Bookkeeping of the protocol in the module docstring; see :meth:`observe`.

    Schedule, in admission counts: the first tuning at ``first_tune`` replays
    ``[origin, first_tune)`` (origin 0 or N); with ``retune_every = K`` the tuning at
    ``t = first_tune + j K`` replays ``[max(t - window, N), t)``. Snapshots are taken exactly at
    those window starts and shared by the tunings that start there; one is dropped once no later
    window starts at or before it.

    ``template`` is the eviction policy, as built and never run, that the grid search copies
    once per alpha.
    ``history`` lists each adopted alpha with the 0-based admission index of the first request
    that runs under it; a tuning's entry also has its ``window`` and ``scored`` admission ranges,
    the ``incumbent`` it was compared with and every grid alpha's ``scores``.
    """

    settings: TuningSettings
    template: EvictionPolicy
    seen: int = 0
    evicted: bool = False
    bootstrap_requests: int | None = None  # N: requests seen up to the first eviction
    first_tune: int | None = None  # admissions at the first tuning
    window: int | None = None  # replay window length of later re-tunes
    history: list[dict[str, Any]] = field(default_factory=lambda: [{"request": 0, "alpha": 0.0}])
    tuning_wall_s: float = 0.0
    snapshot_wall_s: float = 0.0
    imaging: Imaging = CACHE_IMAGING
    _images: dict[int, Image] = field(default_factory=dict)  # by window start (admissions)
    _recent: deque[Request] = field(default_factory=deque)

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

    @property
    def alpha(self) -> float:
        """The alpha in force."""
        return float(self.history[-1]["alpha"])

    def observe(self, step: RequestStep, request: Request, admitted: InsertResult) -> None:
        """Controller hook after each admission: account it, adopt a tuned alpha."""
        self.evicted = self.evicted or admitted.evicted_nodes > 0
        alpha = self.account(step.cache, request, step.admission)
        if alpha is not None:
            step.eviction.set_alpha(alpha)  # type: ignore[attr-defined]

    def account(self, cache: Any, req: Request, admission: AdmissionPolicy) -> float | None:
        """Account one admitted request; returns the new alpha when one is adopted. ``cache``:
        what :attr:`imaging` snapshots (the request step's cache by default)."""
        self.seen += 1
        from_start = self.settings.snapshot == "start"
        if self.seen == 1 and from_start:
            self._images[0] = (self.imaging.empty(cache), _copy_admission(admission))
        if self.bootstrap_requests is None:
            if from_start:
                self._recent.append(req)
            if not self.evicted:
                return None
            self._start()
        else:
            self._recent.append(req)
        if self._window_starts_at(self.seen):
            start = time.perf_counter()
            self._images[self.seen] = (self.imaging.snapshot(cache), _copy_admission(admission))
            self.snapshot_wall_s += time.perf_counter() - start
        return self._tune() if self._tunes_now() else None

    # -- schedule
    def _start(self) -> None:
        """The first eviction (``seen`` = N): schedule the first tuning."""
        s, n = self.settings, self.seen
        self.bootstrap_requests = n
        length = max(1, round(s.bootstrap_multiplier * n))
        if s.snapshot == "start":  # the first ``length`` requests of the trace (at least N)
            self.first_tune = max(n, length)
        else:  # the ``length`` requests after the first eviction
            self.first_tune = n + length
        first_window = self.first_tune - self._origin
        self.window = s.window or first_window
        self._recent = deque(self._recent, maxlen=max(self.window, first_window))
        if self.imaging.workers:
            warm_up(s)
        log.info(
            "alpha tuning (%s): first eviction after %d requests; first window [%d, %d)",
            s.protocol,
            n,
            self._origin,
            self.first_tune,
        )

    @property
    def _origin(self) -> int:
        """Admission count at which the first window starts (0, or N)."""
        assert self.bootstrap_requests is not None
        return 0 if self.settings.snapshot == "start" else self.bootstrap_requests

    def _window_start(self, tune: int) -> int:
        """Admission count at which the window of the tuning at ``tune`` starts."""
        assert self.bootstrap_requests is not None and self.window is not None
        if tune == self.first_tune:
            return self._origin
        return max(tune - self.window, self.bootstrap_requests)

    def _is_tune(self, t: int) -> bool:
        """Whether a tuning is scheduled at admission count ``t``."""
        first, every = self.first_tune, self.settings.retune_every
        assert first is not None
        return t == first or (every is not None and t > first and (t - first) % every == 0)

    def _window_starts_at(self, t: int) -> bool:
        """Whether some tuning's window starts at admission count ``t`` (its snapshot is taken
        then)."""
        assert self.bootstrap_requests is not None and self.window is not None
        n, every = self.bootstrap_requests, self.settings.retune_every
        if t == n:  # the first window after the first eviction, or a re-tune's
            return self._origin == n or every is not None
        later = t + self.window  # a re-tune whose window is a full ``window`` long
        return t > n and later != self.first_tune and self._is_tune(later)

    def _tunes_now(self) -> bool:
        return self.bootstrap_requests is not None and self._is_tune(self.seen)

    def next_event(self) -> int | None:
        """The next admission count, past ``seen``, at which :meth:`account` snapshots or tunes:
        a replay that runs requests in stretches (:mod:`simlab.fastpaths.radix.kernel`) stops there.
        None before the first eviction (it is not known yet) and once nothing is left."""
        if self.bootstrap_requests is None:
            return None
        first, every = self.first_tune, self.settings.retune_every
        assert first is not None
        if every is None and self.seen >= first:
            return None
        t = self.seen + 1
        while not (self._is_tune(t) or self._window_starts_at(t)):
            t += 1  # at most ``retune_every`` steps, or up to the first tuning
        return t

    # -- grid search
    def _tune(self) -> float:
        tune = self.seen
        start_at = self._window_start(tune)
        image, admission = self._images[start_at]
        later = self._window_start(tune + (self.settings.retune_every or 0))
        for key in [k for k in self._images if k < later or self.settings.retune_every is None]:
            del self._images[key]  # no later window starts there
        window = list(self._recent)[len(self._recent) - (tune - start_at) :]
        start = time.perf_counter()
        results = self.imaging.search(image, window, admission, self.template, self.settings)
        elapsed = time.perf_counter() - start
        self.tuning_wall_s += elapsed
        return self._adopt(tune, start_at, results, elapsed)

    def _adopt(
        self, tune: int, start_at: int, results: dict[float, WindowResult], elapsed: float
    ) -> float:
        """The grid search's choice (:func:`choose_alpha`), recorded in the history (and log)."""
        s, incumbent = self.settings, self.alpha
        alpha = choose_alpha(results, s.objective, incumbent, s.margin)
        scores = {a: r.objective(s.objective) for a, r in results.items()}
        scored = tune - min(tune - start_at, s.score_last or tune)
        self.history.append(
            {
                "request": tune,
                "alpha": alpha,
                "window": [start_at, tune],
                "scored": [scored, tune],
                "objective": s.objective,
                "incumbent": incumbent,
                "scores": {repr(a): v for a, v in scores.items()},
            }
        )
        grid = ", ".join(f"{a:g}: {v:.4g}" for a, v in scores.items())
        log.info("alpha tuning at request %d: window [%d, %d), %s %s -> alpha %g (%.2f s)",
                 tune, start_at, tune, s.objective, grid, alpha, elapsed)  # fmt: skip
        return alpha

    def summary(self) -> dict[str, Any]:
        """Items for the policy's run summary (``summary.json``)."""
        return {
            "alpha_protocol": self.settings.protocol,
            "alpha_final": self.alpha,
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
