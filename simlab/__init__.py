"""simlab: a discrete-event simulator and policy lab for prefix caching in LLM serving.

The front door, lazy: ``import simlab`` loads nothing else, and each name below is imported on
first use (start-up stays what a command needs). The layers under it are described in
``docs/design/architecture.md``.

>>> import simlab
>>> summary = simlab.simulate(cfg)  # a Hydra config (``configs/config.yaml``)
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simlab.cache.prefix import PrefixCache
    from simlab.cost.hardware import Hardware
    from simlab.cost.model import CostModel
    from simlab.engines.base import Engine, EngineRun
    from simlab.engines.cluster.engine import ClusterEngine
    from simlab.engines.offline import OfflineEngine
    from simlab.engines.records import RequestRecord
    from simlab.engines.replay import ReplayEngine
    from simlab.engines.step import RequestStep
    from simlab.engines.timed.engine import TimedEngine
    from simlab.model.spec import ModelSpec
    from simlab.run.plan import RunPlan, plan_run
    from simlab.run.simulate import simulate
    from simlab.run.summary import Summary

#: public name -> the module that defines it
_HOMES = {
    "simulate": "simlab.run.simulate",
    "plan_run": "simlab.run.plan",
    "RunPlan": "simlab.run.plan",
    "Summary": "simlab.run.summary",
    "ModelSpec": "simlab.model.spec",
    "Hardware": "simlab.cost.hardware",
    "CostModel": "simlab.cost.model",
    "PrefixCache": "simlab.cache.prefix",
    "RequestStep": "simlab.engines.step",
    "Engine": "simlab.engines.base",
    "EngineRun": "simlab.engines.base",
    "ReplayEngine": "simlab.engines.replay",
    "TimedEngine": "simlab.engines.timed.engine",
    "ClusterEngine": "simlab.engines.cluster.engine",
    "OfflineEngine": "simlab.engines.offline",
    "RequestRecord": "simlab.engines.records",
}

__all__ = [
    "ClusterEngine",
    "CostModel",
    "Engine",
    "EngineRun",
    "Hardware",
    "ModelSpec",
    "OfflineEngine",
    "PrefixCache",
    "ReplayEngine",
    "RequestRecord",
    "RequestStep",
    "RunPlan",
    "Summary",
    "TimedEngine",
    "plan_run",
    "simulate",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'simlab' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
