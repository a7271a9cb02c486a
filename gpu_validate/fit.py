"""Fit the cost model's per-op-class efficiencies to measured records (CPU only, no ``torch``).

For each op class, with the FLOPs ``F``, bytes ``B`` and launches ``L`` the cost model assigned
to each measured shape (stored in the records) and the hardware preset's peaks::

    t = max(F / (eta_c * peak), B / (eta_m * bw)) + L * t0

``(eta_c, eta_m, t0)`` minimise the relative error ``t_pred / t_measured - 1`` under a soft-L1
loss (robust to a few outliers) with bounds ``0.001 <= eta <= 1.5`` and ``0 <= t0 <= 10 ms``.
A weak prior (weight :data:`PRIOR_WEIGHT` on ``log eta``) pulls an efficiency that no record
constrains (e.g. ``eta_c`` of memory-bound decode attention) to its default instead of letting it
drift; the output says how many records each term binds. Several starts are tried (``max`` makes
the objective piecewise) and the best kept.

The output is the JSON :meth:`simlab.cost.calibration.Calibration.load` reads, plus provenance:
``{"hardware": {...peaks used...}, "ops": {class: {"eta_c", "eta_m", "t0", "n",
"median_rel_err", "p90_rel_err", "binding"}}, "floors": {...}, "residuals": [...]}``.
Classes without records are left out (the cost model keeps their defaults). ``profiles``: the
measured op records of the run's own shapes (one layer's GEMMs, the LM head, a norm + residual)
as per-shape unit times at TP 1 (:mod:`gpu_validate.profiles`), which the cost model uses for ops
of those shapes, with their held-back error (alternate token counts).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from gpu_validate import profiles
from gpu_validate.cases import load_hardware
from gpu_validate.records import headers, read_records, timed
from simlab import Hardware
from simlab.cost.calibration import DEFAULT_EFFICIENCY, Efficiency
from simlab.cost.shapes import OP_CLASSES

log = logging.getLogger(__name__)

FIT_SUITES = ("gemm", "norms", "attn", "ssm")
ETA_BOUNDS = (1e-3, 1.5)
T0_MAX_US = 1e4
PRIOR_WEIGHT = 1e-2
F_SCALE = 0.05  # soft-L1: residuals beyond ~5% count linearly, not quadratically


@dataclass(frozen=True)
class ClassFit:
    """Fitted efficiency of one op class and how well it explains its records."""

    op_class: str
    efficiency: Efficiency
    n: int
    median_rel_err: float
    p90_rel_err: float
    binding: dict[str, int]  # records where compute / memory is the max, and overhead >= half

    def as_json(self) -> dict[str, Any]:
        e = self.efficiency
        curve = {}
        if e.curve:
            knots, scale = zip(*e.curve, strict=True)
            curve = {"curve": {"x": "tokens", "knots": list(knots), "scale": list(scale)}}
        return {
            "eta_c": e.eta_c,
            "eta_m": e.eta_m,
            "t0": e.t0,
            **curve,
            "n": self.n,
            "median_rel_err": self.median_rel_err,
            "p90_rel_err": self.p90_rel_err,
            "binding": self.binding,
        }


def roofline(
    flops: np.ndarray,
    moved: np.ndarray,
    launches: np.ndarray,
    hw: Hardware,
    eff: Efficiency,
    tokens: np.ndarray | None = None,
) -> np.ndarray:
    """Vectorised :meth:`simlab.cost.model.CostModel.op_time` (tests check they agree); the
    class curve applies when ``tokens`` are given."""
    t = (
        np.maximum(flops / (eff.eta_c * hw.peak_flops), moved / (eff.eta_m * hw.mem_bw))
        + launches * eff.t0
    )
    if eff.curve and tokens is not None:
        knots, scale = (np.array(v, dtype=float) for v in zip(*eff.curve, strict=True))
        t = t * np.interp(np.log2(np.maximum(tokens, 1.0)), np.log2(knots), scale)
    return t


#: Knots (tokens) of a fitted token-count curve; knots beyond the records' range are dropped
CURVE_KNOTS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
CURVE_PRIOR = 1e-2  # weak pull of log(scale) toward 0 (no correction) where records are few


def fit_curve(
    records: Sequence[dict], hw: Hardware, eff: Efficiency, knots: Sequence[int] = CURVE_KNOTS
) -> Efficiency:
    """``eff`` with a token-count curve fitted to the records' residual ratios
    ``measured / roofline`` (piecewise linear in log2 tokens, soft-L1 on log ratios): what a
    single efficiency per class cannot express (the roofline's ridge at small token counts,
    kernels whose operands stay in L2). Needs a ``tokens`` field per record."""
    f, b, n, t = _arrays(records)
    tok = np.array([r["tokens"] for r in records], dtype=float)
    top = float(tok.max())
    kept = [k for k in knots if k <= top] or [1]
    if kept[-1] < top:
        kept.append(int(top))
    xs = np.log2(np.array(kept, dtype=float))
    x = np.clip(np.log2(np.maximum(tok, 1.0)), xs[0], xs[-1])
    basis = np.stack([np.interp(x, xs, np.eye(len(xs))[k]) for k in range(len(xs))], axis=1)
    target = np.log(t / roofline(f, b, n, hw, eff))

    def residuals(c: np.ndarray) -> np.ndarray:
        return np.concatenate([basis @ c - target, CURVE_PRIOR * c])

    sol = least_squares(residuals, np.zeros(len(xs)), loss="soft_l1", f_scale=F_SCALE)
    curve = tuple((float(k), float(math.exp(c))) for k, c in zip(kept, sol.x, strict=True))
    return replace(eff, curve=curve)


def _arrays(records: Sequence[dict]) -> tuple[np.ndarray, ...]:
    f = np.array([r["flops"] for r in records], dtype=float)
    b = np.array([r["bytes"] for r in records], dtype=float)
    n = np.array([r["launches"] for r in records], dtype=float)
    t = np.array([r["median_s"] for r in records], dtype=float)
    return f, b, n, t


def fit_class(
    records: Sequence[dict],
    hw: Hardware,
    prior: Efficiency,
    op_class: str = "?",
    curve: bool = False,
) -> ClassFit:
    """Least-squares fit of one class's ``(eta_c, eta_m, t0)`` to its records, then (``curve``)
    its token-count curve (:func:`fit_curve`; records need ``tokens``)."""
    f, b, n, t = _arrays(records)
    if np.any(t <= 0):
        raise ValueError(f"{op_class}: measured times must be > 0")
    log_prior = np.log([prior.eta_c, prior.eta_m])

    def unpack(x: np.ndarray) -> Efficiency:
        return Efficiency(float(math.exp(x[0])), float(math.exp(x[1])), float(x[2]) * 1e-6)

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = (
            np.maximum(f / (math.exp(x[0]) * hw.peak_flops), b / (math.exp(x[1]) * hw.mem_bw))
            + n * x[2] * 1e-6
        )
        return np.concatenate([pred / t - 1.0, PRIOR_WEIGHT * (x[:2] - log_prior)])

    lo = [math.log(ETA_BOUNDS[0])] * 2 + [0.0]
    hi = [math.log(ETA_BOUNDS[1])] * 2 + [T0_MAX_US]
    t0_guess = min(float(np.min(t / np.maximum(n, 1))) * 1e6, T0_MAX_US * 0.99)
    starts = itertools.product(
        (prior.eta_c, 0.05, 0.5), (prior.eta_m, 0.05, 0.5), (prior.t0 * 1e6, 0.5 * t0_guess, 0.0)
    )
    best = None
    for ec, em, t0 in starts:
        x0 = np.clip([math.log(ec), math.log(em), min(t0, T0_MAX_US * 0.99)], lo, hi)
        sol = least_squares(
            residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=F_SCALE, x_scale=[1, 1, 10]
        )
        if best is None or sol.cost < best.cost:
            best = sol
    assert best is not None
    eff = unpack(best.x)
    tokens = None
    if curve:
        eff = fit_curve(records, hw, eff)
        tokens = np.array([r["tokens"] for r in records], dtype=float)
    pred = roofline(f, b, n, hw, eff, tokens)
    err = np.abs(pred / t - 1.0)
    comp = f / (eff.eta_c * hw.peak_flops)
    mem = b / (eff.eta_m * hw.mem_bw)
    over = n * eff.t0
    binding = {
        "compute": int(np.sum(comp > mem)),
        "memory": int(np.sum(mem >= comp)),
        "overhead": int(np.sum(over >= 0.5 * pred)),
    }
    return ClassFit(
        op_class,
        eff,
        len(records),
        float(np.median(err)),
        float(np.percentile(err, 90)),
        binding,
    )


# ---------------------------------------------------------------------------- records -> fit
def select(
    records: Iterable[dict],
    suites: Sequence[str] = FIT_SUITES,
    exclude_ops: Sequence[str] | None = None,
) -> list[dict]:
    """The op records the fit uses. By default the MoE grouped GEMM is left out when the run's
    model has no MoE layers (it measured a stand-in, not an op of that model)."""
    records = list(records)
    if exclude_ops is None:
        exclude_ops = []
        hdr = headers(records)
        if hdr and not hdr[-1].get("model", {}).get("n_moe_layers", 0):
            exclude_ops = ["moe"]
    return [
        r
        for r in timed(records, ("op",))
        if r["suite"] in suites and r["op_name"] not in exclude_ops and r["median_s"] > 0
    ]


def floors(records: Iterable[dict]) -> dict[str, float]:
    """Achieved GEMM TFLOP/s, copy GB/s (read + written) and launch overhead (us)."""
    out: dict[str, float] = {}
    for r in timed(records, ("floor",)):
        if r["op_name"] == "gemm_peak":
            out["gemm_tflops"] = r["flops"] / r["median_s"] / 1e12
        elif r["op_name"] == "copy_bw":
            out["copy_gbps"] = r["bytes"] / r["median_s"] / 1e9
        elif r["op_name"] == "launch_overhead":
            out["launch_us"] = r["median_s"] / r["launches"] * 1e6
    return out


def resolve_hardware(records: Sequence[dict], override: str | None = None) -> tuple[Hardware, str]:
    """Peaks to fit against: ``override`` (a preset name or YAML), else the preset the run's
    header names (from the GPU's name), else the run's own floors (CPU runs)."""
    if override:
        return load_hardware(override), f"preset {override}"
    for hdr in reversed(headers(records)):
        if hdr.get("hardware_preset"):
            name = hdr["hardware_preset"]
            return load_hardware(name), f"preset {name} (from the GPU name)"
    fl = floors(records)
    if "gemm_tflops" in fl and "copy_gbps" in fl:
        device = next((h.get("device_name", "cpu") for h in headers(records)), "cpu")
        hw = Hardware(f"measured:{device}", fl["gemm_tflops"], fl["copy_gbps"], 1.0, 1.0)
        return hw, "measured floors of this run (no hardware preset for this device)"
    raise ValueError("no hardware preset in the records and no floors: pass --hardware NAME")


def hardware_json(hw: Hardware, source: str) -> dict[str, Any]:
    return {
        "name": hw.name,
        "peak_tflops": hw.peak_tflops,
        "mem_bw_gbps": hw.mem_bw_gbps,
        "mem_gb": hw.mem_gb,
        "link_bw_gbps": hw.link_bw_gbps,
        "source": source,
    }


def hardware_from_json(data: dict[str, Any]) -> Hardware:
    return Hardware(
        str(data["name"]),
        float(data["peak_tflops"]),
        float(data["mem_bw_gbps"]),
        float(data.get("mem_gb", 1.0)),
        float(data.get("link_bw_gbps", 1.0)),
    )


def fit_records(records: Sequence[dict], hw: Hardware) -> dict[str, ClassFit]:
    """One :class:`ClassFit` per op class present in ``records`` (already selected)."""
    out = {}
    for cls in OP_CLASSES:
        rows = [r for r in records if r["op_class"] == cls]
        if rows:
            out[cls] = fit_class(rows, hw, DEFAULT_EFFICIENCY[cls], cls)
    return out


def calibration_json(
    records: Sequence[dict],
    hw: Hardware,
    hw_source: str,
    fits: dict[str, ClassFit],
    used: Sequence[dict],
    sources: Sequence[str] = (),
) -> dict[str, Any]:
    hdr = headers(records)
    device = hdr[-1].get("device_name") if hdr else None
    residuals = []
    for r in used:
        eff = fits[r["op_class"]].efficiency
        f, b, n = (np.array([float(r[k])]) for k in ("flops", "bytes", "launches"))
        pred = float(roofline(f, b, n, hw, eff)[0])
        residuals.append(
            {
                "op_class": r["op_class"],
                "op_name": r["op_name"],
                "variant": r.get("variant", ""),
                "params": r["params"],
                "measured_s": r["median_s"],
                "predicted_s": pred,
                "rel_err": pred / r["median_s"] - 1.0,
            }
        )
    return {
        "hardware": hardware_json(hw, hw_source),
        "device": device,
        "ops": {cls: fit.as_json() for cls, fit in fits.items()},
        "unmeasured": {
            cls: "no records in this run: cost-model default"
            for cls in OP_CLASSES
            if cls not in fits
        },
        "floors": floors(records),
        "fit": {
            "model": "t = max(F/(eta_c*peak), B/(eta_m*bw)) + launches*t0",
            "loss": "soft_l1 on relative error",
            "f_scale": F_SCALE,
            "prior_weight": PRIOR_WEIGHT,
            "n_records": len(used),
            "records": [str(s) for s in sources],
            "run_ids": sorted({h.get("run_id", "") for h in hdr}),
        },
        "residuals": residuals,
        "profiles": profiles.section(
            profile_rows(records, used), "this run's op records (medians), one GPU (TP 1)"
        ),
    }


def profile_rows(records: Sequence[dict], used: Sequence[dict]) -> list[dict]:
    """The ``used`` op records of a measured shape (``shape``, ``units`` and ``tokens``, written
    by :func:`gpu_validate.records.record_for`) as :mod:`gpu_validate.profiles` records: one GPU
    (TP 1), the model named by the run's header."""
    model = {h.get("run_id"): (h.get("model") or {}).get("name", "") for h in headers(records)}
    return [r | {"tp": 1, "model": model.get(r.get("run_id"), "")} for r in used if r.get("units")]


def run_fit(
    paths: Sequence[str | Path],
    out: str | Path,
    hardware: str | None = None,
    suites: Sequence[str] = FIT_SUITES,
    exclude_ops: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``python -m gpu_validate fit``: records files -> calibration JSON at ``out``."""
    records = read_records(paths)
    used = select(records, suites, exclude_ops)
    if not used:
        raise ValueError(f"no op records of suites {list(suites)} in {list(map(str, paths))}")
    hw, source = resolve_hardware(records, hardware)
    fits = fit_records(used, hw)
    data = calibration_json(records, hw, source, fits, used, [str(p) for p in paths])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profiles.dumps(data, sort_keys=True) + "\n")
    return data


def format_fit(data: dict[str, Any]) -> str:
    hw = data["hardware"]
    lines = [
        f"hardware {hw['name']}: {hw['peak_tflops']:.4g} TFLOP/s, {hw['mem_bw_gbps']:.4g} GB/s "
        f"({hw['source']})",
        f"{'class':<13}{'n':>4}{'eta_c':>8}{'eta_m':>8}{'t0 us':>9}{'med err':>9}{'p90 err':>9}"
        "  binding (compute/memory/overhead)",
    ]
    for cls, v in data["ops"].items():
        b = v["binding"]
        lines.append(
            f"{cls:<13}{v['n']:>4}{v['eta_c']:>8.3f}{v['eta_m']:>8.3f}{v['t0'] * 1e6:>9.2f}"
            f"{v['median_rel_err']:>9.1%}{v['p90_rel_err']:>9.1%}"
            f"  {b['compute']}/{b['memory']}/{b['overhead']}"
        )
    return "\n".join(lines)
