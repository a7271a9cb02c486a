"""The provenance pages: software version and commit, input files with checksums, seed, trace
statistics, the route that computed each policy (``summary.json``'s ``routes``,
:mod:`simlab.run.routes`), swept values and the full resolved config as YAML."""

from __future__ import annotations

import hashlib
import logging
import textwrap
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from omegaconf import OmegaConf

from simlab.report.describe import swept_values
from simlab.report.load import RunResults, SweepResults
from simlab.report.style import chunks, fmt_value, text_page
from simlab.util.provenance import git_commit, project_version

log = logging.getLogger(__name__)

LINES_PER_COLUMN = 54
COLUMNS_PER_PAGE = 2
LINE_WIDTH = 92


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def software_lines() -> list[str]:
    return [
        "== Software (that built this report) ==",
        f"simlab version: {project_version()}",
        f"git commit: {git_commit()}",
    ]


def file_lines(results: RunResults | SweepResults) -> list[str]:
    lines = ["", "== Input files (sha256 prefix, bytes) =="]
    for path in results.files():
        rel = path.relative_to(results.path) if path.is_relative_to(results.path) else path
        lines.append(f"{rel}  {sha256(path)}  {path.stat().st_size:,}")
    return lines


def stats_lines(title: str, stats: dict[str, Any]) -> list[str]:
    lines = ["", f"== {title} =="]
    lines += [f"{k}: {fmt_value(v)}" for k, v in sorted(stats.items())]
    return lines


def config_lines(config: dict[str, Any], title: str = "Full resolved config (YAML)") -> list[str]:
    text = OmegaConf.to_yaml(OmegaConf.create(config), sort_keys=True)
    return ["", f"== {title} ==", *text.rstrip().splitlines()]


def route_lines(routes: dict[str, Any], title: str = "Routes") -> list[str]:
    """Per policy, the route that computed its records and why each faster one was refused."""
    if not routes:
        return []
    lines = ["", f"== {title} (the code that computed each policy) =="]
    for policy, route in routes.items():
        lines.append(f"{policy}: {route.get('taken', '?')}")
        lines += [f"  not {name}: {why}" for name, why in route.get("refused", {}).items()]
    return lines


def run_lines(run: RunResults) -> list[str]:
    lines = [*software_lines(), "", "== Run ==", f"results: {run.path}"]
    lines += [f"seed: {run.config.get('seed', '?')}", f"policies: {', '.join(run.policies)}"]
    lines += [f"occupancy from: {run.occupancy_source}"]
    lines += file_lines(run) + stats_lines("Trace statistics", run.trace)
    lines += route_lines(run.summary.get("routes") or {})
    shown = ("policies", "trace", "config", "routes")
    extra = {k: v for k, v in run.summary.items() if k not in shown}
    if extra:  # e.g. the engine's own provenance, when summary.json carries it
        lines += ["", "== Other summary.json fields =="]
        lines += [f"{k}: {v}" for k, v in sorted(extra.items())]
    return lines + config_lines(run.config)


def sweep_lines(sweep: SweepResults) -> list[str]:
    lines = [*software_lines(), "", "== Sweep ==", f"results: {sweep.path}"]
    lines.append(f"points: {len(sweep.point_ids)}; policies: {', '.join(sweep.policies)}")
    lines += [f"swept {k}: {', '.join(swept_values(sweep, k))}" for k in sweep.swept_keys]
    lines += [f"fixed {k}: {v}" for k, v in sweep.fixed.items()]
    lines += ["", "== Points =="]
    for p in sweep.point_ids:
        values = ", ".join(f"{k}={fmt_value(v)}" for k, v in sweep.values(p).items())
        lines.append(f"{p}: {sweep.point_dirs[p].name}/  {values}")
    lines += file_lines(sweep)
    lines += stats_lines(f"Trace statistics (point {sweep.point_ids[0]})", sweep.base.trace)
    routes = sweep.base.summary.get("routes") or {}
    lines += route_lines(routes, f"Routes (point {sweep.point_ids[0]})")
    title = f"Full resolved config of point {sweep.point_ids[0]} (YAML)"
    return lines + config_lines(sweep.base.config, title)


def wrap(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        indent = len(line) - len(line.lstrip())
        out += textwrap.wrap(
            line, LINE_WIDTH, subsequent_indent=" " * (indent + 4), drop_whitespace=False
        ) or [""]
    return out


def provenance_pages(results: RunResults | SweepResults, caption: str) -> list[Figure]:
    lines = wrap(run_lines(results) if isinstance(results, RunResults) else sweep_lines(results))
    columns = chunks(lines, LINES_PER_COLUMN)
    pages = []
    page_cols = chunks(columns, COLUMNS_PER_PAGE)
    for i, cols in enumerate(page_cols):
        title = "Provenance" + (f" (continued, {i + 1}/{len(page_cols)})" if i else "")
        fig = text_page(title, caption)
        ax = fig.axes[0]
        for c, col in enumerate(cols):
            ax.text(
                c / COLUMNS_PER_PAGE,
                1.0,
                "\n".join(col),
                va="top",
                ha="left",
                family="monospace",
                fontsize=7.6,
                transform=ax.transAxes,
            )
        pages.append(fig)
    return pages
