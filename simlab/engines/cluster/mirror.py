"""The router's lagged view (``cluster.router_lag_s``): a replica's request step that replays its
cache operations on a twin, later."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import simpy

from simlab.engines.records import RequestRecord
from simlab.engines.step import RequestStep, Started, Timing
from traces.format import Request


class MirroredStep(RequestStep):
    """A replica's request step that replays each cache operation on ``twin`` ``lag`` seconds
    later (the router's lagged view). Invariant: at simulated time ``t`` the twin's cache is
    this cache as of ``t - lag``."""

    twin: RequestStep
    env: simpy.Environment
    lag: float
    _pending: dict[int, tuple[Started, list[Started]]]

    @classmethod
    def around(
        cls, step: RequestStep, twin: RequestStep, env: simpy.Environment, lag: float
    ) -> MirroredStep:
        """``step``'s cache and plug-ins, mirrored onto ``twin``."""
        mirrored = cls(
            step.cache, step.admission, step.eviction, step.policy, step.controllers, step.pool
        )
        mirrored.twin, mirrored.env, mirrored.lag, mirrored._pending = twin, env, lag, {}
        return mirrored

    def _later(self, op: Callable[[], Any]) -> None:
        self.env.timeout(self.lag).callbacks.append(lambda _event: op())

    def start(self, req: Request, pin: bool = True, refill: int = 0) -> Started:
        started = super().start(req, pin, refill)
        twin_started: list[Started] = []  # filled when the twin starts (the started is alive)
        self._pending[id(started)] = (started, twin_started)
        self._later(lambda: twin_started.append(self.twin.start(req, pin, refill)))
        return started

    def prefilled(self, started: Started, keep_room: bool = True) -> None:
        super().prefilled(started, keep_room)
        twin_started = self._pending[id(started)][1]
        self._later(lambda: self.twin.prefilled(twin_started[0], keep_room))

    def finish(self, started: Started, timing: Timing | None = None) -> RequestRecord:
        record = super().finish(started, timing)
        key = id(started)
        twin_started = self._pending[key][1]

        def replay() -> None:
            self.twin.finish(twin_started[0])
            del self._pending[key]

        self._later(replay)
        return record

    def abort(self, started: Started) -> None:
        super().abort(started)
        key = id(started)
        twin_started = self._pending[key][1]

        def replay() -> None:
            self.twin.abort(twin_started[0])
            del self._pending[key]

        self._later(replay)
