"""Where an op's time comes from: a measured kernel at that very shape, an interpolation
between measured shapes, or the calibrated roofline (:data:`SOURCES`)."""

from __future__ import annotations

MEASURED = "measured"
INTERPOLATED = "interpolated"
ROOFLINE = "roofline"
#: every source tag, best first
SOURCES = (MEASURED, INTERPOLATED, ROOFLINE)
#: a run whose roofline share of simulated GPU time exceeds this warns once
ROOFLINE_WARN_SHARE = 0.5


def worst(tags: list[str]) -> str:
    """The weakest of several tags (an op built from several kernels)."""
    return max(tags, key=SOURCES.index) if tags else ROOFLINE


def shares(seconds: dict[str, float]) -> dict[str, float]:
    """``{source: share}`` of ``{source: seconds}`` (every source present, zeros included)."""
    total = sum(seconds.values())
    return {s: (seconds.get(s, 0.0) / total if total else 0.0) for s in SOURCES}
