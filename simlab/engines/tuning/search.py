"""The grid search: a window replayed once per grid alpha on copies of a snapshot, across
worker processes, and the choice of alpha from the results."""

from __future__ import annotations

import atexit
import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from simlab.cache.contract import AdmissionPolicy, EvictionPolicy
from simlab.cache.snapshot import CacheImage, unpack
from simlab.engines.tuning.settings import TuningSettings
from simlab.engines.tuning.window import WindowImage, WindowResult, replay_window
from simlab.util.collector import collector_paused
from traces.format import Request

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future


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
