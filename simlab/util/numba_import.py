"""numba for the compiled kernels (:mod:`simlab.fastpaths.blocks.kernel_jit`, :mod:`simlab.fastpaths.radix.jit`),
imported without its BLAS probe.

The first compiled call of a process loads numba's numpy implementations
(``numba.core.cpu.CPUContext.load_additional_registries``). One of them,
``numba.np.arraymath``, asks at import whether a BLAS is there by importing
``scipy.linalg.cython_blas``, which imports all of ``scipy.linalg``: 0.09-0.13 s on a 2-core
machine, a fifth to a quarter of loading a kernel (``python -m bench.numba_load``), for kernels
that call no BLAS.

:func:`import_numba` imports that module first with the probe answered "no BLAS" (the import of
``scipy.linalg.cython_blas`` fails at once). The answer changes one thing: numba's
``np.convolve`` and ``np.correlate`` compute their inner products with a plain loop instead of
``np.dot``. ``np.dot``, ``@`` and ``np.linalg`` still work: each imports ``scipy.linalg`` itself
when a function using it is compiled. When ``scipy.linalg.cython_blas`` is loaded already the
probe costs nothing and numba is imported as it is. If ``numba.np.arraymath`` fails to import this
way (a numba that moved it), numba's own first call imports it as usual.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

_PROBE = "scipy.linalg.cython_blas"
_PROBED = "numba.np.arraymath"


def import_numba() -> ModuleType:
    """numba, with ``numba.np.arraymath`` imported without the BLAS probe (module docstring);
    ``sys.modules`` holds no trace of the probe afterwards."""
    if _PROBED not in sys.modules and _PROBE not in sys.modules:
        sys.modules[_PROBE] = None  # type: ignore[assignment]  # its import fails at once
        try:
            import numba.np.arraymath
        except ImportError:  # numba's first call imports it as usual (module docstring)
            pass
        finally:
            sys.modules.pop(_PROBE, None)  # nothing can import it while it is None
    import numba

    return numba


def available() -> bool:
    """Whether numba is installed (the compiled paths can run); imports nothing."""
    return importlib.util.find_spec("numba") is not None
