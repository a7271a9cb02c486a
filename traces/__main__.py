"""``python -m traces describe TRACE [overrides...] [--json]``: workload statistics of a trace;
``python -m traces convert --from FORMAT IN OUT``: another format to the request log
(:mod:`traces.convert`).

``TRACE`` is a config of ``configs/trace/`` (``sharegpt``, ``swebench``, ``lmsys``, ``mooncake``,
``azure_conv``, ``batchllm``, ...); overrides use Hydra syntax and the run config's keys, e.g.
``trace.limit=10``, ``trace.path=/my/file.jsonl``, ``data_dir=/data``, ``seed=3``. The config is
composed with Hydra's compose API from the project's ``configs/`` exactly as
``python -m simlab trace=TRACE ...`` would compose it; the loader is instantiated from its
``_target_``. Output: the text of :func:`traces.describe.format_description` (or its JSON with
``--json``). Errors of the user's making (missing file, malformed input, bad override) are one
line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from traces.describe import describe, format_description
from traces.format import Trace, TraceFormatError
from traces.paths import REPO_ROOT, DataFileMissingError, TraceFileError

CONFIG_DIR = REPO_ROOT / "configs"
USER_ERRORS = (DataFileMissingError, TraceFileError, TraceFormatError, ValueError)


def compose_trace_config(trace: str, overrides: list[str]) -> Any:
    """The composed run config for ``trace=TRACE`` plus ``overrides`` (Hydra compose API)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[f"trace={trace}", *overrides])


def load_configured_trace(trace: str, overrides: list[str]) -> Trace:
    """Instantiate the trace loader of the composed config."""
    from hydra.utils import instantiate

    cfg = compose_trace_config(trace, overrides)
    loaded = instantiate(cfg.trace, _convert_="all")
    if not isinstance(loaded, Trace):
        raise ValueError(f"trace config {trace!r} did not produce a Trace: {type(loaded)}")
    return loaded


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m traces", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    desc = sub.add_parser("describe", help="workload statistics of a trace config")
    desc.add_argument("trace", help="a config name under configs/trace/")
    desc.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trace.limit=10")
    desc.add_argument("--json", action="store_true", help="print the statistics as JSON")
    desc.add_argument("-v", "--verbose", action="store_true", help="log loader progress")
    conv = sub.add_parser("convert", help="another trace format to simlab's request log")
    conv.add_argument("--from", dest="fmt", required=True, help="mooncake|bailian|aiperf|...")
    conv.add_argument("source", help="the input file (claude_code: a file or a folder)")
    conv.add_argument("out", help="the request log to write (.jsonl or .parquet)")
    conv.add_argument("-v", "--verbose", action="store_true", help="log progress")
    return parser


def run_convert(args: argparse.Namespace) -> int:
    from pathlib import Path

    from traces.convert import convert

    try:
        n = convert(args.fmt, Path(args.source), Path(args.out))
    except (*USER_ERRORS, OSError) as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        sys.stderr.write(f"traces: error: {lines[0]}\n")
        return 2
    sys.stdout.write(f"{n} requests written to {args.out}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.command == "convert":
        return run_convert(args)
    from hydra.errors import HydraException

    started = time.perf_counter()
    try:
        trace = load_configured_trace(args.trace, args.overrides)
    except (*USER_ERRORS, HydraException) as exc:
        cause = exc.__cause__ if isinstance(exc, HydraException) and exc.__cause__ else exc
        lines = str(cause).strip().splitlines() or [type(cause).__name__]
        sys.stderr.write(f"traces: error: {lines[0]}\n")  # Hydra's search path is noise here
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("traces: interrupted\n")
        return 130
    loaded = time.perf_counter() - started
    stats = describe(trace)
    stats["load_seconds"] = loaded
    if args.json:
        sys.stdout.write(json.dumps(stats, indent=2) + "\n")
    else:
        sys.stdout.write(f"{format_description(stats)}\n(loaded in {loaded:.2f} s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
