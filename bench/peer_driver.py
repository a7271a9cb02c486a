"""Runs one peer simulator inside its throwaway environment and prints one JSON line.

Started by :mod:`bench.peers` with the peer's own interpreter (``.bench-peers/<env>/bin/python
bench/peer_driver.py ...``), so it imports only the standard library and the peer, never simlab.

``kvsim``: kvcache-simulator's ``run`` command, step for step (``kvcache_sim.cli``: load the
model catalog, parse the trace, ``run_sweep``, render the JSON), with the time of the parse and
of ``run_sweep`` (the simulation: the prefix trie, every policy and budget; with the C++
backend also writing the binary trace and the native process) measured separately.

``dynosim``: DynoSim, ai-dynamo-runtime's offline mocker replay
(``dynamo._core.run_mocker_trace_replay``, the native call behind ``dynamo.replay``), a
vLLM-style engine with ``--blocks`` KV blocks of ``--block-size`` tokens; ``--mode sequential``
replays one request at a time (``replay_concurrency=1``), ``--mode timed`` on the trace's
timestamps. ``--workers N --router round_robin|kv_router`` puts N such workers behind
Dynamo's router (``kv_router``: its KV-aware cost, prefix overlap against load). Reports the
replay's own ``wall_time_ms`` (Rust runtime construction and execution), TTFT P50/P95 and the
hit tokens (``reused_input_tokens``) per request, summed over all requests and over the last
half (the requests in completion order).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def run_kvsim(args: argparse.Namespace) -> dict[str, Any]:
    from kvcache_sim.calculator import load_models_data
    from kvcache_sim.simulator import run_sweep
    from kvcache_sim.trace import parse_trace_file

    t0 = time.perf_counter()
    data = load_models_data(None)
    trace = parse_trace_file(args.trace, block_size=args.block_size)
    t1 = time.perf_counter()
    result = run_sweep(
        trace,
        model_id=args.model,
        precision=args.kv_precision,
        budgets_gib=[float(v) for v in args.budgets_gib.split(",")],
        policies=args.policies.split(","),
        backend=args.backend,
        models_data=data,
    )
    t2 = time.perf_counter()
    return {"load_s": t1 - t0, "sim_s": t2 - t1, "result": result}


def run_dynosim(args: argparse.Namespace) -> dict[str, Any]:
    from dynamo._core import run_mocker_trace_replay

    engine = {"block_size": args.block_size, "num_gpu_blocks": args.blocks}
    extra: dict[str, Any] = {"replay_concurrency": 1} if args.mode == "sequential" else {}
    if args.workers > 1:  # replicas behind Dynamo's router (round_robin or kv_router)
        extra |= {"num_workers": args.workers, "router_mode": args.router}
    t0 = time.perf_counter()
    native = run_mocker_trace_replay(
        [args.trace],
        extra_engine_args={"engine": engine, "num_gpu_blocks_is_explicit": True},
        replay_mode="offline",
        trace_format="mooncake",
        trace_block_size=args.block_size,
        capture_per_request=True,
        **extra,
    )
    call_s = time.perf_counter() - t0
    summary = dict(native.summary)
    rows = sorted(native.per_request or [], key=lambda row: row["arrival_time_ms"])
    half = len(rows) // 2
    return {
        "call_s": call_s,
        "sim_s": summary["wall_time_ms"] / 1000.0,
        "requests": len(rows),
        "warmup_requests": half,
        "hit_tokens": sum(row["reused_input_tokens"] for row in rows),
        "input_tokens": sum(row["input_length"] for row in rows),
        "hit_tokens_last_half": sum(row["reused_input_tokens"] for row in rows[half:]),
        "input_tokens_last_half": sum(row["input_length"] for row in rows[half:]),
        "prefix_cache_reused_ratio": summary.get("prefix_cache_reused_ratio"),
        "duration_ms": summary.get("duration_ms"),
        "ttft_p50_ms": summary.get("median_ttft_ms"),
        "ttft_p95_ms": summary.get("p95_ttft_ms"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="peer", required=True)
    kvsim = sub.add_parser("kvsim")
    kvsim.add_argument("--trace", required=True)
    kvsim.add_argument("--block-size", type=int, required=True)
    kvsim.add_argument("--model", required=True)
    kvsim.add_argument("--kv-precision", required=True)
    kvsim.add_argument("--budgets-gib", required=True)
    kvsim.add_argument("--policies", required=True)
    kvsim.add_argument("--backend", choices=["cpp", "python"], required=True)
    dyn = sub.add_parser("dynosim")
    dyn.add_argument("--trace", required=True)
    dyn.add_argument("--block-size", type=int, required=True)
    dyn.add_argument("--blocks", type=int, required=True)
    dyn.add_argument("--mode", choices=["sequential", "timed"], required=True)
    dyn.add_argument("--workers", type=int, default=1)
    dyn.add_argument("--router", choices=["round_robin", "kv_router"], default="round_robin")
    args = parser.parse_args(argv)
    out = run_kvsim(args) if args.peer == "kvsim" else run_dynosim(args)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
