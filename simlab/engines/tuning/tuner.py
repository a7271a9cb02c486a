"""The alpha tuner: the engine-level controller that follows the protocol
(:mod:`simlab.engines.tuning`), snapshots the cache at each window's start and adopts the grid
search's alpha."""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from simlab.cache.contract import AdmissionPolicy, EvictionPolicy, Tunable
from simlab.cache.nodes import InsertResult
from simlab.cache.prefix import PrefixCache
from simlab.cache.snapshot import CacheImage, pack
from simlab.config import ConfigError
from simlab.engines.step import RequestStep
from simlab.engines.tuning.search import choose_alpha, grid_results, warm_up
from simlab.engines.tuning.settings import TuningSettings
from simlab.engines.tuning.window import WindowResult, empty_like
from traces.format import Request

log = logging.getLogger(__name__)

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
    """Bookkeeping of the protocol (:mod:`simlab.engines.tuning`); see :meth:`observe`.

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
    policy: str = "policy"  # its name, in the caveats
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
        return cls(settings, template, policy)

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
        length = s.first_window or max(1, round(s.bootstrap_multiplier * n))
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

    def caveats(self) -> list[str]:
        """One line per way the run fell short of the tuning it was asked for: no tuning at all,
        or fewer than ``min_tunings`` (empty when it tuned enough)."""
        tunings, wanted = len(self.history) - 1, self.settings.min_tunings
        if tunings >= wanted:
            return []
        if tunings == 0:
            head, tail = "alpha never tuned", f"alpha stayed {self.alpha}"
        else:
            head = f"alpha tuned {tunings} time(s), fewer than policy.tuning.min_tunings {wanted}"
            tail = f"alpha {self.alpha} at the end"
        if self.first_tune is None:
            why = (
                f"no admission evicted in the run's {self.seen:,} requests (the cache never filled)"
            )
        elif self.first_tune > self.seen:
            why = (
                f"the first tuning window [{self._origin}, {self.first_tune}) ends past the "
                f"run's {self.seen:,} requests"
            )
            tail += " (policy.tuning.first_window sets a shorter one)"
        else:
            every = self.settings.retune_every
            why = f"first tuning at request {self.first_tune} of the run's {self.seen:,}"
            why += f", then every {every}" if every else ", never re-tuned (retune_every null)"
        return [f"{head}: {why}; {tail}"]

    def summary(self) -> dict[str, Any]:
        """Items for the policy's run summary (``summary.json``; the request step adds
        ``caveats`` to its admission's); logs each caveat as a WARNING."""
        alphas = [float(h["alpha"]) for h in self.history]
        caveats = self.caveats()
        for caveat in caveats:
            log.warning("%s: %s", self.policy, caveat)
        return {
            "alpha": {
                "final": self.alpha,
                "min": min(alphas[1:] or alphas),
                "max": max(alphas[1:] or alphas),
                "tunings": len(alphas) - 1,
                "tuned": len(alphas) > 1,
            },
            "caveats": caveats,
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
