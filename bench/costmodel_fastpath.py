"""Differential check of the cost model's fast paths against their plain definitions, bit for bit.

The timed engine times its iterations through memoised and templated paths
(:meth:`simlab.cost.model.CostModel.time` with the per-position-count memo,
:meth:`~simlab.cost.model.CostModel.decode_span_of` with the per-batch-size template). Records
stay byte-identical only if those give exactly the floats of the plain formulas; this harness
compares them on random batches for every model preset, several tensor-parallel degrees and
cost terms, with ``==`` (no tolerance):

* ``time(batch)`` against ``sum(op_time(op) for op in ops(batch))`` on a fresh cost model (no
  memo) and on a warm one (memo hits), and ``ops`` of both against each other; with the
  engine's overlapped loop (``overlap``) against the larger of the engine overhead and the sum
  of the other ops;
* ``decode_span_of(n, sum, steps)`` against the step-by-step affine evaluation of the ops of the
  first two steps (``_decode_span_generic``, the previous ``decode_span``).

Usage::

    python -m bench.costmodel_fastpath [--batches 300] [--seed 0]

It prints one line per configuration and exits 1 on the first mismatch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from simlab import CostModel, Hardware, ModelSpec
from simlab.cost.calibration import Calibration, resolve_calibration
from simlab.cost.shapes import ENGINE_OVERHEAD, BatchShape
from simlab.cost.terms import CostTerms

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

#: an uncalibrated preset (default efficiencies) and a calibrated one (curves per op class)
HARDWARE = ("h200", "h100_sxm", "a100_80gb")

TERMS = {
    "default": CostTerms(),
    "charged": CostTerms(
        iteration_overhead_s=1e-3,
        sequence_overhead_s=1e-5,
        moe_dispatch_s_per_token=1e-8,
        allreduce_latency_s=2e-5,
        mamba1_scan_scale=0.9,
        mamba2_scan_scale=1.1,
        state_load_s=1e-5,
        state_store_s=2e-5,
    ),
}


def load_yaml(path: Path) -> DictConfig:
    cfg = OmegaConf.load(path)
    assert isinstance(cfg, DictConfig), path
    return cfg


def load_hardware(preset: str) -> tuple[Hardware, Calibration | None]:
    """A hardware preset and its default calibration (with token-count curves where fitted)."""
    cfg = load_yaml(CONFIGS / "hardware" / f"{preset}.yaml")
    path = cfg.get("calibration")
    calibration = Calibration.load(resolve_calibration(path), preset) if path else None
    return Hardware.from_config(cfg), calibration


def model_specs() -> dict[str, ModelSpec]:
    """Every model preset of ``configs/model`` (``hf`` is the option the ``model=hf`` presets
    extend, not a model)."""
    return {
        path.stem: ModelSpec.from_config(load_yaml(path))
        for path in sorted((CONFIGS / "model").glob("*.yaml"))
        if path.stem != "hf"
    }


def random_batch(rng: np.random.Generator) -> BatchShape:
    """A mixed, prefill-only or decode-only batch, sometimes with RadixMLP / shared-context /
    SSM copy fields set."""
    kind = rng.integers(3)
    prefill = (
        []
        if kind == 2
        else [
            (int(rng.integers(0, 50_000)), int(rng.integers(1, 8192)))
            for _ in range(rng.integers(1, 5))
        ]
    )
    decode = [] if kind == 1 else [int(c) for c in rng.integers(1, 200_000, rng.integers(1, 300))]
    batch = BatchShape(prefill=prefill, decode=decode)
    if rng.random() < 0.3:
        batch.unique_tokens = max(1, batch.tokens - int(rng.integers(0, batch.tokens)))
    if rng.random() < 0.3 and decode:
        batch.shared_kv_tokens = int(rng.integers(0, sum(decode)))
    if rng.random() < 0.3:
        batch.state_loads, batch.state_stores = int(rng.integers(0, 4)), int(rng.integers(0, 4))
    return batch


#: the cost terms checked and, for each, whether the overlapped loop hides the engine overhead
VARIANTS = (("default", False), ("charged", False), ("charged", True))


def plain_time(cost: CostModel, batch: BatchShape) -> float:
    if not batch.prefill and not batch.decode:
        return 0.0
    ops = cost.ops(batch)
    if not cost.overlap:
        return sum(cost.op_time(op) for op in ops)
    gpu = sum(cost.op_time(op) for op in ops if op.name != ENGINE_OVERHEAD)
    return max(gpu, sum(cost.op_time(op) for op in ops if op.name == ENGINE_OVERHEAD))


def check(make: Callable[[], CostModel], batches: int, rng: np.random.Generator) -> str | None:
    """The first mismatch of the cost models ``make`` builds (None: all equal)."""
    warm = make()
    for i in range(batches):
        batch = random_batch(rng)
        cold = make()
        if cold.ops(batch) != warm.ops(batch):
            return f"batch {i}: ops differ between a fresh and a warm cost model"
        want = plain_time(cold, batch)
        for label, got in (("fresh", make().time(batch)), ("warm", warm.time(batch))):
            if got != want:
                return f"batch {i}: time ({label}) {got!r} != {want!r}"
        n = int(rng.integers(0, 300))
        ctx = [int(c) for c in rng.integers(1, 200_000, n)]
        steps = int(rng.integers(1, 400))
        shared = int(rng.integers(0, sum(ctx))) if ctx and rng.random() < 0.3 else 0
        want_span = warm._decode_span_generic(ctx, steps, shared)
        got_span = warm.decode_span_of(n, sum(ctx), steps, shared)
        if not np.array_equal(got_span, want_span) or got_span.dtype != want_span.dtype:
            return f"batch {i}: decode_span_of differs (n={n}, steps={steps})"
        if not np.array_equal(
            warm.decode_span(np.array(ctx, dtype=np.int64), steps, shared), want_span
        ):
            return f"batch {i}: decode_span differs (n={n}, steps={steps})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    failed = 0
    for preset in HARDWARE:
        hardware, calibration = load_hardware(preset)
        for model_name, spec in model_specs().items():
            for tp in (1, 2, 8):
                for terms_name, overlap in VARIANTS:
                    name = f"{preset} {model_name} tp={tp} costs={terms_name}"
                    name += " overlap" if overlap else ""

                    def make(
                        spec=spec,
                        hw=hardware,
                        cal=calibration,
                        tp=tp,
                        terms=TERMS[terms_name],
                        overlap=overlap,
                    ):
                        return CostModel(spec, hw, cal, tp, terms, overlap)

                    problem = check(make, args.batches, rng)
                    print(f"{name:60s} {'identical' if problem is None else problem}")
                    failed += problem is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
