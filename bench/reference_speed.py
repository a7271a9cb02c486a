"""The Marconi policy beside the Marconi reference code, side by side: requests/s on one trace.

    python -m bench.reference_speed --reference-dir /path/to/marconi \
        [--reference-python python3] [--capacities 1 2 5 10] [--alpha 1] [--repeat 3]

``--reference-dir`` (default ``$MARCONI_REFERENCE_DIR``) holds the reference's
``radix_cache_hybrid.py`` (github ``ruipeterpan/marconi`` or a fork). That code is CC BY-NC and
never copied here: like ``crosscheck/marconi_reference.py``, whose driver this reuses, the bench
only runs it. Without a reference directory the bench says so and exits 0 (``make bench`` runs it).

Both replay the same requests (ShareGPT by default, in simlab's replay order, exported by the
crosscheck) on an empty cache per capacity, with alpha tuning off:

* **the reference**, in a child process under ``--reference-python``: ``RadixCache`` of the
  paper's 7B hybrid, ``evict_policy_version=2`` (FLOP-aware), ``eff_weight=alpha``; per request
  ``match_prefix(input)`` then ``insert(input + output)``. Its loop is timed.
* **simlab**, in this process, ``run_policy`` with the replay engine (the timed part is
  ``engine.run``, the loop; as ``summary.json`` ``wall_s``), twice:

  - ``same hits``: ``+policy=marconi policy.compat=reference_fixed
    +policy.semantics.partial_descent=true``, which gives the reference's hit on every request
    (checked here, request by request: exit status 1 otherwise); the same work, so the fairest
    speed ratio;
  - ``simlab``: ``+policy=marconi`` in simlab's own semantics (the hits differ), request by
    request (``cache.compiled=false``);
  - ``compiled``: the same replay compiled (``cache.compiled=true``, :mod:`simlab.fastpaths.radix.kernel`;
    the same records), when numba is installed. Importing numba, loading the cached kernel and
    making the trace's token pool (shared by every capacity, as by the policies and
    capacities of one ``python -m simlab``) happen once, in an untimed warm-up run before the
    rounds (``compiled_load_s``).

Rounds alternate which side goes first (ABBA), ``--repeat`` of them; each figure is the median
over rounds. Prints requests/s and simlab / reference per capacity, and writes
``bench/results/reference_speed.json`` (atomically).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from crosscheck.marconi_reference import (
    export_requests,
    import_reference,
    replay,
    run_with_deep_stack,
)

ROOT = Path(__file__).resolve().parents[1]
OUT_JSON = ROOT / "bench" / "results" / "reference_speed.json"
REFERENCE_ENV = "MARCONI_REFERENCE_DIR"
#: simlab's two ways of running the Marconi policy (module docstring)
SIMLAB_MODES = {
    "same hits": ["policy.compat=reference_fixed", "+policy.semantics.partial_descent=true"],
    "simlab": ["cache.compiled=false"],
    # the same replay compiled (simlab.fastpaths.radix.kernel; numba, the `fast` extra): skipped without it
    "compiled": ["cache.compiled=true"],
}
#: the reference's FLOP-aware eviction (``evict_policy_version`` 1 is SGLang+'s LRU)
MARCONI_VERSION = 2

log = logging.getLogger("bench.reference_speed")


# ---------------------------------------------------------------------------- child (no simlab)
def child(args: argparse.Namespace) -> None:
    """Replay the exported requests with the reference at each capacity; write seconds and hits."""
    module = import_reference(args.reference_dir)
    folder = Path(args.exports)
    with (folder / f"{args.trace}.jsonl").open() as f:
        requests = [json.loads(line) for line in f]
    results = {}
    for gb in args.capacities:
        start = time.perf_counter()
        hits = replay(module, requests, MARCONI_VERSION, args.alpha, gb * 1e9)
        results[repr(gb)] = {"seconds": time.perf_counter() - start, "hits": hits}
    (folder / "reference.json").write_text(json.dumps(results))


# ---------------------------------------------------------------------------- parent (simlab)
def run_reference(args: argparse.Namespace, exports: Path) -> dict[str, dict[str, Any]]:
    """One round of the reference, in a fresh child process: {gb: {"seconds", "hits"}}."""
    cmd = [args.reference_python, "-m", "bench.reference_speed", "--child"]
    cmd += ["--exports", str(exports), "--trace", args.trace, "--alpha", repr(args.alpha)]
    cmd += ["--reference-dir", str(Path(args.reference_dir).resolve())]
    cmd += ["--capacities", *map(repr, args.capacities)]
    subprocess.run(cmd, check=True, cwd=ROOT)
    result: dict[str, dict[str, Any]] = json.loads((exports / "reference.json").read_text())
    return result


def simlab_runner(trace: str, gb: float, alpha: float, mode: str, shared: dict | None = None):
    """A function running simlab's Marconi replay once: (loop seconds, per-request hits).
    ``shared``: what the runs of one request list share (``run_policy``'s ``walks``: the
    compiled replay's token pool, made by the first run)."""
    from simlab.run.simulate import plan_run, run_policy, trace_requests
    from tests.fixtures import compose

    overrides = [f"trace={trace}", "model=marconi_7b", "engine=replay", "+policy=marconi"]
    overrides += [f"cache.size_gb={gb!r}", f"policy.alpha={alpha!r}", "policy.tuning.enabled=false"]
    cfg = compose([*overrides, *SIMLAB_MODES[mode]])
    plan = plan_run(cfg)
    loaded, requests = trace_requests(plan.trace, plan.settings)
    (spec,) = plan.policies.values()

    def run() -> tuple[float, list[int]]:
        policy_run = run_policy(
            spec, requests, plan.model, plan.settings, plan.engine, loaded.block_size, shared
        )
        records = policy_run.records
        by_id = dict(zip(records["request_id"], records["hit_tokens"], strict=True))
        return float(policy_run.summary["wall_s"]), [int(by_id[r.request_id]) for r in requests]

    return run


def simlab_modes() -> list[str]:
    """The modes of :data:`SIMLAB_MODES` that can run here (``compiled`` needs numba)."""
    from simlab.util.numba_import import available

    return [mode for mode in SIMLAB_MODES if mode != "compiled" or available()]


def warm_up(runners: dict[tuple[str, float], Any]) -> float | None:
    """Run one compiled point untimed (it imports numba, loads the cached kernel and makes the
    token pool, once per process); returns how long that took (None without a compiled
    mode)."""
    compiled = [run for (mode, _gb), run in runners.items() if mode == "compiled"]
    if not compiled:
        return None
    start = time.perf_counter()
    compiled[0]()
    return time.perf_counter() - start


def median_rate(requests: int, seconds: list[float]) -> float:
    return requests / statistics.median(seconds)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Alternating rounds of the reference and simlab; the per-capacity table."""
    with tempfile.TemporaryDirectory(prefix="reference_speed_") as tmp:
        exports = Path(tmp)
        rows = export_requests(exports, {args.trace})[args.trace]
        modes = simlab_modes()
        shared: dict = {}  # the compiled runs' token pool, made in the warm-up
        runners = {
            (mode, gb): simlab_runner(args.trace, gb, args.alpha, mode, shared)
            for gb in args.capacities
            for mode in modes
        }
        load_s = warm_up(runners)
        ref_s: dict[float, list[float]] = {gb: [] for gb in args.capacities}
        sim_s: dict[tuple[str, float], list[float]] = {key: [] for key in runners}
        ref_hits: dict[float, list[int]] = {}
        same: dict[float, bool] = {}
        for round_ in range(args.repeat):
            for side in ("reference", "simlab")[:: 1 if round_ % 2 == 0 else -1]:
                if side == "reference":
                    for key, res in run_reference(args, exports).items():
                        ref_s[float(key)].append(res["seconds"])
                        ref_hits[float(key)] = res["hits"]
                    continue
                for (mode, gb), run in runners.items():
                    seconds, hits = run()
                    sim_s[mode, gb].append(seconds)
                    if mode == "same hits":  # round 0 ran the reference first
                        same[gb] = same.get(gb, True) and hits == ref_hits[gb]
            log.info("round %d of %d done", round_ + 1, args.repeat)
    n = len(rows)
    input_tokens = sum(len(r["input_tokens"]) for r in rows)
    table = []
    for gb in args.capacities:
        ref_rate = median_rate(n, ref_s[gb])
        row: dict[str, Any] = {
            "cache_gb": gb,
            "reference_requests_per_s": ref_rate,
            "reference_token_hit_rate": sum(ref_hits[gb]) / input_tokens,
            "same_hits_every_request": same[gb],
            "reference_runs_s": ref_s[gb],
        }
        for mode in modes:
            rate = median_rate(n, sim_s[mode, gb])
            row[f"simlab_{mode}_requests_per_s"] = rate
            row[f"simlab_{mode}_over_reference"] = rate / ref_rate
            row[f"simlab_{mode}_runs_s"] = sim_s[mode, gb]
        table.append(row)
    return {
        "trace": args.trace,
        "requests": n,
        "alpha": args.alpha,
        "rounds": args.repeat,
        "reference_dir": str(Path(args.reference_dir).resolve()),
        "reference_python": args.reference_python,
        "modes": modes,
        "compiled_load_s": load_s,
        "rows": table,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['trace']}: {result['requests']} requests, alpha {result['alpha']}")
    modes = result["modes"]
    head = f"{'GB':>5} {'reference':>10}" + "".join(f" {m:>10} {'x':>6}" for m in modes)
    print(head + "  hits  (requests/s; x = simlab / reference)")
    for r in result["rows"]:
        cells = "".join(
            f" {r[f'simlab_{m}_requests_per_s']:>10,.0f} {r[f'simlab_{m}_over_reference']:>6.1f}"
            for m in modes
        )
        same = "identical" if r["same_hits_every_request"] else "DIFFER"
        print(f"{r['cache_gb']:>5g} {r['reference_requests_per_s']:>10,.0f}{cells}  {same}")
    if result.get("compiled_load_s") is not None:
        load = result["compiled_load_s"]
        print(f"compiled: numba, the cached kernel and the token pool loaded in {load:.2f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference-dir", default=os.environ.get(REFERENCE_ENV))
    p.add_argument("--reference-python", default=sys.executable)
    p.add_argument("--trace", default="sharegpt", choices=["sharegpt"])
    p.add_argument("--capacities", type=float, nargs="+", default=[1.0, 2.0, 5.0, 10.0])
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=str(OUT_JSON))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--exports", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.child:
        run_with_deep_stack(lambda: child(args))
        return 0
    if not args.reference_dir:
        log.warning("reference speed skipped: no --reference-dir and no $%s", REFERENCE_ENV)
        return 0
    if not (Path(args.reference_dir) / "radix_cache_hybrid.py").is_file():
        raise SystemExit(f"no radix_cache_hybrid.py in {args.reference_dir}")
    from simlab.engines.records import write_json_atomic

    result = measure(args)
    print_table(result)
    write_json_atomic(result, Path(args.out))
    return 0 if all(r["same_hits_every_request"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
