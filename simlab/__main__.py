"""``python -m simlab [+policy=NAME] [trace=NAME] [cache.size_gb=GB] ...``: thin Hydra entry."""

from __future__ import annotations

import gc
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.types import RunMode
from omegaconf import DictConfig

from hydra_plugins.simlab_launcher.grouped import GroupedJoblibLauncher
from simlab.run.capacities import TABLE, capacity_list, run_capacities
from simlab.run.cli import (
    compose_once,
    expand_compare,
    reported_as_one_line,
    unknown_choice,
    unusable_launcher,
)
from simlab.run.simulate import simulate

Plugins.instance().register(GroupedJoblibLauncher)  # hydra/launcher=simlab_joblib


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    with reported_as_one_line():
        capacities = capacity_list(cfg)
    if capacities is not None:
        main_capacities(cfg)
        return
    with reported_as_one_line():
        summary = simulate(cfg)
    size_gb = float(summary.config["cache"]["size_gb"])  # cache.size_gb=engine: as sized
    print(
        f"\n{summary.trace['name']}: {summary.trace['requests']} requests, "
        f"{summary.trace['sessions']} sessions, cache {size_gb:g} GB, model {cfg.model.name}"
    )
    print(summary.table())
    if summary.out_dir is not None:
        print(f"results: {summary.out_dir}")
        if cfg.get("report") and HydraConfig.get().mode == RunMode.RUN:
            from simlab.report import build_report  # matplotlib: imported only to draw

            print(f"report: {build_report(summary.out_dir, summary.out_dir / 'report.pdf')}")


def main_capacities(cfg: DictConfig) -> None:
    """``cache.size_gb=[...]``: every capacity in this process (:mod:`simlab.run.capacities`); the
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


if __name__ == "__main__":
    problem = unknown_choice(sys.argv[1:]) or unusable_launcher(sys.argv[1:])
    if problem is not None:
        print(f"simlab: error: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.argv[1:] = expand_compare(sys.argv[1:])
    compose_once(sys.argv[1:])
    try:
        main()
    finally:
        # The interpreter's last garbage collection at exit walks every object still alive
        # (modules, the config, the trace): about 0.15 s of a short run, for nothing, since
        # the results are written and closed. Frozen objects are out of its reach.
        gc.freeze()
