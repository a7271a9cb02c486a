"""What produced a result: the simlab version and the git commit it ran from."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def project_version() -> str:
    try:
        return importlib.metadata.version("simlab")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (simlab not installed)"


def _git(root: Path, *args: str) -> str:
    """Output of ``git -C root ARGS`` (raises on failure)."""
    cmd = ["git", "-C", str(root), *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


@functools.cache
def git_commit(root: Path = PROJECT_ROOT) -> str:
    """``HEAD`` of the checkout simlab runs from, ``+dirty`` with uncommitted changes; or why not.
    Asked once per process, as :func:`code_version` is (a capacity list's points share it)."""
    try:
        head = _git(root, "rev-parse", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError) as err:
        log.debug("no git commit: %s", err)
        return "unavailable (not a git checkout)"
    return head + (" +uncommitted changes" if dirty else "")


@functools.cache
def code_version(root: Path = PROJECT_ROOT) -> str:
    """What results depend on besides their config: the commit, plus a digest of uncommitted
    changes to tracked files (``SHA+DIGEST``); the package version outside a git checkout."""
    try:
        head = _git(root, "rev-parse", "HEAD")
        diff = _git(root, "diff", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return f"simlab {project_version()}"
    return f"{head}+{hashlib.sha256(diff.encode()).hexdigest()[:12]}" if diff else head


def provenance() -> dict[str, str]:
    return {
        "simlab_version": project_version(),
        "git_commit": git_commit(),
        "code_version": code_version(),
    }
