"""``python -m simlab.validate silicon --out DIR``: replay the silicon points
(:mod:`simlab.experiments.silicon`), fit and cross-validate the overheads
(:mod:`simlab.experiments.silicon_fit`), print the error table and write ``DIR/validation.json``.

The full table takes about half an hour a core, so the replay is resumable and parallel:
- each point's two simulations are appended to ``DIR/points.jsonl`` as it finishes, under a
  header naming the code and the aiconfigurator-core that produced them. The same command run
  again on the same code simulates only the points not yet there; a line cut off by a crash is
  dropped and its point simulated again;
- ``--jobs N`` simulates N points at once, each in its own process. Every point is simulated on
  its own, from its own seed, so the result does not depend on N or on the order they finish in;
- ``DIR`` holding another code's points (or a ``validation.json`` without them) is an error
  unless ``--overwrite``; ``validation.json`` is written atomically.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from simlab.config import ConfigError
from simlab.cost.measured import tables
from simlab.engines.timed import defaults, stated
from simlab.experiments.silicon import PROBE_S, Point, points, sample, simulate
from simlab.experiments.silicon_fit import by_engine, cross_validate, lines, summary
from simlab.util.provenance import code_version
from traces.atomic import atomic_path
from traces.progress import Progress

log = logging.getLogger(__name__)

POINTS = "points.jsonl"
VALIDATION = "validation.json"

Sims = list[list[float]]  # [(TTFT, TPOT) at overhead 0, (TTFT, TPOT) at PROBE_S], in ms


def producer() -> dict[str, str]:
    """What the points' simulations depend on besides the point: the code and the tables."""
    try:
        aic = importlib.metadata.version("aiconfigurator-core")
    except importlib.metadata.PackageNotFoundError:
        aic = "not installed"
    return {"code_version": code_version(), "aiconfigurator_core": aic}


def claim(out: Path, overwrite: bool) -> dict[str, Sims]:
    """The points ``out`` already holds from this code (to resume), with ``points.jsonl``
    rewritten to them; :class:`ConfigError` when ``out`` holds another run's results, unless
    ``overwrite``, which starts afresh."""
    path, header = out / POINTS, producer()
    done: dict[str, Sims] = {}
    why = ""
    if path.is_file():
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                break  # a line cut off by a crash: the points after it are simulated again
        if rows and rows[0] == header:
            done = {row["id"]: row["sims"] for row in rows[1:]}
        else:
            stored = rows[0] if rows else {}
            why = (
                f"points simulated by other code ({stored.get('code_version', 'unknown')}, "
                f"aiconfigurator-core {stored.get('aiconfigurator_core', 'unknown')})"
            )
    elif (out / VALIDATION).exists():
        why = f"a {VALIDATION} without its {POINTS}"
    if why and not overwrite:
        raise ConfigError(
            f"--out {out} holds {why}; pass --overwrite to replace it, or choose another --out"
        )
    if why:
        log.warning("--overwrite: replacing the results in %s (%s)", out, why)
    kept = [header, *({"id": pid, "sims": sims} for pid, sims in done.items())]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
    if done:
        log.info("%s: resuming with %d points simulated", path, len(done))
    return done


def quiet(level: int = logging.WARNING) -> None:
    """A replay's logging (each worker's too): the run's level, without the two caveats every
    point's plan gives by design (zero overheads: the fit adds them; the engine's defaults: each
    point runs its server's flags)."""
    logging.basicConfig(level=level, format="%(message)s")
    logging.getLogger("simlab.run.plan").addFilter(
        lambda record: (
            not record.getMessage().startswith("engine overheads are 0")
            and not record.getMessage().endswith(defaults.SAID)
        )
    )


def both(point: Point) -> tuple[str, Sims]:
    """The point's (TTFT, TPOT) at iteration overheads 0 and :data:`PROBE_S`."""
    return point.id, [list(simulate(point, 0.0)), list(simulate(point, PROBE_S))]


def replay(pts: list[Point], out: Path, jobs: int, overwrite: bool) -> np.ndarray:
    """Every point's two simulations (points x 2 x 2), those ``out`` holds reused, the rest
    simulated ``jobs`` at a time and appended to ``out/points.jsonl`` as each finishes."""
    done = claim(out, overwrite)
    todo = [p for p in pts if p.id not in done]
    with (
        Progress(len(todo), "silicon points", check_every=1) as progress,
        (out / POINTS).open("a") as sink,
    ):

        def keep(pid: str, sims: Sims) -> None:
            done[pid] = sims
            sink.write(json.dumps({"id": pid, "sims": sims}) + "\n")
            sink.flush()
            progress.update()

        if jobs == 1:
            for p in todo:
                keep(*both(p))
        elif todo:
            # spawn: each worker imports simlab afresh (no forked numba or Hydra state)
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(jobs, context, quiet, (logging.getLogger().level,)) as pool:
                for future in as_completed([pool.submit(both, p) for p in todo]):
                    keep(*future.result())
    return np.array([done[p.id] for p in pts], dtype=float)


def validate(
    out: Path,
    per_group: int | None = None,
    max_concurrency: int = 512,
    jobs: int = 1,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Replay (resuming what ``out`` holds), fit, cross-validate and write
    ``out/validation.json``."""
    csv = tables.systems_dir()
    if csv is None:
        raise ConfigError("simlab.validate silicon: aiconfigurator-core is not installed")
    pts, skipped = points(csv / "silicon_sample.csv")
    pts = [p for p in sample(pts, per_group) if p.concurrency <= max_concurrency]
    sims = replay(pts, out, jobs, overwrite)
    result = summary(pts, cross_validate(pts, sims)) | {"skipped": skipped}
    with atomic_path(out / VALIDATION) as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    return result


def state(out: Path, to: Path = stated.STATED) -> dict[str, Any]:
    """Write the stated latency errors (:mod:`simlab.engines.timed.stated`) of the run in
    ``out`` (its ``validation.json``, and the code that simulated its points) to ``to``."""
    try:
        result = json.loads((out / VALIDATION).read_text())
        header = json.loads((out / POINTS).read_text().splitlines()[0])
    except (OSError, ValueError, IndexError) as err:
        raise ConfigError(f"{out}: no readable {VALIDATION} and {POINTS} ({err})") from err
    engines = result.get("engines") or by_engine(result["rows"], result["overheads_s"])
    table = header | {
        "command": "python -m simlab.validate silicon --out DIR --jobs 2",
        "points": len(result["rows"]),
        "ttft_mape_held_out": result["ttft_mape_held_out"],
        "tpot_mape_held_out": result["tpot_mape_held_out"],
        "engines": engines,
        "groups": {
            key: {k: group[k] for k in ("points", "ttft_mape_held_out", "tpot_mape_held_out")}
            for key, group in result["groups"].items()
        },
    }
    with atomic_path(to) as tmp:
        tmp.write_text(json.dumps(table, indent=1) + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simlab.validate")
    sub = parser.add_subparsers(dest="command", required=True)
    silicon = sub.add_parser("silicon", help="replay silicon_sample.csv in the timed engine")
    silicon.add_argument("--out", required=True, type=Path, help="writes DIR/validation.json")
    silicon.add_argument(
        "--per-group", type=int, default=None, help="at most N points per model x GPU x engine"
    )
    silicon.add_argument("--jobs", type=int, default=1, help="points simulated at once")
    silicon.add_argument(
        "--overwrite", action="store_true", help="replace another code's results in --out"
    )
    written = sub.add_parser("state", help="write the stated latency errors of a silicon run")
    written.add_argument("out", type=Path, help="the --out DIR of a silicon run")
    written.add_argument("--to", type=Path, default=stated.STATED, help="default: simlab's own")
    args = parser.parse_args(argv)
    if args.command == "state":
        try:
            table = state(args.out, args.to)
        except ConfigError as err:
            print(f"simlab.validate: error: {err}", file=sys.stderr)
            return 2
        print(f"stated errors of {table['points']} points ({table['code_version']}): {args.to}")
        return 0
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1 (got {args.jobs})")
    quiet()
    for name in ("traces.progress", __name__):
        logging.getLogger(name).setLevel(logging.INFO)  # progress now and then, and resumes
    try:
        result = validate(args.out, args.per_group, jobs=args.jobs, overwrite=args.overwrite)
    except ConfigError as err:
        print(f"simlab.validate: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simlab.validate: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    print("\n".join(lines(result)))
    print(f"validation: {args.out / VALIDATION}")
    return 0
