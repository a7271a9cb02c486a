"""``hydra/launcher=simlab_joblib``: joblib workers that each run a group of sweep points sharing
a trace, one after the other, in one process (the sweep configs' launcher).

Hydra's joblib launcher sends every point to the worker pool as its own task, so a worker loads
the trace again for every point and a finished point (resumed sweep) still costs a task. This
launcher groups the points by their *trace overrides* (the keys ``trace``, ``trace.*``,
``data_dir``, ``arrivals.*`` and ``seed``: what :func:`simlab.run.simulate.trace_key` depends on),
in sweep order, and sends each group to one worker as one task, split into contiguous chunks
only when there are fewer groups than workers (``n_jobs``), so that no worker idles. A task runs
its points through the joblib launcher's own ``execute_job`` (same job numbers, directories,
callbacks and return values) inside :func:`simlab.run.simulate.shared_traces`: the trace is loaded
once per task and shared by its points. Results are returned in sweep order, and every point
writes exactly what the joblib launcher's would.

Options are the joblib launcher's (``hydra.launcher.n_jobs`` ...). ``python -m simlab`` registers
the launcher with Hydra (``Plugins.register``) as well as Hydra's own plugin scan finding it: an
editable install's import hook keeps ``hydra_plugins/simlab_launcher`` importable but out of the
scan. joblib is imported only to launch.
"""

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, setup_globals
from hydra.types import HydraContext, TaskFunction
from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from omegaconf import DictConfig

log = logging.getLogger(__name__)

#: override keys that change the loaded trace (exact keys, and prefixes ending with ".")
TRACE_KEYS = ("trace", "data_dir", "seed", "trace.", "arrivals.")


def override_key(override: str) -> str:
    """``+trace.limit=10`` -> ``trace.limit``."""
    return override.split("=", 1)[0].lstrip("+~")


def is_trace_override(override: str) -> bool:
    key = override_key(override)
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in TRACE_KEYS)


def group_points(job_overrides: Sequence[Sequence[str]]) -> list[list[int]]:
    """Point indices grouped by their trace overrides, groups in order of first appearance."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for idx, overrides in enumerate(job_overrides):
        key = tuple(sorted(o for o in overrides if is_trace_override(o)))
        groups.setdefault(key, []).append(idx)
    return list(groups.values())


def split_for_workers(groups: list[list[int]], workers: int) -> list[list[int]]:
    """Each group as one chunk when there are at least ``workers`` groups; otherwise each cut
    into contiguous chunks, about ``workers`` in all (in proportion to the group's size)."""
    if len(groups) >= workers:
        return groups
    total = sum(len(g) for g in groups)
    chunks = []
    for group in groups:
        parts = min(len(group), max(1, math.ceil(workers * len(group) / total)))
        size = math.ceil(len(group) / parts)
        chunks += [group[i : i + size] for i in range(0, len(group), size)]
    return chunks


def execute_chunk(
    first_idx: int,
    chunk: Sequence[tuple[int, Sequence[str]]],
    hydra_context: HydraContext,
    config: DictConfig,
    task_function: TaskFunction,
    singleton_state: dict[Any, Any],
) -> list[JobReturn]:
    """Run a chunk's points one after the other in this worker, sharing their trace."""
    from hydra_plugins.hydra_joblib_launcher._core import execute_job

    from simlab.run.simulate import shared_traces

    with shared_traces():
        return [
            execute_job(
                first_idx + idx, overrides, hydra_context, config, task_function, singleton_state
            )
            for idx, overrides in chunk
        ]


class GroupedJoblibLauncher(JoblibLauncher):
    """The joblib launcher, one task per group of points sharing a trace (module docstring)."""

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
        from joblib import Parallel, delayed, effective_n_jobs

        setup_globals()
        assert self.config is not None and self.task_function is not None
        assert self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        joblib_cfg = dict(self.joblib)
        joblib_cfg["backend"] = "loky"  # as the joblib launcher: threads are unsafe with Hydra
        process_joblib_cfg(joblib_cfg)
        workers = effective_n_jobs(joblib_cfg.get("n_jobs", -1))
        chunks = split_for_workers(group_points(job_overrides), workers)
        log.info(
            "simlab launcher: %d points in %d tasks (points sharing a trace share a task) on %d "
            "workers, sweep output dir: %s",
            len(job_overrides),
            len(chunks),
            workers,
            sweep_dir,
        )
        for idx, overrides in enumerate(job_overrides):
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        state = Singleton.get_state()
        results = Parallel(**joblib_cfg)(
            delayed(execute_chunk)(
                initial_job_idx,
                [(idx, job_overrides[idx]) for idx in chunk],
                self.hydra_context,
                self.config,
                self.task_function,
                state,
            )
            for chunk in chunks
        )
        by_idx: dict[int, JobReturn] = {}
        for chunk, returns in zip(chunks, results, strict=True):
            by_idx.update(zip(chunk, returns, strict=True))
        return [by_idx[idx] for idx in range(len(job_overrides))]


@dataclass
class SimlabJoblibConf(JobLibLauncherConf):
    _target_: str = "hydra_plugins.simlab_launcher.grouped.GroupedJoblibLauncher"


ConfigStore.instance().store(
    group="hydra/launcher",
    name="simlab_joblib",
    node=SimlabJoblibConf,
    provider="simlab",
)
