"""Replicas and routing: the figures of the README's "Replicas and routing" section.

    python -m bench.routing swebench   # hybrid_aware vs prefix_aware (and baselines), 4 replicas
    python -m bench.routing mooncake   # round_robin vs prefix_aware at 4 and 8 replicas
    python -m bench.routing speed      # wall time of 8 replicas vs 1 on the same requests
    python -m bench.routing dynamo     # side by side with DynoSim: 4 and 8 replicas, RR vs KV

Each point is one ``python -m simlab`` run (its own process, as a user would run it); the table
is read back from the points' ``summary.json`` and written to ``bench/results/routing_<name>.md``.

``dynamo`` runs DynoSim (ai-dynamo-runtime's offline mocker replay, installed by
:mod:`bench.peers` into ``.bench-peers/``; skipped with a message when it cannot be) and simlab on
the same Mooncake-format trace at its timestamps with the same settings: per replica one KV pool
of :data:`DYNAMO_BLOCKS` 512-token blocks shared by running and cached sequences (DynoSim's
``num_gpu_blocks``; simlab ``engine.kv_pool=shared engine.running_memory_gb=0`` with
``cache.size_gb`` holding exactly that many blocks), vLLM's block cache (simlab ``+policy=vllm
policy.block_size=512``), round robin against the KV-aware router (DynoSim ``kv_router``: cost
``prefill_blocks + decode_blocks`` at its default overlap weight 1; simlab ``prefix_aware`` at
``load_weight=1``, the same cost in tokens). The timing models differ (DynoSim's own fitted
engine model; simlab's roofline on ``hardware=h100_sxm`` with its calibration), so the TTFTs are
reported side by side, not required to agree; the acceptance is the hit-rate direction and size:
prefix-aware at least 1.5x round robin at 8 replicas in both.
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


#: DynoSim's num_gpu_blocks per replica: 52 GB of Llama-3-8B KV in 512-token (64 MiB) blocks
DYNAMO_BLOCKS = 774
#: simlab router -> DynoSim router_mode
DYNAMO_ROUTERS = {"round_robin": "round_robin", "prefix_aware": "kv_router"}
DYNAMO_HEADER = (
    "| replicas | router | simlab token hit | DynoSim token hit | simlab TTFT P50 / P95 s | "
    "DynoSim TTFT P50 / P95 s | simlab process s | DynoSim process s |\n"
    "|---|---|---|---|---|---|---|---|"
)


def dynosim_point(python: Path, trace: Path, replicas: int, router: str) -> dict:
    """One DynoSim run in its own environment (``bench/peer_driver.py dynosim``) and its
    process wall time."""
    from bench.peers import BLOCK_TOKENS, DRIVER, last_line_json, timed

    cmd = [
        str(python),
        str(DRIVER),
        "dynosim",
        f"--trace={trace}",
        f"--block-size={BLOCK_TOKENS}",
        f"--blocks={DYNAMO_BLOCKS}",
        "--mode=timed",
        f"--workers={replicas}",
        f"--router={DYNAMO_ROUTERS[router]}",
    ]
    elapsed, stdout = timed(cmd)
    return last_line_json(stdout) | {"process_s": elapsed}


def simlab_dynamo_point(trace: Path, replicas: int, router: str) -> dict:
    """The simlab run matching :func:`dynosim_point` and its process wall time."""
    import time

    from bench.peers import BLOCK_TOKENS, blocks_to_size_gb

    overrides = [
        "trace=mooncake",
        f"trace.path={trace}",
        "model=llama3_8b",
        "arrivals.mode=timestamps",
        "hardware=h100_sxm",
        "+policy=vllm",
        f"policy.block_size={BLOCK_TOKENS}",
        "engine.kv_pool=shared",
        "engine.running_memory_gb=0",
        f"cache.size_gb={blocks_to_size_gb(DYNAMO_BLOCKS)!r}",
        f"cluster.replicas={replicas}",
        f"cluster.router={router}",
        "cluster.load_weight=1.0",
        "report=false",
        "bounds.enabled=false",
    ]
    start = time.perf_counter()
    summary = run_point(f"dyn_{replicas}_{router}", overrides)["vllm"]
    return summary | {"process_s": time.perf_counter() - start}


def dynamo() -> list[str]:
    """simlab beside DynoSim (module docstring); [] with a message when DynoSim is missing."""
    from bench.peers import CACHE_DIR, default_trace, install_peers

    trace = default_trace()
    if trace is None or not trace.is_file():
        print(f"bench.routing: skipped, no Mooncake-format trace at {trace}")
        return []
    peers, _ = install_peers(CACHE_DIR, ["dynamo"])
    if "dynamo" not in peers:
        return []
    rows = []
    for replicas in (4, 8):
        for router in DYNAMO_ROUTERS:
            ours = simlab_dynamo_point(trace, replicas, router)
            theirs = dynosim_point(peers["dynamo"], trace, replicas, router)
            rows.append(
                f"| {replicas} | {router} | {ours['token_hit_rate']:.4f} | "
                f"{theirs['hit_tokens'] / theirs['input_tokens']:.4f} | "
                f"{ours['ttft_p50']:.3f} / {ours['ttft_p95']:.3f} | "
                f"{theirs['ttft_p50_ms'] / 1e3:.3f} / {theirs['ttft_p95_ms'] / 1e3:.3f} | "
                f"{ours['process_s']:.2f} | {theirs['process_s']:.2f} |"
            )
    return rows


TABLES = {
    "swebench": (swebench, HEADER),
    "mooncake": (mooncake, HEADER),
    "speed": (speed, HEADER),
    "dynamo": (dynamo, DYNAMO_HEADER),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=tuple(TABLES))
    args = parser.parse_args(argv)
    make_rows, header = TABLES[args.what]
    rows = make_rows()
    if not rows:
        return 0
    table = "\n".join([header, *rows]) + "\n"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"routing_{args.what}.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
