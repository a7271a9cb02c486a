"""``python -m simlab.paper``: the command line."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from simlab.experiments.paper.errors import PaperError, StudyFailed
from simlab.experiments.paper.plan import full_plan, quick_plan
from simlab.experiments.paper.runner import run_paper

DEFAULT_OUT = {False: Path("runs/paper"), True: Path("runs/paper-quick")}


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
        sys.stderr.write(
            "simlab.experiments.paper: interrupted; rerun the same command to resume\n"
        )
        return 130
    print(path)  # noqa: T201 - the command line's result
    return 0


def run_main() -> None:
    """``python -m simlab.paper``."""
    sys.exit(main())
