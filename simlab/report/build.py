"""Assemble the pages of a run or sweep report into one deterministic multi-page PDF."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd
from matplotlib.backends.backend_pdf import PdfPages
from matplotlib.figure import Figure

import simlab.report.breakdown_pages as breakdown_pages
import simlab.report.geometry_pages as geometry_pages
import simlab.report.routing_pages as routing_pages
import simlab.report.run_pages as run_pages
import simlab.report.sweep_pages as sweep_pages
from simlab.report.describe import engine_label, policy_label, run_caption, sweep_caption
from simlab.report.load import ReportInputError, RunResults, SweepResults, load_results
from simlab.report.provenance import provenance_pages
from simlab.report.run_pages import SkipPage, Style
from simlab.report.style import RC, palette
from simlab.report.tables import (
    run_summary_page,
    run_table,
    sweep_summary_pages,
    sweep_table,
    table_notes,
    trace_note,
)
from traces.atomic import atomic_path

log = logging.getLogger(__name__)
# matplotlib's PDF backend subsets fonts through fontTools, which logs every table at INFO
logging.getLogger("fontTools").setLevel(logging.WARNING)

DEFAULT_DIFF = ("marconi", "sglang_plus")
REPORTS_DIR = Path("reports")

SUMMARY = "Summary"
BOXES = "Token hit rate distributions"
TTFT = "TTFT CDFs"
CONTENTION = "Hit rate vs cache size"
DIFF = "Hit-rate difference by input length"
ALPHA = "Alpha sensitivity"
OTHER_KEYS = "Other swept keys"
OCCUPANCY = "Cache occupancy"
PROVENANCE = "Provenance"
ROUTING = routing_pages.ROUTING
BREAKDOWN = breakdown_pages.BREAKDOWN
ROUTING_SWEEP = routing_pages.ROUTING_SWEEP
GEOMETRY = geometry_pages.GEOMETRY

Builder = Callable[[Style], Figure | Sequence[Figure]]


@dataclass
class Report:
    """What was written: one entry of ``pages`` per PDF page (its section name, in order)."""

    path: Path
    kind: str  # "run" or "sweep"
    pages: list[str]
    skipped: dict[str, str] = field(default_factory=dict)  # section -> why it was left out
    table: pd.DataFrame = field(default_factory=pd.DataFrame)  # the summary table's numbers


def _not_a_sweep(what: str) -> Builder:
    def build(style: Style) -> Figure:
        raise SkipPage(f"a single run; needs a sweep over {what}")

    return build


def run_sections(run: RunResults) -> list[tuple[str, Builder]]:
    sections: list[tuple[str, Builder]] = [
        (BREAKDOWN, lambda s: breakdown_pages.breakdown_pages(run, s)),
        (BOXES, lambda s: run_pages.hit_cdf_page(run, s)),
        (TTFT, lambda s: run_pages.ttft_page(run, s)),
        (CONTENTION, _not_a_sweep("cache.size_gb")),
        (DIFF, lambda s: run_pages.hit_diff_page(run, s)),
        (ALPHA, _not_a_sweep("an alpha key such as policy.alpha")),
        (OCCUPANCY, lambda s: run_pages.occupancy_page(run, s)),
    ]
    return sections + (  # a cluster run (cluster.replicas > 1): its routing page
        [(ROUTING, lambda s: routing_pages.routing_page(run, s))]
        if routing_pages.has_replicas(run)
        else []
    )


def sweep_sections(sweep: SweepResults) -> list[tuple[str, Builder]]:
    def occupancy(style: Style) -> Figure:
        raise SkipPage(
            f"shown per run: python -m simlab.report {sweep.path}/<point dir> for a point's report"
        )

    return [
        (BOXES, lambda s: sweep_pages.hit_boxes_pages(sweep, s)),
        (TTFT, lambda s: sweep_pages.ttft_pages(sweep, s)),
        (CONTENTION, lambda s: sweep_pages.contention_pages(sweep, s)),
        (DIFF, lambda s: sweep_pages.hit_diff_pages(sweep, s)),
        (ALPHA, lambda s: sweep_pages.alpha_pages(sweep, s)),
        (
            ROUTING_SWEEP,
            lambda s: routing_pages.routing_sweep_pages(sweep.points, sweep.swept_keys, s),
        ),
        (OTHER_KEYS, lambda s: sweep_pages.other_key_pages(sweep, s)),
        (GEOMETRY, lambda s: geometry_pages.geometry_pages(sweep, s)),
        (OCCUPANCY, occupancy),
    ]


def resolve_diff(diff: Sequence[str] | None, policies: Sequence[str]) -> tuple[str, str] | None:
    """The two policies of the hit-rate difference pages: as asked, else marconi vs sglang_plus."""
    if diff is None:
        return DEFAULT_DIFF if set(DEFAULT_DIFF) <= set(policies) else None
    if len(diff) != 2 or diff[0] == diff[1]:
        raise ReportInputError(f"--diff needs two different policies, got {list(diff)}")
    missing = [p for p in diff if p not in policies]
    if missing:
        raise ReportInputError(
            f"--diff: policy {', '.join(missing)} not in the results (policies: {', '.join(policies)})"
        )
    return diff[0], diff[1]


def alpha_notes(policies: dict[str, dict[str, Any]]) -> list[str]:
    """A line naming each tuned policy's alpha, and its tuning caveats (summary.json's)."""
    tuned = [policy_label(n, p) for n, p in policies.items() if isinstance(p.get("alpha"), dict)]
    notes = [f"Alpha (tuned): {', '.join(tuned)}."] if tuned else []
    return notes + [f"Caveat: {n}: {c}" for n, p in policies.items() for c in p.get("caveats", [])]


def summary_pages(
    results: RunResults | SweepResults, style: Style, skipped: dict[str, str]
) -> tuple[pd.DataFrame, list[Figure]]:
    """The summary table (returned: its raw numbers) and the page(s) showing it."""
    table = run_table(results) if isinstance(results, RunResults) else sweep_table(results)
    base = results if isinstance(results, RunResults) else results.base
    policies = base.summary.get("policies") or {}
    rules = [p["request_hit_rule"] for p in policies.values() if p.get("request_hit_rule")]
    notes = table_notes(table, engine_label(base.config), rules[0] if rules else None)
    notes += alpha_notes(policies)
    if isinstance(results, RunResults):
        notes.insert(0, trace_note(results.trace))
        bounds = results.summary.get("bounds") or {}
        if bounds:
            notes.insert(
                1,
                "Bounds (token hit rate, replay at this capacity): "
                + ", ".join(f"{name} {100 * rate:.2f}%" for name, rate in bounds.items()),
            )
    if skipped:
        notes.append("Pages left out:")
        notes += [f"  - {name}: {why}" for name, why in skipped.items()]
    if isinstance(results, RunResults):
        bounds = results.summary.get("bounds") or {}
        page = run_summary_page(
            "Summary per policy", style.caption, table, notes, style.colours, bounds
        )
        return table, [page]
    labels = ["point", *results.keys, "policy"]
    title = "Summary per sweep point and policy"
    return table, sweep_summary_pages(title, style.caption, table, labels, notes, style.colours)


def render_report(
    results_dir: Path | str,
    out_path: Path | str | None = None,
    diff: Sequence[str] | None = None,
) -> Report:
    """Build the report of a run or sweep directory from its saved files; see :class:`Report`."""
    results = load_results(Path(results_dir))
    out = Path(out_path) if out_path is not None else default_out(results)
    caption = run_caption(results) if isinstance(results, RunResults) else sweep_caption(results)
    style = Style(caption, palette(results.policies), resolve_diff(diff, results.policies))
    sections = run_sections(results) if isinstance(results, RunResults) else sweep_sections(results)
    with matplotlib.rc_context(RC):
        built: list[tuple[str, Figure]] = []
        skipped: dict[str, str] = {}
        for name, builder in sections:
            try:
                figs = builder(style)
            except SkipPage as why:
                skipped[name] = str(why)
                log.info("page %r left out: %s", name, why)
                continue
            built += [(name, f) for f in ([figs] if isinstance(figs, Figure) else figs)]
        table, summary = summary_pages(results, style, skipped)
        built = [(SUMMARY, f) for f in summary] + built
        built += [(PROVENANCE, f) for f in provenance_pages(results, caption)]
        write_pdf(out, [f for _, f in built], title=f"simlab report: {results.path}")
    log.info("report written to %s (%d pages)", out, len(built))
    return Report(out, results.kind, [name for name, _ in built], skipped, table)


def build_report(
    results_dir: Path | str,
    out_path: Path | str | None = None,
    diff: Sequence[str] | None = None,
) -> Path:
    """Write the PDF report of a run or sweep directory; return its path.

    ``out_path`` defaults to ``reports/<name>.pdf`` (see :func:`default_out`). Raises
    :class:`ReportInputError` naming the file when a results file is missing or corrupt.
    """
    return render_report(results_dir, out_path, diff).path


def render_waterfall(results_dir: Path | str, png: Path | str) -> Path:
    """The reuse breakdown's first page of a run directory as a PNG (the docs' figures)."""
    results = load_results(Path(results_dir))
    if not isinstance(results, RunResults):
        raise ReportInputError(f"{results_dir}: a sweep; the waterfall is drawn per run")
    style = Style(run_caption(results), palette(results.policies), None)
    with matplotlib.rc_context(RC):
        try:
            page = breakdown_pages.breakdown_pages(results, style)[0]
        except SkipPage as why:
            raise ReportInputError(f"{results_dir}: {why}") from why
        with atomic_path(Path(png)) as tmp:
            page.savefig(tmp, format="png", dpi=110)
    return Path(png)


def write_pdf(path: Path, figures: Sequence[Figure], title: str) -> None:
    """All pages into one PDF, atomically (temp file + rename), without a creation date so the
    same results give the same bytes."""
    metadata = {"CreationDate": None, "Creator": "simlab.report", "Title": title}
    with atomic_path(path) as tmp, PdfPages(tmp, metadata=metadata) as pdf:
        for fig in figures:
            pdf.savefig(fig)


def default_out(results: RunResults | SweepResults) -> Path:
    """``reports/<trace>_<run dir>.pdf`` (``sweep_<dir>`` for a sweep) under the working
    directory; ``<run dir>`` is the directory relative to it, or its last two parts."""
    path = results.path.resolve()
    try:
        rel = path.relative_to(Path.cwd().resolve())
    except ValueError:
        rel = Path(*path.parts[-2:])
    if isinstance(results, RunResults):
        prefix = str(
            (results.config.get("trace") or {}).get("name") or results.trace.get("name") or "run"
        )
    else:
        prefix = "sweep"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(rel.parts)).strip("_") or "results"
    return REPORTS_DIR / f"{prefix}_{slug}.pdf"
