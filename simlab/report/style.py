"""Print-friendly page style: page size, fonts, a fixed colour per policy, captions.

Every page is a :class:`matplotlib.figure.Figure` built without ``pyplot`` (no global figure
registry, nothing leaks between reports) under :data:`RC`. A policy keeps its colour on every page
and in every report: the standard policies have fixed colours, any other name gets one from the
rest of the palette by a stable hash of its name.
"""

from __future__ import annotations

import math
import textwrap
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

#: A4 landscape, inches.
PAGE_SIZE = (11.69, 8.27)

RC: dict[Any, Any] = {  # keys: matplotlib rcParams names
    "font.size": 10.5,
    "axes.titlesize": 11.5,
    "axes.labelsize": 10.5,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
    "legend.fontsize": 9.5,
    "figure.titlesize": 15,
    "axes.grid": True,
    "grid.alpha": 0.35,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.8,
    "pdf.fonttype": 42,  # embed TrueType: text stays selectable and sharp in print
    "svg.hashsalt": "simlab",
}

#: Canonical policy order (baselines first, Marconi after them, the clairvoyant bound last); any
#: other policy follows by name.
POLICY_ORDER = (
    "vllm_plus",
    "sglang_plus",
    "sglang_hybrid",
    "lfu",
    "gdsf",
    "marconi",
    "marconi_plus",
    "clairvoyant",
)

# Okabe-Ito colours (distinguishable with colour-vision deficiencies and in greyscale print)
# for the standard policies; the spares serve any other name.
_FIXED = {
    "vllm_plus": "#E69F00",  # orange
    "sglang_plus": "#0072B2",  # blue
    "sglang_hybrid": "#56B4E9",  # sky blue
    "lfu": "#009E73",  # bluish green
    "gdsf": "#8C564B",  # brown
    "marconi": "#D55E00",  # vermillion
    "marconi_plus": "#CC79A7",  # reddish purple
    "clairvoyant": "#000000",  # black: the offline bound
}
_SPARE = ("#7F7F7F", "#BCBD22", "#17BECF", "#9467BD", "#F0A0A0", "#2CA02C", "#1F3A93", "#FFBF00")

KV_LABEL = "KV (attention)"
SSM_LABEL = "SSM checkpoints"
CAPTION_WIDTH = 175  # characters per caption line at the caption font size


def order_policies(names: Iterable[str]) -> list[str]:
    """Standard policies in :data:`POLICY_ORDER`, then any others alphabetically."""
    names = set(names)
    known = [p for p in POLICY_ORDER if p in names]
    return known + sorted(names - set(known))


def palette(names: Iterable[str]) -> dict[str, str]:
    """A colour per policy: fixed for the standard ones, a stable hash for the others.

    Hash collisions within one report move to the next free spare colour (deterministic for a
    given set of names).
    """
    colours = {}
    used = set()
    for name in order_policies(names):
        if name in _FIXED:
            colours[name] = _FIXED[name]
        else:
            start = zlib.crc32(name.encode()) % len(_SPARE)
            free = [_SPARE[(start + i) % len(_SPARE)] for i in range(len(_SPARE))]
            colours[name] = next((c for c in free if c not in used), free[0])
        used.add(colours[name])
    return colours


def blank_page(title: str, caption: str) -> Figure:
    """A page with a title and a caption footer, no axes yet (constrained layout above the
    caption)."""
    lines = wrap_caption(caption)
    footer = 0.028 + 0.021 * len(lines)
    layout = ConstrainedLayoutEngine(rect=(0.0, footer, 1.0, 1.0 - footer), h_pad=0.08, w_pad=0.08)
    fig = Figure(figsize=PAGE_SIZE, layout=layout)
    fig.suptitle(title, fontweight="bold")
    fig.text(0.012, 0.012, "\n".join(lines), fontsize=8.5, color="#333333", va="bottom")
    return fig


def new_page(
    title: str, caption: str, nrows: int = 1, ncols: int = 1, **subplot_kw: Any
) -> tuple[Figure, np.ndarray]:
    """A page with a title, a caption footer and an ``nrows x ncols`` grid of axes (2-D array)."""
    fig = blank_page(title, caption)
    return fig, fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)


def text_page(title: str, caption: str) -> Figure:
    """A page without axes (tables, notes, provenance)."""
    fig, axes = new_page(title, caption)
    axes[0, 0].set_axis_off()
    return fig


def wrap_caption(caption: str) -> list[str]:
    lines: list[str] = []
    for para in caption.splitlines():
        lines.extend(textwrap.wrap(para, CAPTION_WIDTH) or [""])
    return lines


def hide_unused(axes: np.ndarray, used: int) -> None:
    for ax in axes.flat[used:]:
        ax.set_visible(False)


def grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    """Rows and columns of a small-multiples grid for ``n`` panels."""
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """Split into the fewest pieces of at most ``size``, balanced (10 by 8 -> 5 + 5)."""
    if not items:
        return [items]
    size = math.ceil(len(items) / math.ceil(len(items) / size))
    return [items[i : i + size] for i in range(0, len(items), size)]


def policy_legend(ax: Axes, colours: dict[str, str], names: Sequence[str], **kw: Any) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=colours[n], label=n) for n in names]
    ax.legend(handles=handles, **kw)


def fmt_value(value: Any) -> str:
    """A swept value for labels: ``2``, ``0.5``, ``inf`` -> ``∞``, ``None`` and NaN (a swept
    ``null``) -> ``null``, strings as they are."""
    if value is None:
        return "null"
    if isinstance(value, float | np.floating):
        if math.isnan(value):
            return "null"
        if math.isinf(value):
            return "∞"
        return f"{value:g}"
    return str(value)


def fmt_tokens(n: float) -> str:
    """Token counts for tick labels: 950, 1.2K, 34K."""
    if n >= 10_000:
        return f"{n / 1000:.0f}K"
    if n >= 1000:
        return f"{n / 1000:.1f}K".replace(".0K", "K")
    return f"{n:.0f}"
