"""Simulation speed per policy and engine on the real traces: ``make bench`` (never a test).

Loads each trace once (tokenized-trace cache), runs it under every standard policy with the
replay and the timed engine, and reports simulated requests per wall-clock second (median of
``--repeat`` runs). Targets on a 2-core machine: replay >= 5,000 req/s for the LRU policies and
>= 1,000 for Marconi on ShareGPT; timed engine >= 1,000 req/s on SWE-bench. Results go to
``bench/results/speed.json``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from simlab.engines.records import write_json_atomic
from simlab.run.simulate import load_trace, plan_run, run_policy

ROOT = Path(__file__).resolve().parents[1]
CASES = {"sharegpt": ["cache.size_gb=2"], "swebench": ["cache.size_gb=60"]}


def bench_trace(
    trace: str, engine: str, overrides: list[str], repeat: int
) -> dict[str, dict[str, float]]:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        # 60 GB of SWE-bench cache exceeds the default A100 40 GB: a what-if, for speed only
        what_if = ["engine.memory_check=false"] if engine == "timed" else []
        cfg = compose(
            config_name="config",
            overrides=[f"trace={trace}", f"engine={engine}", *overrides, *what_if],
        )
    plan = plan_run(cfg)
    settings, model, engine = plan.settings, plan.model, plan.engine
    t0 = time.perf_counter()
    requests = list(load_trace(plan.trace, settings).requests())
    load_s = time.perf_counter() - t0
    out = {}
    for name, spec in plan.policies.items():
        rates = []
        for _ in range(repeat):
            summary = run_policy(spec, requests, model, settings, engine).summary
            rates.append(summary["requests_per_s"])
        out[name] = {
            "requests": len(requests),
            "requests_per_s": statistics.median(rates),
            "token_hit_rate": summary["token_hit_rate"],
            "trace_load_s": load_s,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--traces", nargs="*", default=list(CASES))
    parser.add_argument("--engines", nargs="*", default=["replay", "timed"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = {
        f"{trace}/{engine}": bench_trace(trace, engine, CASES[trace], args.repeat)
        for trace in args.traces
        for engine in args.engines
    }
    for case, rows in results.items():
        for policy, row in rows.items():
            print(
                f"{case:18s} {policy:12s} {row['requests']:6d} req  "
                f"{row['requests_per_s']:10.0f} req/s  hit {row['token_hit_rate']:.4f}"
            )
    write_json_atomic(results, ROOT / "bench" / "results" / "speed.json")


if __name__ == "__main__":
    main()
