"""``OUT/paper.json``: what the results depend on, and the claim on an output directory."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from simlab.experiments.paper.errors import PaperError
from simlab.experiments.paper.layout import (
    CONFIGS,
    DONE,
    MANIFEST,
    PAPER_MD,
    PAPER_PDF,
    experiment_file,
)
from simlab.experiments.paper.modes import MODES, Features
from simlab.experiments.paper.plan import Plan, jsonable
from simlab.util.provenance import code_version
from traces.atomic import atomic_path

log = logging.getLogger(__name__)


def manifest(plan: Plan, features: Features, data_dir: Path | None) -> dict[str, Any]:
    """Everything the results depend on: the plan, the modes, the checkout's features, the data
    directory, the code version and the digests of the config files the plan reads (new,
    untracked ones are not in the code version)."""
    files = [experiment_file(s.experiment) for s in plan.studies]
    files += sorted((CONFIGS / "paper").glob("**/*.yaml"))
    return {
        "plan": plan.to_dict(),
        "modes": jsonable(MODES),
        "features": dataclasses.asdict(features),
        "data_dir": None if data_dir is None else str(data_dir),
        "config_files": {str(f.relative_to(CONFIGS)): file_digest(f) for f in sorted(set(files))},
        "code_version": code_version(),
    }


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
