"""Synthetic records made by the cost model itself (no ``torch``): known efficiencies plus noise.

They test the record format, the fit and the report without a GPU: the fit must recover the
efficiencies used to make them (``python -m gpu_validate synth --out DIR`` then ``fit``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpu_validate.cases import FULL, Scale, plan, spec_dict
from gpu_validate.records import RECORDS_FILE, RecordWriter, record_for
from simlab import CostModel, Hardware, ModelSpec
from simlab.cost.calibration import Calibration, Efficiency

#: "True" efficiencies of the synthetic device: deliberately not the cost model's defaults.
TRUE_EFFICIENCY = {
    "gemm": Efficiency(0.78, 0.88, 6e-6),
    "attn_prefill": Efficiency(0.42, 0.65, 9e-6),
    "attn_decode": Efficiency(0.30, 0.55, 8e-6),
    "ssm_scan": Efficiency(0.12, 0.35, 25e-6),
    "ssm_step": Efficiency(0.20, 0.30, 12e-6),
    "state_copy": Efficiency(1.00, 0.85, 4e-6),
    "elementwise": Efficiency(1.00, 0.70, 5e-6),
}


def _timing(t: float, rng: np.random.Generator, noise: float) -> dict[str, Any]:
    reps = rng.lognormal(0.0, noise / 3, size=15) * t
    return {
        "median_s": float(np.median(reps)),
        "p10_s": float(np.percentile(reps, 10)),
        "p90_s": float(np.percentile(reps, 90)),
        "mean_s": float(np.mean(reps)),
        "n_reps": len(reps),
    }


def synthetic_records(
    spec: ModelSpec,
    hardware: Hardware,
    hardware_preset: str | None,
    true: dict[str, Efficiency] | None = None,
    scale: Scale = FULL,
    suites: Sequence[str] = ("floors", "gemm", "norms", "attn", "ssm", "stack", "flex"),
    noise: float = 0.03,
    outliers: float = 0.03,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """A header and one record per timed case of ``plan(spec, scale, suites)``: time = the cost
    model with efficiencies ``true`` times lognormal noise (sigma ``noise``); a fraction
    ``outliers`` of the op records is 1.5-2.5x slower (what the robust loss must shrug off)."""
    rng = np.random.default_rng(seed)
    truth = dict(Calibration().efficiency)
    truth.update(true or TRUE_EFFICIENCY)
    timer = CostModel(spec, hardware, Calibration(truth, "synthetic"))
    run_id = uuid.UUID(int=int(rng.integers(2**62))).hex[:12]
    out: list[dict[str, Any]] = [
        {
            "kind": "header",
            "schema": 1,
            "run_id": run_id,
            "synthetic": True,
            "device": "synthetic",
            "device_name": f"synthetic:{hardware.name}",
            "hardware_preset": hardware_preset,
            "model": spec_dict(spec),
            "noise": noise,
            "outliers": outliers,
            "seed": seed,
            "true_efficiency": {
                k: {"eta_c": v.eta_c, "eta_m": v.eta_m, "t0": v.t0}
                for k, v in (true or TRUE_EFFICIENCY).items()
            },
        }
    ]
    for case in plan(spec, scale, suites):
        if case.kind in ("check", "component"):
            continue
        t = sum(timer.op_time(op) for op in case.ops)
        t *= float(rng.lognormal(0.0, noise))
        if case.kind == "op" and rng.random() < outliers:
            t *= float(rng.uniform(1.5, 2.5))
        out.append(record_for(case, run_id, "synthetic", "synthetic", _timing(t, rng, noise)))
    return out


def write_synthetic(out_dir: str | Path, records: list[dict[str, Any]]) -> Path:
    path = Path(out_dir) / RECORDS_FILE
    with RecordWriter(path) as writer:
        for rec in records:
            writer.write(rec)
    return path
