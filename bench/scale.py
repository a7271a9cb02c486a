"""Production size: time and peak memory of replay and timed runs at 100K and 1M requests
(``make bench``; never a test).

The trace is the real Mooncake-format trace (``<data_dir>/mooncake/synthetic_trace.jsonl``,
3,993 requests) tiled end to end: tile ``k`` shifts every hash id by ``k`` times the trace's
largest id plus one (so tiles share no block) and every timestamp by ``k`` times its span, which
keeps each tile's sharing and arrival pattern. Each (engine, size) runs ``python -m simlab`` in
a fresh process; its wall time and peak resident memory (``wait4``'s ``ru_maxrss``) are
recorded. The slope check compares the per-request time and memory of the largest size with the
smallest's: a linear simulator keeps both ratios near 1 (a super-linear term shows as a ratio
growing with the size). Results go to ``bench/results/scale.json``.

    python -m bench.scale                          # 100K and 1M, replay and timed
    python -m bench.scale --sizes 20000 100000 --engines replay
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from simlab.engines.records import write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path("mooncake") / "synthetic_trace.jsonl"
#: what each run simulates (a Transformer on SGLang's radix cache, an H100's worth of cache)
RUN = ["+policy=sglang", "model=llama3_8b", "cache.size_gb=40", "hardware=h100_sxm", "report=false"]
ENGINE_ARGS = {
    "replay": ["engine=replay"],
    # the trace at an eighth of its rate: one H100 keeps up (at its own rate a cluster trace
    # saturates one GPU, and the backlog, not the simulator, would set the memory)
    "timed": ["engine=timed", "arrivals.mode=timestamps", "arrivals.time_scale=8"],
}

log = logging.getLogger("bench.scale")


def data_dir() -> Path:
    env = os.environ.get("SIMLAB_DATA_DIR")
    return Path(env) if env else ROOT.parent / "shared" / "data"


def tiled_trace(n: int, out: Path) -> Path:
    """``n`` requests of the Mooncake trace tiled end to end (module docstring), written once."""
    path = out / f"mooncake_tiled_{n}.jsonl"
    if path.exists():
        return path
    source = data_dir() / SOURCE
    if not source.exists():
        raise SystemExit(f"bench.scale: {source} is missing (see ../shared/data/README.md)")
    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    span = max(r["timestamp"] for r in rows) + 1000
    shift = max(max(r["hash_ids"]) for r in rows) + 1
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for i in range(n):
            tile, r = divmod(i, len(rows))
            row = rows[r]
            f.write(
                json.dumps(
                    {
                        "timestamp": row["timestamp"] + tile * span,
                        "input_length": row["input_length"],
                        "output_length": row["output_length"],
                        "hash_ids": [h + tile * shift for h in row["hash_ids"]],
                    }
                )
                + "\n"
            )
    tmp.replace(path)
    return path


def measure(trace: Path, engine: str, out: Path) -> dict[str, Any]:
    """One ``python -m simlab`` run in a fresh process: wall seconds and peak RSS (GB)."""
    run_dir = out / f"run_{engine}_{trace.stem}"
    args = [sys.executable, "-m", "simlab", "trace=mooncake", f"trace.path={trace}"]
    args += [*RUN, *ENGINE_ARGS[engine], f"output_dir={run_dir}", "overwrite=true"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"bench.scale: {' '.join(args)} failed (status {status})")
    summary = json.loads((run_dir / "summary.json").read_text())
    requests = summary["trace"]["requests"]
    return {
        "engine": engine,
        "requests": requests,
        "wall_s": wall,
        "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,  # Linux: kilobytes
        "requests_per_s": requests / wall,
        "token_hit_rate": summary["policies"]["sglang"]["token_hit_rate"],
    }


def slopes(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per engine: per-request time and memory at the largest size over the smallest's."""
    out = {}
    for engine in dict.fromkeys(r["engine"] for r in rows):
        mine = sorted((r for r in rows if r["engine"] == engine), key=lambda r: r["requests"])
        if len(mine) < 2:
            continue
        small, large = mine[0], mine[-1]
        out[engine] = {
            "size_ratio": large["requests"] / small["requests"],
            "time_per_request_ratio": (large["wall_s"] / large["requests"])
            / (small["wall_s"] / small["requests"]),
            "memory_per_request_ratio": (large["peak_rss_gb"] / large["requests"])
            / (small["peak_rss_gb"] / small["requests"]),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--engines", nargs="+", default=list(ENGINE_ARGS), choices=ENGINE_ARGS)
    parser.add_argument("--work", type=Path, default=Path("/tmp/simlab-bench-scale"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scale.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.sizes:
        trace = tiled_trace(n, args.work)
        for engine in args.engines:
            row = measure(trace, engine, args.work)
            log.info(
                "%-6s %9d requests: %8.1f s, %6.2f GB peak, %7.0f req/s",
                engine,
                row["requests"],
                row["wall_s"],
                row["peak_rss_gb"],
                row["requests_per_s"],
            )
            rows.append(row)
    result = {"rows": rows, "slopes": slopes(rows), "run": RUN}
    for engine, s in result["slopes"].items():
        log.info(
            "%s: x%.0f requests -> per-request time x%.2f, per-request memory x%.2f",
            engine,
            s["size_ratio"],
            s["time_per_request_ratio"],
            s["memory_per_request_ratio"],
        )
    write_json_atomic(result, args.out)


if __name__ == "__main__":
    main()
