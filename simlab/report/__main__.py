"""``python -m simlab.report DIR [--out PDF | --in-dir] [--diff A B] [-v]``.

Prints the report's path; a bad results directory or an unwritable output is reported as one
line before any page is drawn (exit status 2), Ctrl-C as one line (130).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from simlab.report.build import REPORTS_DIR, render_report, render_waterfall
from simlab.report.load import ReportInputError


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m simlab.report",
        description="Multi-page PDF report of a simlab run or sweep directory.",
    )
    parser.add_argument(
        "results_dir",
        help="run directory (summary.json, records.parquet) "
        "or sweep directory (points.parquet + one run directory per point)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", help=f"PDF to write (default: {REPORTS_DIR}/<name>.pdf)")
    where.add_argument(
        "--in-dir", action="store_true", help="write report.pdf into the results directory"
    )
    parser.add_argument(
        "--diff",
        nargs=2,
        metavar=("A", "B"),
        help="policies of the hit-rate difference page (default: marconi "
        "sglang_plus when both ran)",
    )
    where.add_argument(
        "--waterfall",
        metavar="PNG",
        help="write only the reuse breakdown's waterfall page, as a PNG (a run directory)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log each page")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose:
        logging.getLogger("simlab").setLevel(logging.INFO)
    out = f"{args.results_dir}/report.pdf" if args.in_dir else args.out
    try:
        if args.waterfall:
            check_writable(Path(args.waterfall))
            print(f"waterfall: {render_waterfall(args.results_dir, args.waterfall)}")
            return 0
        if out is not None:
            check_writable(Path(out))
        report = render_report(args.results_dir, out, args.diff)
    except ReportInputError as err:
        print(f"simlab.report: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simlab.report: interrupted", file=sys.stderr)
        return 130
    print(f"report: {report.path} ({len(report.pages)} pages)")
    return 0


def check_writable(pdf: Path) -> None:
    """The PDF's folder exists (or can be made) and takes a file: checked before rendering."""
    try:
        pdf.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=pdf.parent):
            pass
    except OSError as err:
        raise ReportInputError(f"--out: cannot write {pdf} ({err.strerror or err})") from err


if __name__ == "__main__":
    sys.exit(main())
