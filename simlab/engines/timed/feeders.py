"""Where a timed world's requests come from: the :class:`Feeder` protocol, chat sessions
(:class:`SessionFeeder`) and a benchmark client at a fixed concurrency
(:class:`ConcurrencyFeeder`); a planned batch is :mod:`simlab.engines.offline`'s."""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from simlab.engines.timed.jobs import Job

if TYPE_CHECKING:
    from simlab.engines.records import RequestRecord
    from simlab.engines.timed.world import TimedWorld
    from traces.format import Request

TOKENS_PER_WORD = 1.33  # cl100k on English prose; converts tokens to words for typing time


class Feeder(Protocol):
    """Where a timed world's requests come from (chat sessions, or an offline batch).

    ``processes(world)``: SimPy generators that submit jobs; the world ends once they all
    returned and every submitted job completed. ``ready(job)``: whether a queued job may be
    scheduled now (FCFS: a job that is not ready holds the queue). ``finished(job, record)``:
    called after a job's admission with its record; False for engine-made work that gets no
    record of its own (the feeder charges what it computed to a record it keeps).
    """

    def processes(self, world: TimedWorld) -> list[Generator[Any, Any, None]]: ...

    def ready(self, job: Job) -> bool: ...

    def finished(self, job: Job, record: RequestRecord) -> bool: ...


@dataclass
class SessionFeeder:
    """Chat sessions: request ``k+1`` of a session arrives a think time after request ``k``
    completes (see :mod:`simlab.engines.timed.world`)."""

    requests: Sequence[Request]
    typing_wpm: float | None = None

    def processes(self, world: TimedWorld) -> list[Generator[Any, Any, None]]:
        return [self._session(world, turns) for turns in sessions(self.requests)]

    def ready(self, job: Job) -> bool:
        return True

    def finished(self, job: Job, record: RequestRecord) -> bool:
        return True

    def _session(self, world: TimedWorld, turns: list[Request]) -> Generator[Any, Any, None]:
        env = world.env
        yield env.timeout(turns[0].arrival)
        for k, req in enumerate(turns):
            if k:
                yield env.timeout(self._think(turns[k - 1], req))
            yield world.submit(Job(req=req, arrival=env.now, done=env.event())).done

    def _think(self, prev: Request, req: Request) -> float:
        """Gap between a request's completion and the session's next request."""
        if self.typing_wpm is None:
            return max(req.arrival - prev.arrival, 0.0)
        new_tokens = max(req.input_tokens - prev.input_tokens - prev.output_len, 0)
        return new_tokens / TOKENS_PER_WORD / self.typing_wpm * 60.0


@dataclass
class ConcurrencyFeeder:
    """A serving benchmark at ``--max-concurrency C --request-rate inf`` (vLLM's and SGLang's
    ``bench_serving``): every request is ready at time 0, at most ``concurrency`` are in flight,
    and the next one in order is sent the moment one completes. The first ``concurrency``
    therefore arrive together (the burst that starts every such run); the rest are paced by
    completions. Sessions and arrival times in ``requests`` are ignored."""

    requests: Sequence[Request]
    concurrency: int

    def processes(self, world: TimedWorld) -> list[Generator[Any, Any, None]]:
        pending = deque(self.requests)
        slots = min(self.concurrency, len(pending))
        return [self._client(world, pending) for _ in range(slots)]

    def ready(self, job: Job) -> bool:
        return True

    def finished(self, job: Job, record: RequestRecord) -> bool:
        return True

    def _client(self, world: TimedWorld, pending: deque[Request]) -> Generator[Any, Any, None]:
        env = world.env
        while pending:
            req = pending.popleft()
            yield world.submit(Job(req=req, arrival=env.now, done=env.event())).done


def session_feeder(requests: Sequence[Request], typing_wpm: float | None = None) -> Feeder:
    """The feeder of a trace's sessions: an agentic trace's session graph
    (:class:`simlab.engines.timed.agents.AgentFeeder`), else :class:`SessionFeeder`."""
    if requests and requests[0].agent is not None:
        from simlab.engines.timed.agents import AgentFeeder

        return AgentFeeder(requests)
    return SessionFeeder(requests, typing_wpm)


def sessions(requests: Sequence[Request]) -> list[list[Request]]:
    """Requests grouped by session, turns in order, sessions by first arrival."""
    by_session: dict[int, list[Request]] = {}
    for req in requests:
        by_session.setdefault(req.session_id, []).append(req)
    groups = [sorted(turns, key=lambda r: r.turn) for turns in by_session.values()]
    return sorted(groups, key=lambda t: (t[0].arrival, t[0].session_id))
