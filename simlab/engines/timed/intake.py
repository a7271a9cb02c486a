"""When a request the scheduler could run may start: two engines hold it back on purpose.

- **SGLang's** ``--scheduler-recv-interval N`` (``engine.recv_interval``; its default 1: no
  hold). Its scheduler pulls new requests from the tokenizer only at some iterations
  (``SchedulerRecvSkipper``, 0.5.9 to 0.5.23): before each iteration a counter grows by the last
  batch's weight, 1 after a decode step and 1000 after an extend (prefill) step, and the requests
  are pulled when it reaches N, which resets it. An idle scheduler spins through its loop, so it
  pulls at once. A request that arrives while the engine decodes waits up to N decode steps
  before it can be prefilled.
- **TensorRT-LLM's** ``batch_wait_timeout_iters`` and ``batch_wait_max_tokens_ratio``
  (``engine.batch_wait_iters`` and ``engine.batch_wait_tokens_ratio``; its defaults 0: no
  hold). While generation requests run (and attention data parallelism is off),
  ``PyExecutor._waiting_requests`` holds the scheduled context requests back for up to the
  timeout in iterations, unless their tokens plus one per generation request reach the ratio of
  ``max_num_tokens`` (``engine.token_budget``); releasing them resets the count.

The timed world (:class:`simlab.engines.timed.world.TimedWorld`) asks :class:`Intake` at each
iteration; with both defaults it holds nothing and the world runs as before.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simlab.engines.timed.jobs import Job
    from simlab.engines.timed.settings import TimedSettings


class Intake:
    """The engine's holds on new requests (module docstring)."""

    def __init__(self, s: TimedSettings):
        self.recv_interval = s.recv_interval
        self.wait_iters = s.batch_wait_iters
        budget = math.inf if s.token_budget is None else s.token_budget
        self.wait_tokens = s.batch_wait_tokens_ratio * budget
        #: whether arrivals wait in :attr:`inbox` for a pull (``engine.recv_interval > 1``)
        self.holds_arrivals = self.recv_interval > 1
        #: the requests that arrived but the scheduler has not pulled yet
        self.inbox: list[Job] = []
        self._count = 0  # SGLang's recv counter
        self._waited = 0  # TensorRT-LLM's batch_wait_iters_count

    def poll(self, idle: bool, after_extend: bool) -> list[Job]:
        """The requests pulled before this iteration (``idle``: the scheduler has nothing to
        run; ``after_extend``: the last step ran prefill chunks)."""
        if not self.holds_arrivals:
            return []
        self._count += self.recv_interval if idle or after_extend else 1
        if self._count < self.recv_interval:
            return []
        self._count = 0
        pulled, self.inbox = self.inbox, []
        return pulled

    def steps_before_pull(self) -> int | None:
        """Decode steps that can run before the iteration whose poll pulls (a decode stretch
        ends there); None: no limit."""
        return self.recv_interval - self._count if self.holds_arrivals else None

    def decoded(self, steps: int) -> None:
        """A decode stretch of ``steps`` iterations ran: the polls before its second to last
        iteration counted (none pulled: :meth:`steps_before_pull`); the next one is the loop's."""
        if self.holds_arrivals:
            self._count += steps - 1

    def holds_context(self, context_tokens: int, decoders: int) -> bool:
        """Whether TensorRT-LLM holds this iteration's context requests (``context_tokens``
        their tokens) back while ``decoders`` generation requests run."""
        if self.wait_iters <= 0 or not decoders or not context_tokens:
            return False
        if self._waited >= self.wait_iters or context_tokens + decoders >= self.wait_tokens:
            self._waited = 0
            return False
        self._waited += 1
        return True
