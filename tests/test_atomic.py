"""Atomic writes: whole files or none, with the permissions of a plain open() (issue 18, item 8)."""

from __future__ import annotations

import os
import stat

import pytest

from tests.fixtures import compose
from traces.atomic import atomic_path


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")

    def killed_mid_write() -> None:
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        killed_mid_write()
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]


def test_written_files_follow_the_umask(tmp_path, umask_022):
    with atomic_path(tmp_path / "x.bin") as tmp:
        tmp.write_bytes(b"x")
    assert mode(tmp_path / "x.bin") == 0o644


def test_a_run_writes_results_colleagues_can_read(tmp_path, umask_022):
    from simlab.run.simulate import simulate

    out = tmp_path / "run"
    overrides = ["+policy=sglang_plus", "engine=replay", "trace=chat", "trace.n_sessions=3"]
    simulate(compose([*overrides, "bounds.enabled=false", f"output_dir={out}"]))
    written = {p.name: mode(p) for p in out.iterdir()}
    assert written == {n: 0o644 for n in ("records.parquet", "occupancy.parquet", "summary.json")}
