"""The kernel's two compilations: :data:`njit`, numba-compiled on first use and cached beside its
module (``cache=True``), and :data:`leaf`, inlined into its callers. Importing this module imports
numba (:func:`simlab.util.numba_import.import_numba`)."""

from __future__ import annotations

from simlab.util.numba_import import import_numba

numba = import_numba()

njit = numba.njit(cache=True, nogil=True, error_model="numpy")
#: the per-node and per-edge helpers, inlined into their callers (numba's IR inlining): a call
#: that is not inlined counts references to the arrays it is passed
leaf = numba.njit(inline="always", error_model="numpy")
