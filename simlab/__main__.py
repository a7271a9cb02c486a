"""``python -m simlab [+policy=NAME] [trace=NAME] [cache.size_gb=GB] ...``: thin Hydra entry."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from simlab.config import ConfigError
from simlab.report import build_report
from simlab.simulate import simulate
from traces.format import TraceFormatError
from traces.paths import TraceFileError

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
            print(f"report: {build_report(summary.out_dir, summary.out_dir / 'report.pdf')}")


if __name__ == "__main__":
    sys.exit(main())
