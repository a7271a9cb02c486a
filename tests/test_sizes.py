"""The house's sizes (docs/design/architecture.md): no module in simlab/, policies/ or traces/
over 500 lines, no class over 400, and the 90th percentile of function lengths at most 25."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p for d in ("simlab", "policies", "traces") for p in (ROOT / d).rglob("*.py"))
MAX_MODULE, MAX_CLASS, MAX_FUNCTION_P90 = 500, 400, 25


def _span(node: ast.stmt) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def oversized(path: Path) -> list[str]:
    """What in ``path`` passes the limits: the module's lines, then each class's."""
    text = path.read_text()
    found = [f"{len(text.splitlines())} lines"] if len(text.splitlines()) > MAX_MODULE else []
    classes = (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef))
    return found + [f"class {c.name}: {_span(c)} lines" for c in classes if _span(c) > MAX_CLASS]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_or_class_over_the_limits(path: Path) -> None:
    assert oversized(path) == []


def test_function_length_p90() -> None:
    spans = [
        _span(node)
        for path in MODULES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    assert np.percentile(spans, 90) <= MAX_FUNCTION_P90


def test_the_check_catches_a_long_module_and_class(tmp_path: Path) -> None:
    path = tmp_path / "long.py"
    path.write_text("class A:\n" + "    x = 1\n" * MAX_MODULE)
    assert oversized(path) == [f"{MAX_MODULE + 1} lines", f"class A: {MAX_MODULE + 1} lines"]
