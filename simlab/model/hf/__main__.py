"""``python -m simlab.model.hf table [--all]``: the bundled configs' KV and state bytes."""

from __future__ import annotations

import argparse
import logging
import sys

from simlab.model.hf.table import markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simlab.model.hf", description=__doc__)
    parser.add_argument("command", choices=["table"])
    parser.add_argument("--all", action="store_true", help="every model, not only hybrids")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    sys.stdout.write(markdown(hybrids_only=not args.all))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
