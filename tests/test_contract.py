"""The plug-in and engine contracts, and the package boundaries they stand on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from policies.fine_grained import FineGrained
from policies.interval import Interval
from policies.judicious import Judicious
from simlab.cache.contract import AdmissionPolicy, EvictionPolicy, Tunable, in_units, token_fields
from simlab.engines.base import Engine
from simlab.run.simulate import build_engine
from tests.fixtures import CONFIGS, compose

ROOT = Path(__file__).resolve().parents[1]


def runtime_imports(path: Path) -> set[str]:
    """Modules ``path`` imports outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


#: what a plug-in may import from ``simlab`` at run time: the contract and its building blocks
CONTRACT_LAYER = {
    "simlab.cache.contract",
    "simlab.cache.scoring",
    "simlab.cache.engine_rules",
    "simlab.cache.state_pool",
}


@pytest.mark.parametrize("path", modules("policies"), ids=lambda p: p.name)
def test_policies_import_only_the_contract_from_simlab_at_run_time(path):
    assert {m for m in runtime_imports(path) if m.split(".")[0] == "simlab"} <= CONTRACT_LAYER
    assert not {m for m in runtime_imports(path) if m.split(".")[0] == "policies"}


@pytest.mark.parametrize("path", modules("simlab"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_simulator_imports_only_the_policy_contract(path):
    used = {m for m in runtime_imports(path) if m.split(".")[0] == "policies"}
    assert used <= {"simlab.cache.contract"}


def plugin_configs(group: str) -> list[Path]:
    return sorted((CONFIGS / group).glob("*.yaml"))


@pytest.mark.parametrize("path", plugin_configs("eviction"), ids=lambda p: p.stem)
def test_every_eviction_config_names_an_eviction_policy(path):
    cls = get_class(OmegaConf.load(path)["_target_"])
    assert issubclass(cls, EvictionPolicy)


@pytest.mark.parametrize("path", plugin_configs("admission"), ids=lambda p: p.stem)
def test_every_admission_config_names_an_admission_policy(path):
    cls = get_class(OmegaConf.load(path)["_target_"])
    assert issubclass(cls, AdmissionPolicy)


def test_tunable_policies_are_the_ones_with_an_alpha():
    tunable = {
        path.stem
        for path in plugin_configs("eviction")
        if isinstance(get_class(OmegaConf.load(path)["_target_"])(), Tunable)
    }
    assert tunable == {"flop_aware", "marconi_plus"}


@pytest.mark.parametrize(
    ("admission", "fields"),
    [
        (Judicious(), ("chunk_size", "page_size")),
        (Interval(), ("interval", "chunk_size", "page_size")),
        (FineGrained(), ("block_size",)),
    ],
)
def test_token_parameters_are_typed_and_converted_to_trace_units(admission, fields):
    assert token_fields(admission) == fields
    blocks = in_units(admission, 16)
    for name in fields:
        assert getattr(blocks, name) == max(1, round(getattr(admission, name) / 16))
    assert in_units(admission, 1) is admission


@pytest.mark.parametrize("path", plugin_configs("engine"), ids=lambda p: p.stem)
def test_every_engine_config_builds_an_engine_named_after_it(path):
    engine = build_engine(compose([f"engine={path.stem}"]))
    assert isinstance(engine, Engine) and engine.name == path.stem


def policy_names_in(path: Path) -> list[str]:
    """String constants in ``path`` that name a module or class of ``policies``."""
    return [
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("policies.")
    ]


@pytest.mark.parametrize("path", modules("simlab"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_string_in_the_simulator_names_a_policy_class(path):
    """Routes and presets come from what a plug-in declares, never from its class name."""
    assert policy_names_in(path) == []


def test_a_string_naming_a_policy_class_is_found(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('LRU = "policies.lru.LRU"\n"""policies. in a docstring is prose too."""\n')
    assert policy_names_in(path) == ["policies.lru.LRU", "policies. in a docstring is prose too."]
