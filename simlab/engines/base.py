"""The engine contract: how a request sequence is driven through one policy's request step.

An engine is the object a ``configs/engine/*.yaml`` names with ``_target_`` (replay, timed,
offline). It decides *when* each request is started and finished; what happens to a request
against the cache is :class:`simlab.engines.step.RequestStep`'s alone. Adding an engine is one class
with :meth:`Engine.run` and one YAML.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from simlab.engines.records import RequestRecord
    from simlab.engines.step import RequestStep
    from simlab.engines.timed.pool_sizing import KvPool
    from simlab.model.spec import ModelSpec
    from traces.format import Request


@dataclass
class EngineRun:
    """What an engine returns for one policy.

    ``records``: one per request of the trace, sorted by (arrival, session, turn) for timed
    engines, in processing order for replay. ``extras``: engine items for the policy's summary.
    ``occupancy``: (time, KV bytes, SSM bytes) samples; empty means one sample per record.
    ``columns``: extra per-record columns, one value per record in ``records``' order (a
    cluster's routing; empty for one engine, so its records keep their columns).
    """

    records: list[RequestRecord]
    extras: dict[str, Any] = field(default_factory=dict)
    occupancy: list[tuple[float, int, int]] = field(default_factory=list)
    columns: dict[str, list[Any]] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """``run`` drives ``requests`` through ``step`` (a fresh cache per call)."""

    @property
    def name(self) -> str: ...

    def run(self, requests: Sequence[Request], step: RequestStep) -> EngineRun: ...


@runtime_checkable
class MemoryChecked(Protocol):
    """An engine that checks, before any work, that the model and the cache fit its GPU (the
    timed engines; :class:`ConfigError` naming the key otherwise); ``reserve``: whether a
    policy runs where running sequences need memory beside the cache (the prefix tree).
    :meth:`held` gives the model as its GPUs hold it, which the run's caches size with."""

    def held(self, model: ModelSpec) -> ModelSpec:
        """``model`` as the engine's tensor-parallel GPUs hold it (replicated KV heads)."""
        ...

    def check_memory(self, model: ModelSpec, cache_gb: float, reserve: bool = True) -> None: ...

    def engine_pool(self, model: ModelSpec) -> KvPool:
        """The KV pool the modelled engine allocates for ``model`` on its GPUs
        (``cache.size_gb=engine``)."""
        ...


@runtime_checkable
class Overheads(Protocol):
    """An engine whose latencies include the engine's own overheads and scheduling (the timed
    engines): :meth:`overheads_caveat` says when the overheads are all zero, the defaults,
    which no run should read as measured; :meth:`defaults_caveat` when its scheduling differs
    from the modelled engine's defaults on the GPU."""

    def overheads_caveat(self) -> str | None: ...

    def defaults_caveat(self) -> str | None: ...

    def resolved(self) -> dict[str, tuple[Any, str]]: ...


@runtime_checkable
class Replicated(Protocol):
    """An engine of several replicas (:class:`simlab.engines.cluster.engine.ClusterEngine`): ``step`` serves
    the first and ``fresh_step()`` builds each other replica's step."""

    @property
    def replicas(self) -> int: ...

    def run(
        self,
        requests: Sequence[Request],
        step: RequestStep,
        fresh_step: Callable[[], RequestStep] | None = None,
    ) -> EngineRun: ...
