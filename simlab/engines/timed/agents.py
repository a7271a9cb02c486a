"""Agent sessions on the timed engine: sub-agents as a dependency graph (:class:`AgentFeeder`).

An agentic trace (:mod:`traces.agents`) carries each request's place in its session graph
(``Request.agent``). Here a session is a SimPy process: before its turn ``k`` it starts the
sub-agents spawned at that marker as processes of their own (siblings run concurrently) and
waits until all have finished; each request then leaves at its anchor + delay (the moment it
became ready, its session's start, or its previous request's send), never before it is ready,
and the session waits for its answer before going on. So time spent waiting on sub-agents shows
in the parent's timeline. Root sessions start at their first request's arrival (the arrival
process), or, with ``users`` > 0, a closed loop: that many users each take the next
conversation as soon as their last one ended.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simlab.engines.timed.jobs import Job

if TYPE_CHECKING:
    from simlab.engines.records import RequestRecord
    from simlab.engines.timed.world import TimedWorld
    from traces.format import AgentStep, Request


@dataclass
class AgentFeeder:
    """The :class:`simlab.engines.timed.feeders.Feeder` of an agentic trace."""

    requests: Sequence[Request]
    turns: dict[int, list[Request]] = field(init=False, default_factory=dict)
    children: dict[tuple[int, int], list[int]] = field(init=False, default_factory=dict)
    roots: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        for req in sorted(self.requests, key=lambda r: (r.session_id, r.turn)):
            self.turns.setdefault(req.session_id, []).append(req)
        for sid, turns in self.turns.items():
            step = _step(turns[0])
            if step.parent_session < 0:
                self.roots.append(sid)
            else:
                self.children.setdefault((step.parent_session, step.spawn_turn), []).append(sid)
        self.roots.sort(key=lambda s: (self.turns[s][0].arrival, s))

    def processes(self, world: TimedWorld) -> list[Generator[Any, Any, None]]:
        users = _step(self.turns[self.roots[0]][0]).users if self.roots else 0
        if users > 0:
            queue = deque(self.roots)
            return [self._user(world, queue) for _ in range(min(users, len(queue)))]
        return [self._root(world, sid) for sid in self.roots]

    def ready(self, job: Job) -> bool:
        return True

    def finished(self, job: Job, record: RequestRecord) -> bool:
        return True

    def _root(self, world: TimedWorld, sid: int) -> Generator[Any, Any, None]:
        yield world.env.timeout(self.turns[sid][0].arrival)
        yield from self._session(world, sid)

    def _user(self, world: TimedWorld, queue: deque[int]) -> Generator[Any, Any, None]:
        while queue:
            yield from self._session(world, queue.popleft())

    def _session(self, world: TimedWorld, sid: int) -> Generator[Any, Any, None]:
        env = world.env
        start = sent = env.now
        turns = self.turns[sid]
        for k, req in enumerate(turns):
            yield from self._spawn(world, sid, k)
            step = _step(req)
            base = (env.now, start, sent)[step.anchor]
            yield env.timeout(max(base + step.delay - env.now, 0.0))
            sent = env.now
            yield world.submit(Job(req=req, arrival=env.now, done=env.event())).done
        yield from self._spawn(world, sid, len(turns))

    def _spawn(self, world: TimedWorld, sid: int, turn: int) -> Generator[Any, Any, None]:
        """Start the sub-agents of the marker before ``turn`` and wait for them all."""
        kids = self.children.get((sid, turn))
        if kids:
            env = world.env
            yield env.all_of([env.process(self._session(world, kid)) for kid in kids])


def closed_loop(requests: Sequence[Request]) -> bool:
    """Whether ``requests`` come from a closed loop of users (``trace.users``)."""
    return bool(requests) and requests[0].agent is not None and requests[0].agent.users > 0


def _step(req: Request) -> AgentStep:
    if req.agent is None:
        raise ValueError(f"request {req.request_id} has no session graph (not an agentic trace)")
    return req.agent
