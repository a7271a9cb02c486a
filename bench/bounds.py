"""Each policy's token hit rate beside the bounds (clairvoyant, infinite cache) on real traces.

``python -m bench.bounds [--cases sharegpt:1 sharegpt:5 swebench:40 swebench:80]``: one trace
load per trace, every policy replayed at each cache size (GB) with the default model
(marconi_7b); prints hit rate, fraction of the clairvoyant bound and replay seconds, and writes
``bench/results/bounds.json``. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from hydra import compose, initialize_config_dir

from simlab import ModelSpec
from simlab.config import run_settings
from simlab.engines.records import write_json_atomic
from simlab.engines.replay import ReplayEngine
from simlab.run.bounds import infinite_cache_hits
from simlab.run.plan import policy_spec, trace_spec
from simlab.run.simulate import load_trace, run_policy

ROOT = Path(__file__).resolve().parents[1]
POLICIES = [
    "vllm_plus",
    "sglang_plus",
    "sglang_hybrid",
    "marconi",
    "lfu",
    "gdsf",
    "marconi_plus",
    "clairvoyant",
]
CASES = ["sharegpt:1", "sharegpt:5", "swebench:40", "swebench:80"]


def _cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def bench_case(trace: str, size_gb: float, requests: list, extra: list[str]) -> dict:
    rows = {}
    for name in POLICIES:
        cfg = _cfg([f"trace={trace}", f"cache.size_gb={size_gb}", f"+policy={name}", *extra])
        settings = run_settings(cfg)
        model = ModelSpec.from_config(cfg.model)
        run = run_policy(policy_spec(name, cfg.policy), requests, model, settings, ReplayEngine())
        summary = run.summary
        rows[name] = {"token_hit_rate": summary["token_hit_rate"], "wall_s": summary["wall_s"]}
    bound = rows["clairvoyant"]["token_hit_rate"]
    for row in rows.values():
        row["of_clairvoyant"] = row["token_hit_rate"] / bound if bound else float("nan")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", nargs="*", default=CASES)
    parser.add_argument("--overrides", nargs="*", default=[])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict[str, dict] = {}
    loaded: dict[str, list] = {}
    for case in args.cases:
        trace, size = case.split(":")
        if trace not in loaded:
            cfg = _cfg([f"trace={trace}", *args.overrides])
            loaded[trace] = list(load_trace(trace_spec(cfg), run_settings(cfg)).requests())
        requests = loaded[trace]
        rows = bench_case(trace, float(size), requests, args.overrides)
        total = sum(r.input_len for r in requests)
        rows["infinite"] = {"token_hit_rate": sum(infinite_cache_hits(requests)) / total}
        results[case] = rows
        for name, row in rows.items():
            print(
                f"{case:12s} {name:14s} hit {row['token_hit_rate']:.4f}  "
                f"of clairvoyant {row.get('of_clairvoyant', float('nan')):6.3f}  "
                f"{row.get('wall_s', float('nan')):7.2f} s"
            )
    write_json_atomic(results, ROOT / "bench" / "results" / "bounds.json")


if __name__ == "__main__":
    main()
