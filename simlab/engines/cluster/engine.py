"""The cluster engine: the timed engine behind ``cluster.replicas`` replicas
(:mod:`simlab.engines.cluster`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simlab.config import ClusterSettings, ConfigError
from simlab.engines.base import Engine, EngineRun
from simlab.engines.cluster.disaggregated import DisaggregatedCluster
from simlab.engines.cluster.world import Cluster
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import TimedEngine
from simlab.model.spec import ModelSpec
from traces.format import Request

#: per-record columns a cluster adds (:attr:`simlab.engines.base.EngineRun.columns`)
ROUTE_COLUMNS = ("replica", "best_overlap", "routed_overlap", "routing_regret")


def with_cluster(engine: Engine, settings: ClusterSettings, run_seed: int) -> Engine:
    """``engine`` behind ``settings.replicas`` replicas; the engine itself with one replica.
    Raises :class:`ConfigError` naming the key."""
    if settings.replicas == 1:
        return engine
    if type(engine) is not TimedEngine:
        raise ConfigError(
            f"cluster.replicas: {settings.replicas} replicas need engine=timed "
            f"(got engine={engine.name})"
        )
    if settings.disaggregated and engine.kv_pool == "shared":
        raise ConfigError(
            "cluster.disaggregated: not supported with engine.kv_pool=shared yet; "
            "use engine.kv_pool=separate"
        )
    seed = run_seed if settings.seed is None else settings.seed
    return ClusterEngine(engine, settings, seed)


@dataclass(frozen=True)
class ClusterEngine:
    """The timed engine with ``settings.replicas`` replicas; see the module docstring."""

    engine: TimedEngine
    settings: ClusterSettings
    seed: int = 0

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def replicas(self) -> int:
        return self.settings.replicas

    def held(self, model: ModelSpec) -> ModelSpec:
        """Each replica holds the model as the single engine does."""
        return self.engine.held(model)

    def overheads_caveat(self) -> str | None:
        """Each replica's: the single engine's."""
        return self.engine.overheads_caveat()

    def defaults_caveat(self) -> str | None:
        """Each replica's: the single engine's."""
        return self.engine.defaults_caveat()

    def resolved(self) -> dict[str, tuple[Any, str]]:
        """Each replica's: the single engine's."""
        return self.engine.resolved()

    def engine_pool(self, model: Any) -> Any:
        """Each replica's KV pool: the single engine's."""
        return self.engine.engine_pool(model)

    def check_memory(self, model: Any, cache_gb: float, reserve: bool = True) -> None:
        """Each replica is one GPU (x tp) with its own cache: the single engine's check."""
        self.engine.check_memory(model, cache_gb, reserve)

    def run(
        self,
        requests: Sequence[Request],
        step: RequestStep,
        fresh_step: Callable[[], RequestStep] | None = None,
    ) -> EngineRun:
        """Simulate the cluster; ``step`` serves replica 0 and ``fresh_step()`` builds each
        other replica's step (and each twin, with a router lag)."""
        if fresh_step is None:
            raise ValueError("a cluster needs fresh_step to build each replica's request step")
        n = self.settings.replicas
        steps = [step, *(fresh_step() for _ in range(n - 1))]
        if self.settings.disaggregated:
            n = self.settings.n_prefill  # the router sees the prefill replicas only
        twins = [fresh_step() for _ in range(n)] if self.settings.router_lag_s > 0 else None
        kind = DisaggregatedCluster if self.settings.disaggregated else Cluster
        return kind(self, requests, steps, twins).run()
