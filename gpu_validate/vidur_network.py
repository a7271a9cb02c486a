"""NCCL all-reduce from Vidur's measured times, without a GPU (part of ``gpu_validate.vidur``).

Vidur (github microsoft/vidur, MIT) timed ``torch.distributed.all_reduce`` of an fp16 buffer of
``size`` elements (``<data_dir>/vidur_profiling/network/<topology>/all_reduce.csv``, medians in
ms) against the number of workers. Tensor parallelism runs inside one node, so only rows with
``num_workers == devices_per_node`` are used. Per tensor-parallel degree the cost model's
all-reduce is fitted as

    t = t0(tp) + 2 (tp-1)/tp * message_bytes / (eta_m(tp) * link_bw)

``t0``: the small-message latency per call; ``eta_m``: achieved fraction of the preset's link
bandwidth over the ring's bytes (above 1 where NCCL does better than the ring). Alternate
message sizes (sorted, per degree) are fitted and the others held back; the fit is also checked
on the other topology of the same GPU (pairwise NVLink instead of an NVSwitch node), which it
was not fitted on. Invariant: a degree absent from the data gets the joint fit over all degrees.
The rows themselves also become the calibration's measured all-reduce (:func:`profile_records`,
``profiles`` of :mod:`gpu_validate.vidur`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simlab import Hardware
from simlab.cost.calibration import ETA_MAX, Efficiency
from simlab.cost.profiles import ALLREDUCE
from traces.paths import resolve_data_dir

ELEMENT_BYTES = 2  # Vidur's ``size`` counts fp16 elements
#: Vidur GPU folder -> topology fitted (an NVSwitch node: DGX / HGX, AWS p4d / p5) and the one checked
TOPOLOGY = {
    "a100": ("a100_dgx", "a100_pairwise_nvlink"),
    "h100": ("h100_dgx", "h100_pairwise_nvlink"),
}
SIZE_RANGES = ((0, 64 << 10), (64 << 10, 1 << 20), (1 << 20, 16 << 20), (16 << 20, 1 << 40))
F_SCALE = 0.05


def load(gpu: str, topology: str, data_dir: str | None = None) -> pd.DataFrame:
    """Intra-node all-reduce rows: ``tp``, ``message_bytes``, ``median_s``."""
    path = resolve_data_dir(data_dir) / "vidur_profiling" / "network" / topology / "all_reduce.csv"
    if not path.is_file():
        raise FileNotFoundError(
            f"no Vidur all-reduce profile {path}: get data/profiling/network from GitHub "
            "microsoft/vidur and place it under <data_dir>/vidur_profiling/network"
        )
    frame = pd.read_csv(path)
    frame = frame[frame["num_workers"] == frame["devices_per_node"]]
    return pd.DataFrame(
        {
            "topology": topology,
            "tp": frame["num_workers"].astype(int),
            "message_bytes": frame["size"].astype(float) * ELEMENT_BYTES,
            "median_s": frame["time_stats.all_reduce.median"].astype(float) / 1e3,
        }
    ).sort_values(["tp", "message_bytes"], ignore_index=True)


def ring_bytes(frame: pd.DataFrame) -> np.ndarray:
    tp = frame["tp"].to_numpy(float)
    return 2.0 * (tp - 1) / tp * frame["message_bytes"].to_numpy(float)


def predict(frame: pd.DataFrame, hw: Hardware, eff: Efficiency) -> np.ndarray:
    """The cost model's all-reduce time of each row's one call."""
    return eff.t0 + ring_bytes(frame) / (eff.eta_m * hw.link_bw)


def fit(frame: pd.DataFrame, hw: Hardware) -> Efficiency:
    """``(t0, eta_m)`` minimising the soft-L1 relative error over ``frame``'s rows."""
    moved, t = ring_bytes(frame), frame["median_s"].to_numpy(float)

    def residuals(x: np.ndarray) -> np.ndarray:
        return (x[0] * 1e-6 + moved / (math.exp(x[1]) * hw.link_bw)) / t - 1.0

    lo, hi = [0.0, math.log(1e-3)], [1e4, math.log(ETA_MAX)]
    sol = least_squares(residuals, [10.0, 0.0], bounds=(lo, hi), loss="soft_l1", f_scale=F_SCALE)
    return Efficiency(1.0, float(math.exp(sol.x[1])), float(sol.x[0]) * 1e-6)


def _entry(eff: Efficiency, err: np.ndarray) -> dict[str, Any]:
    return {
        "eta_c": eff.eta_c,
        "eta_m": eff.eta_m,
        "t0": eff.t0,
        "n": len(err),
        "median_rel_err": float(np.median(np.abs(err))),
        "p90_rel_err": float(np.quantile(np.abs(err), 0.9)),
    }


def _table(frame: pd.DataFrame, label: str) -> list[dict[str, Any]]:
    """Median / P90 |error| per (tp, message-size range) of ``frame['rel_err']``."""
    bins = pd.IntervalIndex.from_tuples(SIZE_RANGES, closed="right")
    frame = frame.assign(abs_err=frame["rel_err"].abs(), size=pd.cut(frame["message_bytes"], bins))
    rows = []
    for (tp, size), sub in frame.groupby(["tp", "size"], observed=True)["abs_err"]:
        rows.append(
            {
                "set": label,
                "tp": int(tp),
                "message_bytes": f"({int(size.left)}, {int(size.right)}]",
                "n": len(sub),
                "median": float(sub.median()),
                "p90": float(sub.quantile(0.9)),
            }
        )
    return rows


def calibrate(gpu: str, hw: Hardware, data_dir: str | None = None) -> dict[str, Any]:
    """The ``allreduce`` entry of a calibration file (joint fit + ``by_tp``), its held-back
    errors (alternate sizes; the other topology) and provenance."""
    if gpu not in TOPOLOGY:
        raise ValueError(
            f"--gpu {gpu!r}: no Vidur all-reduce topology known (known: {list(TOPOLOGY)})"
        )
    fitted_on, checked_on = TOPOLOGY[gpu]
    frame = load(gpu, fitted_on, data_dir)
    train = frame[frame.groupby("tp").cumcount() % 2 == 0]
    test = frame.drop(train.index)
    joint = fit(train, hw)
    by_tp = {int(tp): fit(sub, hw) for tp, sub in train.groupby("tp")}
    entry = _entry(joint, predict(train, hw, joint) / train["median_s"] - 1.0)
    entry["by_tp"] = {}
    held, other = test.copy(), load(gpu, checked_on, data_dir)
    held["rel_err"] = np.nan
    other["rel_err"] = np.nan
    for tp, eff in by_tp.items():
        rows = train["tp"] == tp
        entry["by_tp"][str(tp)] = _entry(
            eff, predict(train[rows], hw, eff) / train[rows]["median_s"] - 1
        )
        for sub in (held, other):
            mask = sub["tp"] == tp
            sub.loc[mask, "rel_err"] = predict(sub[mask], hw, eff) / sub.loc[mask, "median_s"] - 1
    other = other.dropna(subset=["rel_err"])
    summary = {
        "held_back": _summary(held),
        f"other_topology ({checked_on})": _summary(other),
    }
    return {
        "entry": entry,
        "profile_records": profile_records(frame, fitted_on),
        "held_back_error": summary,
        "table": _table(held, "held_back") + _table(other, f"other_topology ({checked_on})"),
        "provenance": {
            "model": "t = t0(tp) + 2(tp-1)/tp * message_bytes / (eta_m(tp) * link_bw), per call",
            "source": f"vidur_profiling/network/{fitted_on}/all_reduce.csv (medians; "
            "num_workers == devices_per_node; size x 2 bytes)",
            "checked_on": f"vidur_profiling/network/{checked_on}/all_reduce.csv (not fitted)",
            "split": "alternate message sizes per tp: even ranks fitted, odd held back",
            "records": {"fit": len(train), "held_back": len(test), "other_topology": len(other)},
            "tp": sorted(by_tp),
            "other tp": "the joint fit over all tp (ops.allreduce itself)",
        },
    }


def profile_records(frame: pd.DataFrame, topology: str) -> list[dict[str, Any]]:
    """The rows as :mod:`gpu_validate.profiles` records of the cost model's ``tp_allreduce``
    (one call per unit; the profile's argument is the message bytes)."""
    return [
        {
            "model": topology,
            "op_name": ALLREDUCE,
            "op_class": "allreduce",
            "shape": (),
            "units": 1,
            "tp": int(tp),
            "tokens": int(size),
            "median_s": float(t),
        }
        for tp, size, t in zip(frame["tp"], frame["message_bytes"], frame["median_s"], strict=True)
    ]


def _summary(frame: pd.DataFrame) -> dict[str, Any]:
    err = frame["rel_err"].abs()
    out: dict[str, Any] = {"median": float(err.median()), "p90": float(err.quantile(0.9))}
    out["by_tp"] = {
        str(tp): {"median": float(s.median()), "p90": float(s.quantile(0.9))}
        for tp, s in err.groupby(frame["tp"])
    }
    return out
