"""Replicas and routing: the figures of the README's "Replicas and routing" section.

    python -m bench.routing swebench   # hybrid_aware vs prefix_aware (and baselines), 4 replicas
    python -m bench.routing mooncake   # round_robin vs prefix_aware at 4 and 8 replicas
    python -m bench.routing speed      # wall time of 8 replicas vs 1 on the same requests

Each point is one ``python -m simlab`` run (its own process, as a user would run it); the table
is read back from the points' ``summary.json`` and written to ``bench/results/routing_<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"

SWEBENCH = [
    "trace=swebench",
    "trace.limit=40",
    "model=nemotron_h_8b",
    "hardware=h200",
    "cache.size_gb=20",
    "arrivals.session_rate=2.0",
]
MOONCAKE = [
    "trace=mooncake",
    "model=llama3_8b",
    "arrivals.mode=timestamps",
    "hardware=h100_sxm",
    "engine.running_memory_gb=10",
    "cache.size_gb=52",
]
COMMON = ["report=false", "bounds.enabled=false", "engine.calibration=null"]


def run_point(name: str, overrides: list[str]) -> dict:
    """One simlab run; its summary.json policies."""
    out = OUT / "routing_runs" / name
    cmd = [
        sys.executable,
        "-m",
        "simlab",
        *COMMON,
        *overrides,
        f"output_dir={out}",
        "overwrite=true",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads((out / "summary.json").read_text())["policies"]


def row(label: str, policy: str, s: dict) -> str:
    per = s.get("replica_token_hit_rate")
    spread = f"{min(per):.3f}-{max(per):.3f}" if per else "-"
    return (
        f"| {label} | {policy} | {s['token_hit_rate']:.4f} | {s['ttft_p50']:.3f} | "
        f"{s['ttft_p95']:.3f} | {s.get('routing_regret_rate', 0):.4f} | "
        f"{s.get('load_imbalance', 1):.2f} | {spread} | {s['gpu_busy_frac']:.2f} | "
        f"{s['wall_s']:.2f} |"
    )


HEADER = (
    "| point | policy | token hit | TTFT P50 s | TTFT P95 s | regret | imbalance | "
    "replica hit rates | GPU busy | wall s |\n|---|---|---|---|---|---|---|---|---|---|"
)


#: (label, policy, overrides): one shared KV + state budget, then SGLang's separate Mamba pool
#: at its default ratio (0.9 / 1.9 of the memory) and small (states evicted, KV kept)
SWEBENCH_CACHES = [
    ("shared 20 GB", "sglang_plus", []),
    ("SGLang pools 20 GB, Mamba 9.47 GB", "sglang", ["cache.ssm_gb=9.47"]),
    ("SGLang pools 20 GB, Mamba 1 GB", "sglang", ["cache.ssm_gb=1"]),
]


SWEBENCH_ROUTERS = [
    ("round_robin", 1.0),
    ("session_affinity", 1.0),
    ("prefix_aware", 1.0),
    ("hybrid_aware", 1.0),
    ("prefix_aware", 0.1),
    ("hybrid_aware", 0.1),
]


def swebench() -> list[str]:
    rows: list[str] = []
    for label, policy, cache in SWEBENCH_CACHES:
        for router, weight in SWEBENCH_ROUTERS:
            name = f"swe_{policy}_{len(rows)}_{router}"
            extra = [f"+policy={policy}", *cache, "cluster.replicas=4", f"cluster.router={router}"]
            s = run_point(name, [*SWEBENCH, *extra, f"cluster.load_weight={weight}"])[policy]
            tag = f" w={weight:g}" if router.endswith("_aware") else ""
            rows.append(row(f"{label}: 4 x {router}{tag}", policy, s))
    return rows


def mooncake() -> list[str]:
    rows: list[str] = []
    s = run_point("mc_1", [*MOONCAKE, "+policy=sglang_plus"])["sglang_plus"]
    rows.append(row("1 replica", "sglang_plus", s))
    for n in (4, 8):
        for router in ("round_robin", "prefix_aware"):
            extra = ["+policy=sglang_plus", f"cluster.replicas={n}", f"cluster.router={router}"]
            s = run_point(f"mc_{n}_{router}", MOONCAKE + extra)["sglang_plus"]
            rows.append(row(f"{n} x {router}", "sglang_plus", s))
    return rows


def speed(repeats: int = 3) -> list[str]:
    """Each point ``repeats`` times; the row shows the fastest (the machine is shared)."""
    rows: list[str] = []
    for trace, base in (("mooncake", MOONCAKE), ("swebench", SWEBENCH)):
        for n, router in ((1, "round_robin"), (8, "round_robin"), (8, "prefix_aware")):
            extra = ["+policy=sglang_plus", f"cluster.replicas={n}", f"cluster.router={router}"]
            runs = [
                run_point(f"speed_{trace}_{n}_{router}", base + extra)["sglang_plus"]
                for _ in range(repeats)
            ]
            fastest = min(runs, key=lambda s: s["wall_s"])
            rows.append(row(f"{trace}: {n} x {router}", "sglang_plus", fastest))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("swebench", "mooncake", "speed"))
    args = parser.parse_args(argv)
    rows = {"swebench": swebench, "mooncake": mooncake, "speed": speed}[args.what]()
    table = "\n".join([HEADER, *rows]) + "\n"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"routing_{args.what}.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
