"""What a compiled kernel costs a fresh process before its work: numba's import and the kernel's
first call (its cached machine code loaded), with and without numba's BLAS probe.

The kernels import numba through :func:`simlab.util.numba_import.import_numba`, which skips the probe
(an import of ``scipy.linalg.cython_blas``, loading all of ``scipy.linalg``). "with the probe"
imports ``scipy.linalg.cython_blas`` inside the timed window, which is the probe's work. Each round
starts one fresh interpreter per kernel and mode, alternating. The inputs (60 ShareGPT requests:
16-token blocks of Llama-3-8B under FIFO for the block kernel, vLLM+ on the default hybrid for the
radix kernel) are made before the clock starts, so the time is the load plus a few milliseconds of
work. A first round, which compiles a kernel whose source changed (6-15 s), is not counted.

Usage::

    python -m bench.numba_load [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("block", "radix")
MODES = ("skipped", "with the probe")

CHILD = """
import json, sys, time
from hydra import compose, initialize_config_dir
from simlab.fastpaths.blocks import kernel as block_kernel
from simlab.fastpaths.blocks import replay as block_replay
from simlab.fastpaths.radix import kernel as radix_kernel
from simlab.fastpaths.radix import replay as radix_replay
from simlab.fastpaths.blocks.walk import block_paths
from simlab.run.simulate import plan_run, policy_step, trace_requests

kernel, probe = sys.argv[1], sys.argv[2] == "with the probe"
policy = ["+policy=vllm", "eviction@policy.eviction=fifo", "policy.block_size=16"]
overrides = ["trace=sharegpt", "trace.limit=60"]
overrides += ["model=llama3_8b", *policy] if kernel == "block" else ["+policy=vllm_plus"]
with initialize_config_dir(config_dir=sys.argv[3], version_base="1.3"):
    cfg = compose("config", overrides=overrides)
plan = plan_run(cfg)
_, requests = trace_requests(plan.trace, plan.settings)
(spec,) = plan.policies.values()
step = policy_step(spec, plan.model, plan.settings, requests[0].block_size)
if kernel == "block":
    flat = block_kernel.FlatPaths(block_paths(requests, block_replay.step_keys(step)), None)
assert "numba" not in sys.modules
start = time.perf_counter()
if probe:
    import scipy.linalg.cython_blas
if kernel == "block":
    block_kernel.compiled_heap_replay(flat, 1e12, step.cache.kv_per_token, 0)
else:
    radix_replay.compiled_replay(requests, step, None)
print(json.dumps({"s": time.perf_counter() - start, "linalg": "scipy.linalg" in sys.modules}))
"""


def load_seconds(kernel: str, mode: str) -> tuple[float, bool]:
    """One fresh interpreter's load of ``kernel`` in ``mode``: (seconds, scipy.linalg loaded)."""
    cmd = [sys.executable, "-c", CHILD, kernel, mode, str(ROOT / "configs")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return float(out["s"]), bool(out["linalg"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="counted rounds (median)")
    args = parser.parse_args(argv)
    times: dict[tuple[str, str], list[float]] = {(k, m): [] for k in KERNELS for m in MODES}
    for kernel in KERNELS:  # an uncounted round: compiles a kernel whose source changed
        load_seconds(kernel, MODES[0])
    for _ in range(args.repeat):
        for kernel in KERNELS:
            for mode in MODES:
                seconds, linalg = load_seconds(kernel, mode)
                if linalg != (mode != MODES[0]):
                    raise SystemExit(f"bench.numba_load: scipy.linalg loaded={linalg} in {mode}")
                times[kernel, mode].append(seconds)
    print(f"{'kernel':8s} {'BLAS probe':16s} {'median s':>9s}  runs")
    for (kernel, mode), runs in times.items():
        shown = " ".join(f"{s:.3f}" for s in runs)
        print(f"{kernel:8s} {mode:16s} {statistics.median(runs):9.3f}  {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
