"""The whole study: run (or resume) every multirun, then write ``paper.md`` and ``paper.pdf``."""

from __future__ import annotations

import logging
from pathlib import Path

from simlab.experiments.paper.comparison import comparison
from simlab.experiments.paper.errors import PaperError
from simlab.experiments.paper.jobs import build_jobs, run_all
from simlab.experiments.paper.layout import PAPER_MD, PAPER_PDF
from simlab.experiments.paper.manifest import claim_out_dir, manifest
from simlab.experiments.paper.markdown import paper_markdown
from simlab.experiments.paper.modes import Features, probe_features
from simlab.experiments.paper.pdf import pdf_pages, write_pdf
from simlab.experiments.paper.plan import Plan
from simlab.experiments.paper.results import load_results
from traces.atomic import atomic_path

log = logging.getLogger(__name__)


def run_paper(
    plan: Plan,
    out: Path,
    *,
    jobs: int = 2,
    data_dir: Path | None = None,
    overwrite: bool = False,
    features: Features | None = None,
) -> Path:
    """Run (or resume) ``plan`` in both modes and write ``paper.md`` and ``paper.pdf`` into
    ``out``; the path of ``paper.md``. A failing study does not stop the others; when any
    failed, :class:`StudyFailed` names them all and nothing is written (a rerun resumes). See
    :mod:`simlab.experiments.paper` for the invariants."""
    features = probe_features() if features is None else features
    for text in features.missing():
        log.warning("this checkout lacks %s", text)
    if not features.arrivals:
        raise PaperError("this checkout lacks arrivals.gaps (the paper's trace construction)")
    out = out.resolve()
    claim_out_dir(out, manifest(plan, features, data_dir), overwrite)
    run_all(build_jobs(plan, out, features, data_dir), jobs, overwrite, out / "logs")
    return write_outputs(plan, out, features)


def write_outputs(plan: Plan, out: Path, features: Features) -> Path:
    """``paper.md`` and ``paper.pdf`` from the finished sweeps, each atomically."""
    results = load_results(plan, out)
    table = comparison(results)
    markdown = paper_markdown(plan, results, table, features)
    with atomic_path(out / PAPER_MD) as tmp:
        tmp.write_text(markdown)
    write_pdf(out / PAPER_PDF, pdf_pages(plan, results, table))
    log.info("wrote %s and %s", out / PAPER_MD, out / PAPER_PDF)
    return out / PAPER_MD
