"""``python -m simlab [+policy=NAME] [trace=NAME] [cache.size_gb=GB] ...``: thin Hydra entry."""

from __future__ import annotations

import gc
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.types import RunMode
from omegaconf import DictConfig

from hydra_plugins.simlab_launcher.grouped import GroupedJoblibLauncher
from simlab.capacities import TABLE, capacity_list, run_capacities
from simlab.config import ConfigError
from simlab.simulate import simulate
from traces.format import TraceFormatError
from traces.paths import TraceFileError

Plugins.instance().register(GroupedJoblibLauncher)  # hydra/launcher=simlab_joblib

#: Errors of the user's making: reported as one clear line, without a traceback.
USER_ERRORS = (ConfigError, TraceFileError, TraceFormatError, FileNotFoundError)


@contextmanager
def reported_as_one_line() -> Iterator[None]:
    """A user error becomes one line on stderr and exit status 2, Ctrl-C one line and 130
    (the shell's convention for SIGINT); neither prints a traceback."""
    try:
        yield
    except USER_ERRORS as err:
        print(f"simlab: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("simlab: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    if capacity_list(cfg) is not None:
        main_capacities(cfg)
        return
    with reported_as_one_line():
        summary = simulate(cfg)
    print(
        f"\n{summary.trace['name']}: {summary.trace['requests']} requests, "
        f"{summary.trace['sessions']} sessions, cache {float(cfg.cache.size_gb):g} GB, "
        f"model {cfg.model.name}"
    )
    print(summary.table())
    if summary.out_dir is not None:
        print(f"results: {summary.out_dir}")
        if cfg.get("report") and HydraConfig.get().mode == RunMode.RUN:
            from simlab.report import build_report  # matplotlib: imported only to draw

            print(f"report: {build_report(summary.out_dir, summary.out_dir / 'report.pdf')}")


def main_capacities(cfg: DictConfig) -> None:
    """``cache.size_gb=[...]``: every capacity in this process (:mod:`simlab.capacities`); the
    table of (capacity, policy) rows is printed. ``report=true`` draws the capacity list's
    report (a sweep report over ``cache.size_gb``: the hit rate vs cache size curve, ...) into
    ``<out>/report.pdf``."""
    with reported_as_one_line():
        run = run_capacities(cfg)
    done = run.summaries[0] if run.summaries else None
    if done is not None:
        print(
            f"\n{done.trace['name']}: {done.trace['requests']} requests, "
            f"{done.trace['sessions']} sessions, {len(run.points)} capacities (GB), "
            f"model {cfg.model.name}"
        )
    print(run.table_text())
    if run.out_dir is not None:
        print(f"results: {run.out_dir} (one directory per capacity, table {TABLE})")
        if cfg.get("report") and HydraConfig.get().mode == RunMode.RUN:
            from simlab.report import build_report  # matplotlib: imported only to draw

            print(f"report: {build_report(run.out_dir, run.out_dir / 'report.pdf')}")


CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def unknown_choice(args: list[str]) -> str | None:
    """The first command-line override that picks a config file simlab does not have, as an
    error line (Hydra's own message is a multi-line search-path dump); None if all exist.
    Hydra's groups (``hydra/...``, launchers from plugins) and sweep expressions are left to
    Hydra."""
    for arg in args:
        key, sep, value = arg.lstrip("+~").partition("=")
        group = key.split("@")[0]
        folder = CONFIGS / group
        if not sep or group.startswith("hydra") or not folder.is_dir() or "(" in value:
            continue
        options = sorted(p.stem for p in folder.glob("*.yaml"))
        for choice in value.split(","):
            if choice not in ("", "null") and choice not in options:
                return f"{group}: no config {choice!r} (available: {', '.join(options)})"
    return None


#: launcher -> (what it needs on this machine, the check, the advice)
LAUNCHER_NEEDS = {
    "slurm": ("srun (a SLURM cluster)", lambda: shutil.which("srun") is not None),
    "ray": ("the ray package (pip install -e '.[ray]')", lambda: find_spec("ray") is not None),
    "ray_local": (
        "the ray package (pip install -e '.[ray]')",
        lambda: find_spec("ray") is not None,
    ),
}


def unusable_launcher(args: list[str]) -> str | None:
    """``hydra/launcher=NAME`` whose prerequisites this machine lacks, as an error line (the
    launcher would fail with a traceback only once the sweep starts)."""
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "hydra/launcher" and value in LAUNCHER_NEEDS:
            needs, present = LAUNCHER_NEEDS[value]
            if not present():
                return (
                    f"hydra/launcher={value}: needs {needs}, not found here; the default "
                    "launcher (joblib) runs a sweep on this machine"
                )
    return None


def compose_once(args: list[str]) -> None:
    """Hydra 1.3 composes the whole config a first time only to read ``hydra.mode`` (0.1-0.15 s
    of a short run's start-up), then again to run. simlab's configs never set it
    (``tests/test_cli.py``), so unless the command line does, the mode is what Hydra falls
    back to without one: ``-m`` / ``--multirun`` runs a sweep, anything else one run."""
    if not any("hydra.mode" in arg for arg in args):
        from hydra._internal.hydra import Hydra

        Hydra.get_mode = lambda self, config_name, overrides: None  # type: ignore[method-assign]


if __name__ == "__main__":
    problem = unknown_choice(sys.argv[1:]) or unusable_launcher(sys.argv[1:])
    if problem is not None:
        print(f"simlab: error: {problem}", file=sys.stderr)
        sys.exit(2)
    compose_once(sys.argv[1:])
    try:
        main()
    finally:
        # The interpreter's last garbage collection at exit walks every object still alive
        # (modules, the config, the trace): about 0.15 s of a short run, for nothing, since
        # the results are written and closed. Frozen objects are out of its reach.
        gc.freeze()
