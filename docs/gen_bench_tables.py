"""The benchmark page of current figures (``docs/benchmarks/speed.md``) from ``bench/results/``.

``make bench`` (``python -m bench.speed``) writes ``bench/results/speed.json``: requests/s and the
token hit rate of every policy on every trace and engine. This renders it as one table. The docs
hook (``docs/hooks.py``) reruns it at every build where that file exists, so the page follows the
newest local run; the rendered page is committed, since ``bench/results/`` is not. Run by hand:
``python docs/gen_bench_tables.py`` (``--check``: exit 1 when the page is stale).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEED = ROOT / "bench" / "results" / "speed.json"
OUT = ROOT / "docs" / "benchmarks" / "speed.md"

HEADER = """# Simulator speed

Generated from `bench/results/speed.json` by `docs/gen_bench_tables.py` (the docs build reruns it
where that file exists): the newest `python -m bench.speed` run (`make bench` runs it), requests
simulated per second of wall time for each policy, trace and engine, and the token hit rate that
run computed. A shared 2-core machine's speed varies from hour to hour: compare figures of one
run, and use `python -m bench.compare_speed BASE` for a change. Earlier runs are in the
[history](history.md).

"""


def render(speed: dict[str, dict[str, dict[str, float]]]) -> str:
    """The table: one row per trace/engine case and policy."""
    rows = ["| case | policy | requests | requests/s | token hit rate |", "|---|---|---|---|---|"]
    for case, policies in speed.items():
        for policy, figures in policies.items():
            rows.append(
                f"| {case} | {policy} | {int(figures['requests']):,} | "
                f"{figures['requests_per_s']:,.0f} | {figures['token_hit_rate']:.4f} |"
            )
    return HEADER + "\n".join(rows) + "\n"


def generate(path: Path = SPEED) -> str | None:
    """The page's text, or None when no ``bench.speed`` run left its results here."""
    if not path.exists():
        return None
    return render(json.loads(path.read_text()))


if __name__ == "__main__":
    text = generate()
    if text is None:
        sys.exit(f"{SPEED}: no results; run `python -m bench.speed` (make bench) first")
    if "--check" in sys.argv:
        sys.exit(0 if OUT.exists() and OUT.read_text() == text else 1)
    OUT.write_text(text)
