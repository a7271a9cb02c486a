"""The kernel's two compilations: :data:`njit`, numba-compiled on first use and cached beside its
module (``cache=True``), and :data:`leaf`, inlined into its callers. Importing this module imports
numba (:func:`simlab.util.numba_import.import_numba`).

numba's cache checks only the file of the function it caches, so a cached caller would keep the
machine code of a callee from another module of this package after that module changed.
:func:`drop_stale_cache` deletes the package's cache files whenever any of its sources changed
(a digest of them is kept beside the cache), before anything here is compiled or loaded."""

from __future__ import annotations

import hashlib
from pathlib import Path

from simlab.util.numba_import import import_numba

PACKAGE = Path(__file__).resolve().parent
CACHE = PACKAGE / "__pycache__"
DIGEST = CACHE / "jit-sources.sha256"


def sources_digest(package: Path = PACKAGE) -> str:
    """One digest of every module of ``package`` (names and bytes)."""
    sha = hashlib.sha256()
    for path in sorted(package.glob("*.py")):
        sha.update(path.name.encode() + b"\0" + path.read_bytes())
    return sha.hexdigest()


def drop_stale_cache(package: Path = PACKAGE, cache: Path = CACHE) -> None:
    """Delete numba's cache files in ``cache`` unless they were written from today's sources."""
    digest, stamp = sources_digest(package), cache / DIGEST.name
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    try:
        cache.mkdir(exist_ok=True)
        for path in [*cache.glob("*.nbi"), *cache.glob("*.nbc")]:
            path.unlink(missing_ok=True)
        stamp.write_text(digest)
    except OSError:  # a read-only install: numba falls back to its own cache directory
        pass


drop_stale_cache()
numba = import_numba()

njit = numba.njit(cache=True, nogil=True, error_model="numpy")
#: the per-node and per-edge helpers, inlined into their callers (numba's IR inlining): a call
#: that is not inlined counts references to the arrays it is passed
leaf = numba.njit(inline="always", error_model="numpy")
