"""Command line of the GPU harness.

    python -m gpu_validate [run] --budget 540 --out DIR [--suites ...] [--resume]
                           [--model nemotron_h_8b] [--device cuda|cpu|auto] [--tiny] [--no-fla]
    python -m gpu_validate fit RECORDS... --out calibration.json [--hardware PRESET]
    python -m gpu_validate report RECORDS... --calibration FILE --out DIR
    python -m gpu_validate synth --out DIR [--model M] [--hardware PRESET] [--noise 0.03]

``run`` needs ``torch`` (the ``gpu`` extra); ``fit``, ``report`` and ``synth`` do not.
RECORDS are ``records.jsonl`` files or the run directories holding them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from gpu_validate.cases import SUITES

COMMANDS = ("run", "fit", "report", "synth", "tables")


_COMMON = argparse.ArgumentParser(add_help=False)
_COMMON.add_argument("-q", "--quiet", action="store_true", help="warnings only on stderr")


def _say(text: str) -> None:
    """The command's result on stdout (progress goes to stderr through logging)."""
    sys.stdout.write(f"{text}\n")


def _run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="measure (needs torch)", parents=[_COMMON])
    p.add_argument("--out", required=True, help="run directory (records.jsonl is appended)")
    p.add_argument("--budget", type=float, default=540.0, help="seconds; no case starts after")
    p.add_argument(
        "--suites",
        nargs="+",
        choices=SUITES,
        default=list(SUITES),
        help="suites to run (always in priority order)",
    )
    p.add_argument("--resume", action="store_true", help="skip cases already recorded in OUT")
    p.add_argument("--model", default="nemotron_h_8b", help="simlab model preset or YAML")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="scaled-down shapes (CPU checks)")
    p.add_argument("--no-fla", action="store_true", help="pure-PyTorch SSD even if fla works")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m gpu_validate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    p = sub.add_parser("fit", help="fit a calibration file to records", parents=[_COMMON])
    p.add_argument("records", nargs="+")
    p.add_argument("--out", required=True, help="calibration JSON to write")
    p.add_argument("--hardware", help="hardware preset (default: from the records)")
    p.add_argument("--suites", nargs="+", default=None, help="suites to fit on")
    p.add_argument(
        "--exclude-ops",
        nargs="*",
        default=None,
        help="op names left out (default: moe when the model has none)",
    )
    p = sub.add_parser("report", help="predicted vs measured report", parents=[_COMMON])
    p.add_argument("records", nargs="+")
    p.add_argument("--calibration", required=True)
    p.add_argument("--out", required=True, help="directory for report.md, CSV, PNG")
    p = sub.add_parser(
        "synth", help="synthetic records from the cost model (tests the fit)", parents=[_COMMON]
    )
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="nemotron_h_8b")
    p.add_argument("--hardware", default="h100_sxm")
    p.add_argument("--noise", type=float, default=0.03)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser(
        "tables", help="write the records as per-op latency tables", parents=[_COMMON]
    )
    p.add_argument("records", nargs="+")
    p.add_argument("--out", required=True, help="tables root (simlab: engine.kernel_tables)")
    p.add_argument("--gpu", required=True, help="the GPU's table name, e.g. h100_sxm")
    p.add_argument("--backend", default="vllm", help="the engine the kernels stand for")
    p.add_argument("--version", required=True, help="its version")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] not in (*COMMANDS, "-h", "--help"):
        args_list.insert(0, "run")  # `python -m gpu_validate --budget ...` means run
    args = _parser().parse_args(args_list)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(message)s",
        stream=sys.stderr,
    )
    if args.command == "run":
        from gpu_validate.run import RunConfig, run  # torch is imported only here

        end = run(
            RunConfig(
                out=args.out,
                budget=args.budget,
                suites=args.suites,
                resume=args.resume,
                model=args.model,
                device=args.device,
                tiny=args.tiny,
                no_fla=args.no_fla,
            )
        )
        _say(json.dumps(end))
        return 0
    if args.command == "fit":
        from gpu_validate.fit import FIT_SUITES, format_fit, run_fit

        data = run_fit(
            args.records, args.out, args.hardware, args.suites or FIT_SUITES, args.exclude_ops
        )
        _say(format_fit(data))
        _say(f"wrote {args.out}")
        return 0
    if args.command == "tables":
        from gpu_validate.tables import write_tables

        for path in write_tables(args.records, args.out, args.gpu, args.backend, args.version):
            _say(f"wrote {path}")
        return 0
    if args.command == "report":
        from gpu_validate.report import build_report, format_summary

        summary = build_report(args.records, args.calibration, args.out)
        _say(format_summary(summary))
        stack = ", stack_prefill.csv" if summary["stack_prefill"] else ""
        _say(f"wrote {args.out}/report.md, predictions.csv, summary.json, pred_vs_meas.png{stack}")
        return 0
    from gpu_validate.cases import load_hardware, load_model
    from gpu_validate.synth import synthetic_records, write_synthetic

    recs = synthetic_records(
        load_model(args.model),
        load_hardware(args.hardware),
        args.hardware,
        noise=args.noise,
        seed=args.seed,
    )
    _say(f"wrote {write_synthetic(args.out, recs)} ({len(recs)} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
