"""The replay engine (the Marconi paper's method): no time, requests in arrival order.

Each request is started and finished back to back through the one request step
(:class:`simlab.engines.step.RequestStep`): match, note the hit, plan, admit input + output. The logical
clock advances by one per request, so recency is measured in requests. The cache works in the
trace's units (tokens, or blocks for hash-id traces); records are in tokens.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simlab.cache.contract import AdmissionPolicy, EvictionPolicy
from simlab.cache.prefix import PrefixCache
from simlab.config import ConfigError
from simlab.cost.hardware import Hardware
from simlab.engines import block_pool as vllm_pool
from simlab.engines.base import EngineRun
from simlab.engines.records import RequestRecord
from simlab.engines.step import Controller, RequestStep
from simlab.engines.timed.defaults import defaults as engine_defaults
from traces.format import Request
from traces.progress import Progress

log = logging.getLogger(__name__)


def replay_step(requests: Sequence[Request], step: RequestStep) -> list[RequestRecord]:
    """Run every request through ``step``; one record per request, in processing order.

    The plug-ins' ``prepare`` sees the whole sequence first: position ``i`` is processed at
    clock ``i + 1`` on a fresh cache.
    """
    step.prepare(requests)
    records = []
    with Progress(len(requests), f"{step.policy} (replay)") as progress:
        for i, req in enumerate(requests, start=1):
            records.append(step.serve(req))
            if not i & 255:  # the hot loop reports every 256 requests
                progress.update(256)
    return records


def replay(
    requests: Iterable[Request],
    cache: PrefixCache,
    admission: AdmissionPolicy,
    eviction: EvictionPolicy,
    policy: str,
    controllers: Sequence[Controller] = (),
) -> list[RequestRecord]:
    """:func:`replay_step` on a step made of these parts (the library entry point)."""
    step = RequestStep(cache, admission, eviction, policy, tuple(controllers))
    return replay_step(list(requests), step)


@dataclass(frozen=True)
class ReplayEngine:
    """``engine=replay``: the records, and the cache occupancy after each request. A step routed
    to vLLM's pool (``step.pool``: a hybrid under ``policy=vllm``) runs there block by block
    (:mod:`simlab.engines.block_pool`) instead of on the prefix cache."""

    name: str = "replay"
    #: vLLM's hybrid pool: the tokens a scheduler step prefills (``max_num_batched_tokens``;
    #: None: a vLLM server's default on the run's GPU, :attr:`budget`)
    token_budget: int | None = None
    #: the run's hardware preset (``hardware``), on whose GPU a vLLM server's default budget
    #: depends (None: unknown, ``SchedulerConfig``'s
    #: :data:`~simlab.engines.block_pool.replay.SCHEDULER_TOKENS`); not ``hardware``, the key
    #: that marks an engine that times its requests
    gpu: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        budget = self.token_budget
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
        ):
            raise ConfigError(
                f"engine.token_budget must be an integer >= 1 or null, got {budget!r}"
            )

    @functools.cached_property
    def hardware(self) -> Hardware | None:
        """The run's GPU, its peaks filled from its ``system`` (None: no hardware given)."""
        if self.gpu is None:
            return None
        try:
            return Hardware.from_config(self.gpu)
        except ValueError as err:
            raise ConfigError(str(err)) from err

    @property
    def budget(self) -> int:
        """The tokens a step of vLLM's pool prefills: ``engine.token_budget``, else what
        ``vllm serve`` takes on the GPU (``EngineArgs.get_batch_defaults``: 8,192 on a GPU of
        70 GiB or more that is not an A100, 2,048 on the others,
        :func:`simlab.engines.timed.defaults.defaults`), else ``SchedulerConfig``'s 2,048."""
        if self.token_budget is not None:
            return self.token_budget
        hw = self.hardware
        if hw is None:
            return vllm_pool.SCHEDULER_TOKENS
        return int(engine_defaults("vllm", hw.name, hw.mem_gb)["token_budget"][0])

    def resolved(self) -> dict[str, tuple[Any, str]]:
        """``engine.token_budget`` left null, and the default it took: ``{key: (value, whose)}``
        (empty when it is set)."""
        if self.token_budget is not None:
            return {}
        hw = self.hardware
        if hw is None:
            return {"token_budget": (self.budget, "vLLM's SchedulerConfig default (no GPU)")}
        whose = f"vllm serve's default on {hw.name} ({hw.mem_gb:g} GiB)"
        return {"token_budget": (self.budget, whose)}

    def run(self, requests: Sequence[Request], step: RequestStep) -> EngineRun:
        shape = vllm_pool.pool_shape(step, requests) if step.pool else None
        if shape is not None:
            log.info("%s: vLLM's hybrid pool block by block (%s)", step.policy, shape)
            return vllm_pool.pool_run(requests, step, shape, step.policy, self.budget)
        return EngineRun(records=replay_step(requests, step))
