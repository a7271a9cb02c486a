"""The finished sweeps of each mode, read back: hit rates by study, policy and point."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simlab.experiments.paper.errors import StudyFailed
from simlab.experiments.paper.modes import MODES, Mode
from simlab.experiments.paper.plan import Plan
from simlab.run.sweep import RECORDS, SUMMARY, collect


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
