"""Before/after simulation speed: ``bench.speed`` in an old checkout and in this one, side by side.

Runs ``python -m bench.speed --repeat 1 [--traces ...] [--engines ...]`` as a subprocess in the
old checkout (``BASE_DIR``, e.g. a ``git worktree`` of the commit before a refactor) and in the
new one (``--new``, default this checkout), alternating which goes first each round (ABBA order,
so slow drift of the machine does not favour one side), ``--repeat`` rounds (default 3). Each run
is read back from ``bench/results/speed.json`` under its checkout's root. Prints, per case and
policy, the median requests/s of each side over the rounds, the ratio new/base (and the ratio of
the best runs: timing noise on a shared machine only ever slows a run down), and flags every case
slower by more than ``--threshold`` (default 5%) by ``--stat`` (median, or best); also flags
cases whose token hit rate differs (a speed comparison of different simulations means nothing).
The table goes to ``bench/results/compare_speed.json`` in this checkout. Exit status 1 when
anything is flagged.

Usage::

    git worktree add /tmp/base HEAD            # before the refactor
    python -m bench.compare_speed /tmp/base                       # all traces and engines
    python -m bench.compare_speed /tmp/base --repeat 1 --traces sharegpt --engines replay

Each subprocess uses this interpreter (``sys.executable``) with its checkout as the current
directory, so ``python -m`` imports that checkout's ``simlab`` (checked before the runs).
``$SIMLAB_DATA_DIR`` is set for both (``--data-dir``, default as in :mod:`bench.identity`), since
a worktree outside the project's parent directory would not find ``../shared/data`` by itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.identity import default_data_dir

ROOT = Path(__file__).resolve().parents[1]
SPEED_JSON = Path("bench") / "results" / "speed.json"
OUT_JSON = ROOT / "bench" / "results" / "compare_speed.json"

log = logging.getLogger("bench.compare_speed")

#: speed.json: {case: {policy: {"requests_per_s": ..., "token_hit_rate": ..., ...}}}
SpeedResult = dict[str, dict[str, dict[str, float]]]


def child_env(data_dir: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if data_dir is not None:
        env["SIMLAB_DATA_DIR"] = str(data_dir)
    return env


def check_origin(checkout: Path, env: dict[str, str]) -> None:
    """Fail unless ``python -m`` in ``checkout`` imports that checkout's simulator packages."""
    code = "import simlab, policies, traces\nfor m in (simlab, policies, traces): print(m.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    strays = [path for path in out if not Path(path).resolve().is_relative_to(checkout)]
    if strays:
        raise RuntimeError(f"in {checkout} the simulator is imported from elsewhere: {strays}")


def speed_args(traces: list[str] | None, engines: list[str] | None) -> list[str]:
    args = ["--repeat", "1"]
    if traces:
        args += ["--traces", *traces]
    if engines:
        args += ["--engines", *engines]
    return args


def run_speed(checkout: Path, args: list[str], env: dict[str, str]) -> SpeedResult:
    """One ``bench.speed`` run in ``checkout``; its freshly written ``speed.json``."""
    result = checkout / SPEED_JSON
    started = time.time_ns()
    done = subprocess.run(
        [sys.executable, "-m", "bench.speed", *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.speed failed in {checkout}:\n{done.stdout}\n{done.stderr}")
    if not result.is_file() or result.stat().st_mtime_ns < started:
        raise RuntimeError(f"bench.speed in {checkout} did not write {result}")
    return json.loads(result.read_text())


def run_rounds(
    checkouts: dict[str, Path], args: list[str], rounds: int, env: dict[str, str]
) -> dict[str, list[SpeedResult]]:
    """``rounds`` runs per side, alternating which side goes first (base, new, new, base, ...)."""
    runs: dict[str, list[SpeedResult]] = {side: [] for side in checkouts}
    for index in range(rounds):
        order = list(checkouts) if index % 2 == 0 else list(reversed(checkouts))
        for side in order:
            t0 = time.perf_counter()
            runs[side].append(run_speed(checkouts[side], args, env))
            log.info("round %d/%d %-4s %6.1f s", index + 1, rounds, side, time.perf_counter() - t0)
    return runs


def rates(runs: list[SpeedResult], case: str, policy: str) -> list[float]:
    return [run[case][policy]["requests_per_s"] for run in runs if policy in run.get(case, {})]


def hit_rates(runs: list[SpeedResult], case: str, policy: str) -> set[float]:
    return {run[case][policy]["token_hit_rate"] for run in runs if policy in run.get(case, {})}


STATISTICS = {"median": statistics.median, "best": max}


def summarize(values: list[float], stat: str) -> float | None:
    return STATISTICS[stat](values) if values else None


def ratio(new: float | None, base: float | None) -> float | None:
    return new / base if base and new is not None else None


def table(
    runs: dict[str, list[SpeedResult]], threshold: float, stat: str = "median"
) -> list[dict[str, Any]]:
    """One row per (case, policy) seen on either side; ``stat`` (median or best) decides flags."""
    keys = {
        (case, policy)
        for side_runs in runs.values()
        for run in side_runs
        for case, policies in run.items()
        for policy in policies
    }
    rows = []
    for case, policy in sorted(keys):
        base, new = rates(runs["base"], case, policy), rates(runs["new"], case, policy)
        base_rps, new_rps = summarize(base, "median"), summarize(new, "median")
        base_best, new_best = summarize(base, "best"), summarize(new, "best")
        flag_ratio = ratio(summarize(new, stat), summarize(base, stat))
        same_hits = hit_rates(runs["base"], case, policy) == hit_rates(runs["new"], case, policy)
        rows.append(
            {
                "case": case,
                "policy": policy,
                "base_requests_per_s": base_rps,
                "new_requests_per_s": new_rps,
                "ratio": ratio(new_rps, base_rps),
                "base_best_requests_per_s": base_best,
                "new_best_requests_per_s": new_best,
                "best_ratio": ratio(new_best, base_best),
                "slower": flag_ratio is None or flag_ratio < 1 - threshold,
                "same_token_hit_rate": same_hits,
                "base_runs": base,
                "new_runs": new,
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]], threshold: float) -> str:
    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [
        f"{'case':18s} {'policy':14s} {'base req/s':>11s} {'new req/s':>11s} {'new/base':>9s}"
        f" {'best new/base':>14s}"
    ]
    for row in rows:
        flags = []
        if row["slower"]:
            flags.append(f"SLOWER by more than {threshold:.0%}")
        if not row["same_token_hit_rate"]:
            flags.append("HIT RATE DIFFERS")
        lines.append(
            f"{row['case']:18s} {row['policy']:14s} {num(row['base_requests_per_s'], '11.0f')} "
            f"{num(row['new_requests_per_s'], '11.0f')} {num(row['ratio'], '9.3f')} "
            f"{num(row['best_ratio'], '14.3f')}  " + ", ".join(flags)
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("base_dir", type=Path, help="the old checkout")
    parser.add_argument("--new", type=Path, default=ROOT, help="the new checkout (default: this)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per side (median)")
    parser.add_argument("--traces", nargs="*", default=None, help="passed to bench.speed")
    parser.add_argument("--engines", nargs="*", default=None, help="passed to bench.speed")
    parser.add_argument("--threshold", type=float, default=0.05, help="allowed slowdown")
    parser.add_argument(
        "--stat",
        choices=sorted(STATISTICS),
        default="median",
        help="statistic over rounds that decides the flags (median; best = highest req/s)",
    )
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)

    checkouts = {"base": args.base_dir.resolve(), "new": args.new.resolve()}
    env = child_env(args.data_dir.resolve() if args.data_dir else default_data_dir())
    for checkout in checkouts.values():
        check_origin(checkout, env)
    runs = run_rounds(checkouts, speed_args(args.traces, args.engines), args.repeat, env)
    rows = table(runs, args.threshold, args.stat)
    print(format_table(rows, args.threshold))
    report = {
        "base": str(checkouts["base"]),
        "new": str(checkouts["new"]),
        "rounds": args.repeat,
        "threshold": args.threshold,
        "stat": args.stat,
        "rows": rows,
    }
    OUT_JSON.parent.mkdir(parents=True, exist_ok=True)
    OUT_JSON.write_text(json.dumps(report, indent=2) + "\n")
    flagged = [row for row in rows if row["slower"] or not row["same_token_hit_rate"]]
    print(f"{len(flagged)} of {len(rows)} cases flagged; table in {OUT_JSON}")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
