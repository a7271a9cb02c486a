"""numba imported without its BLAS probe (simlab/util/numba_import.py), in a fresh interpreter: the
kernels' first compiled call leaves ``scipy.linalg`` unimported and ``sys.modules`` without a trace
of the probe, and a numba function that does use BLAS (``np.dot``) still compiles and gives the
right answer, importing ``scipy.linalg`` itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba", reason="the compiled path needs numba (pip install simlab[fast])")

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
import numpy as np
from simlab.fastpaths.blocks import kernel_jit as block_kernel_jit  # numba, through simlab.util.numba_import
from simlab.fastpaths.radix.jit import serve as radix_kernel
import numba

@numba.njit
def total(values):  # the first compiled call loads numba's numpy implementations
    out = 0
    for value in values:
        out += value
    return out

seen = {
    "total": int(total(np.arange(5))),
    "linalg": "scipy.linalg" in sys.modules,
    "probe_left": "scipy.linalg.cython_blas" in sys.modules,
}

@numba.njit
def dot(a, b):
    return np.dot(a, b)

seen["dot"] = float(dot(np.arange(3.0), np.arange(3.0)))
seen["linalg_after_dot"] = "scipy.linalg" in sys.modules
print(json.dumps(seen))
"""


def test_the_kernels_load_numba_without_scipy_linalg_and_blas_still_works():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=True
    )
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {
        "total": 10,
        "linalg": False,
        "probe_left": False,
        "dot": 5.0,
        "linalg_after_dot": True,
    }


def test_the_radix_kernel_cache_is_dropped_when_a_source_changes(tmp_path: Path) -> None:
    """numba checks only a cached function's own file: a change to any module of the kernel's
    package deletes every cache file, a rerun on unchanged sources keeps them."""
    from simlab.fastpaths.radix.jit.decorators import drop_stale_cache

    package, cache = tmp_path / "jit", tmp_path / "jit" / "__pycache__"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    drop_stale_cache(package, cache)
    (cache / "a.f-1.py311.nbi").write_text("index")
    drop_stale_cache(package, cache)
    assert (cache / "a.f-1.py311.nbi").exists()
    (package / "b.py").write_text("y = 2\n")
    drop_stale_cache(package, cache)
    assert not (cache / "a.f-1.py311.nbi").exists()
