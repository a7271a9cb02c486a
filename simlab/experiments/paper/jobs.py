"""Running the plan: one multirun (``python -m simlab -m ...``) per study and mode, resumed
where it stopped, its progress logged."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simlab.experiments.paper.errors import StudyFailed
from simlab.experiments.paper.layout import DONE, ROOT
from simlab.experiments.paper.modes import MODES, Features, Mode, mode_overrides
from simlab.experiments.paper.plan import Plan, Study
from simlab.run.sweep import SUMMARY
from simlab.util.provenance import code_version
from traces.atomic import atomic_path

log = logging.getLogger(__name__)


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


def run_all(all_jobs: Sequence[Job], jobs: int, overwrite: bool, logs: Path) -> None:
    """Run (or resume) every multirun of ``all_jobs``: a failing one does not stop the others;
    when any failed, :class:`StudyFailed` names them all."""
    start, failed = time.perf_counter(), []
    for number, job in enumerate(all_jobs, start=1):
        log.info("[%d/%d] %s: %d points", number, len(all_jobs), job.label, job.study.points)
        try:
            run_job(job, jobs, overwrite, logs)
        except StudyFailed as err:
            log.error("%s", err)
            failed.append(str(err))
    if failed:
        raise StudyFailed(
            f"{len(failed)} of {len(all_jobs)} studies failed (what finished is kept; rerun the "
            f"same command to resume): " + " | ".join(failed)
        )
    log.info("all studies finished in %.0f s", time.perf_counter() - start)


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
    ``every`` seconds); its exit status. Ctrl-C (or SIGTERM, see
    :func:`simlab.experiments.paper.cli.main`) stops it and its workers (what finished is
    kept)."""
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
