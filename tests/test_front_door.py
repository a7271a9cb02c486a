"""The front door (``simlab/__init__.py``): lazy, curated, and every name resolves."""

from __future__ import annotations

import subprocess
import sys

import pytest

import simlab


@pytest.mark.parametrize("name", simlab.__all__)
def test_every_public_name_resolves_to_its_home(name: str) -> None:
    value = getattr(simlab, name)
    assert value.__name__ == name
    assert value.__module__.startswith("simlab.")


def test_all_lists_exactly_the_names_with_a_home() -> None:
    assert sorted(simlab.__all__) == sorted(simlab._HOMES)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = simlab.nope  # type: ignore[attr-defined]


def test_importing_simlab_loads_no_submodule() -> None:
    code = "import sys, simlab; print(sorted(m for m in sys.modules if m.startswith('simlab.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
