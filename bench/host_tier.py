"""The host-memory tier on the Mooncake trace: a small GPU cache plus a large host tier against
all of it on the GPU (the issue's DynoSim setting: 774 GPU blocks + 8,362 host blocks against
9,136 GPU blocks of 512 tokens, Llama-3-8B, one replica).

    python -m bench.host_tier            # writes bench/results/host_tier.md

Each point is one ``python -m simlab`` run (its own process); the table is read back from its
``summary.json``. vLLM's block cache (``+policy=vllm policy.block_size=512``), the trace at its
timestamps on one H100 (``engine.running_memory_gb=10``, a separate running pool: the host tier
is not supported with ``engine.kv_pool=shared``), host loads over a PCIe link of
:data:`PCIE_GBPS`. Hit rates in replay and in the timed engine; TTFT from the timed engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"

#: bytes of one 512-token block of Llama-3-8B KV (131,072 B per token), in GB
BLOCK_GB = 512 * 131072 / 1e9
GPU_BLOCKS, HOST_BLOCKS = 774, 8362
PCIE_GBPS = 25.0
BASE = [
    "trace=mooncake",
    "model=llama3_8b",
    "+policy=vllm",
    "policy.block_size=512",
    "arrivals.mode=timestamps",
    "hardware=h100_sxm",
    "report=false",
    "bounds.enabled=false",
]


def gb(blocks: int) -> str:
    return f"{blocks * BLOCK_GB:.6f}"


#: (label, overrides)
SETTINGS = [
    (f"GPU {GPU_BLOCKS} blocks", [f"cache.size_gb={gb(GPU_BLOCKS)}"]),
    (
        f"GPU {GPU_BLOCKS} + host {HOST_BLOCKS} blocks, {PCIE_GBPS:g} GB/s",
        [
            f"cache.size_gb={gb(GPU_BLOCKS)}",
            f"cache.host_gb={gb(HOST_BLOCKS)}",
            f"cache.host_bw_gbps={PCIE_GBPS}",
        ],
    ),
    (
        f"GPU {GPU_BLOCKS} + host {HOST_BLOCKS} blocks, free loads",
        [
            f"cache.size_gb={gb(GPU_BLOCKS)}",
            f"cache.host_gb={gb(HOST_BLOCKS)}",
            "cache.host_bw_gbps=inf",
        ],
    ),
    (f"GPU {GPU_BLOCKS + HOST_BLOCKS} blocks", [f"cache.size_gb={gb(GPU_BLOCKS + HOST_BLOCKS)}"]),
]
TIMED = [
    "engine.running_memory_gb=10",
    "engine.memory_check=false",  # 9,136 blocks (613 GB) on one GPU is a what-if
]
ENGINES = {
    "replay": ["engine=replay"],
    "timed": TIMED,
    "timed, time_scale=4": [*TIMED, "arrivals.time_scale=4"],
}


def run_point(out: Path, overrides: list[str]) -> dict:
    """One simlab run; its policy's summary."""
    cmd = [sys.executable, "-m", "simlab", *BASE, *overrides, f"output_dir={out}"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    summary = json.loads((out / "summary.json").read_text())
    return summary["policies"]["vllm"]


def command(overrides: list[str]) -> str:
    return "python -m simlab " + " ".join([*BASE, *overrides])


def table() -> list[str]:
    lines = [
        "| engine | cache | token hit | GPU part | host part | TTFT P50 / P95 s | saturated |",
        "|---|---|---|---|---|---|---|",
    ]
    commands = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (engine, extra) in enumerate(ENGINES.items()):
            for j, (label, overrides) in enumerate(SETTINGS):
                s = run_point(Path(tmp) / f"{i}_{j}", [*extra, *overrides])
                commands.append(command([*extra, *overrides]))
                host = s.get("host_token_hit_rate")
                gpu = s.get("gpu_token_hit_rate", s["token_hit_rate"])
                ttft = f"{s['ttft_p50']:.3g} / {s['ttft_p95']:.3g}" if "ttft_p50" in s else "-"
                lines.append(
                    f"| {engine} | {label} | {s['token_hit_rate']:.4f} | {gpu:.4f} | "
                    f"{'-' if host is None else f'{host:.4f}'} | {ttft} | "
                    f"{s.get('saturated', '-')} |"
                )
    return [*lines, "", "Commands:", "", "```", *commands, "```"]


def main() -> int:
    lines = [
        "# Host-memory tier on the Mooncake trace (`python -m bench.host_tier`)",
        "",
        f"One replica, Llama-3-8B, vLLM's block cache (512-token blocks of {BLOCK_GB:.4f} GB), "
        "the trace at its timestamps on one H100. DynoSim's figures for the 12k-request "
        "conversation trace: 774 GPU + 8,362 host blocks 19.4%, 9,136 GPU blocks 20.1%.",
        "",
        *table(),
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "host_tier.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
