"""The run plan: ``plan_run`` reads the composed config once, checks all of it, and returns a
typed plan in which no ``DictConfig`` or ``ListConfig`` travels on."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, ListConfig

from simlab.cache.contract import Semantics
from simlab.config import ConfigError, RunSettings
from simlab.engines.tuning.settings import TuningSettings
from simlab.model.spec import ModelSpec
from simlab.run.plan import RunPlan, plan_run
from simlab.run.policy import PolicySpec
from simlab.run.simulate import run_plan
from simlab.run.trace import TraceSpec
from tests.fixtures import compose


def omegaconf_objects(value: Any, path: str = "plan", seen: set[int] | None = None) -> list[str]:
    """The paths of every ``DictConfig``/``ListConfig`` reachable from ``value``: through
    dataclass fields, mappings, sequences, sets and the attributes of objects (an engine)."""
    seen = set() if seen is None else seen
    if isinstance(value, DictConfig | ListConfig):
        return [path]
    if id(value) in seen or isinstance(value, str | bytes | int | float | bool | type(None)):
        return []
    if isinstance(value, type | types.ModuleType | types.FunctionType | types.BuiltinFunctionType):
        return []
    seen.add(id(value))
    if isinstance(value, dict):
        children = [(f"{path}[{k!r}]", v) for k, v in value.items()]
        children += [(f"{path} key", k) for k in value]
    elif isinstance(value, list | tuple | set | frozenset):
        children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    elif dataclasses.is_dataclass(value):
        children = [(f"{path}.{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value)]
    else:
        children = [(f"{path}.{k}", v) for k, v in getattr(value, "__dict__", {}).items()]
        slots = [s for cls in type(value).__mro__ for s in getattr(cls, "__slots__", ())]
        children += [(f"{path}.{s}", getattr(value, s)) for s in slots if hasattr(value, s)]
    return [found for p, v in children for found in omegaconf_objects(v, p, seen)]


def test_the_plan_holds_the_run_typed():
    plan = plan_run(compose(["cache.size_gb=3", "cluster.replicas=2", "trace.limit=5"]))
    assert isinstance(plan, RunPlan)
    assert isinstance(plan.settings, RunSettings) and isinstance(plan.model, ModelSpec)
    assert plan.settings.cache.size_gb == 3 and plan.settings.cluster.replicas == 2
    assert list(plan.policies) == ["vllm_plus", "sglang_plus", "marconi"]
    for name, spec in plan.policies.items():
        assert isinstance(spec, PolicySpec) and spec.name == name
        assert isinstance(spec.admission, dict) and "_target_" in spec.eviction
        assert isinstance(spec.semantics, Semantics)
    assert isinstance(plan.policies["marconi"].tuning, TuningSettings)
    assert plan.bounds and isinstance(plan.clairvoyant, PolicySpec)
    assert plan.engine.name and type(plan.engine).__name__ == "ClusterEngine"
    assert isinstance(plan.trace, TraceSpec)
    assert plan.trace.target == "traces.sharegpt.load_sharegpt"
    assert plan.trace.options["limit"] == 5 and plan.trace.name == "sharegpt"
    assert plan.out_dir is None and plan.overwrite is False
    assert plan.config["cache"]["size_gb"] == 3 and "compare" in plan.config


def test_no_omegaconf_object_travels_past_the_plan(tmp_path):
    overrides = [
        "+policy=marconi",
        "policy.compat=reference",
        "policy.tuning.grid=[0,0.5,1]",
        "engine=timed",
        f"output_dir={tmp_path}",
    ]
    plan = plan_run(compose(overrides))
    assert omegaconf_objects(plan) == []
    assert plan.policies["marconi"].eviction["memory"] == "path"  # the preset's switch
    tuning = plan.policies["marconi"].tuning
    assert tuning is not None and tuning.grid == (0.0, 0.5, 1.0)
    assert plan.out_dir == Path(tmp_path) and "compare" not in plan.config
    assert omegaconf_objects({"x": [compose([]).cache]}) == ["plan['x'][0]"]  # the walk finds one


def test_a_plan_runs_without_its_config(tmp_path):
    plan = plan_run(compose(["+policy=vllm", "engine=replay", "trace.limit=3", "report=false"]))
    summary = run_plan(dataclasses.replace(plan, out_dir=tmp_path))
    assert list(summary.policies) == ["vllm"] and summary.config == plan.config
    assert (tmp_path / "summary.json").is_file() and set(summary.bounds) == {
        "infinite",
        "clairvoyant",
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+policy=marconi", "policy.compat=bogus"], "policy 'marconi': policy.compat must be"),
        (["+policy=marconi", "policy.tuning.grid=[1]"], "policy.tuning.grid must contain 0"),
        (["+policy=marconi", "+policy.semantics.clok=1"], "policy.semantics: unknown key"),
        (["+policy=vllm", "+policy.admission.bogus=1"], "policy 'vllm'"),
        (["cluster.replicas=0"], "cluster.replicas: must be an integer >= 1"),
        (["+trace.limt=5"], "trace.limt: unknown key"),
        (["engine=replay", "~engine._target_"], "engine must name an engine class"),
        (["bounds.enabled=maybe"], "bounds.enabled: must be true or false"),
    ],
)
def test_bad_input_fails_in_plan_run_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        plan_run(compose(overrides))
    assert message in str(err.value) and "\n" not in str(err.value)
