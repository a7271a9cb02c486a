"""Calibration from Vidur's measured operator times, without a GPU (``python -m gpu_validate.vidur``).

Vidur (github microsoft/vidur, MIT) profiled every position-wise operator of a Llama decoder
layer on A100 and H100 against the token count and the tensor-parallel degree
(``<data_dir>/vidur_profiling/compute/<gpu>/meta-llama/<model>/mlp.csv``: medians in ms). Each
row becomes one record per simlab op of a one-layer model with the row's dimensions, its time the
sum of the Vidur operators the op covers (:data:`COVERS`):

* ``attn_qkv_proj`` = ``attn_pre_proj``; ``attn_out_proj`` = ``attn_post_proj`` (class gemm);
* ``mlp`` = ``mlp_up_proj`` + ``mlp_act`` + ``mlp_down_proj`` (class gemm; the cost model folds
  the activation into the MLP);
* ``norms_residuals`` = both RMSNorms + two residual adds (class elementwise).

Per op class, ``(eta_c, eta_m, t0)`` and a token-count curve (``gpu_validate.fit.fit_class``
with ``curve``) are fitted on alternate token counts of every (model, op, tp) series and checked
on the others (held back): median and P90 relative error per op class, by model and by token
range, beside the plain roofline's error and a fit on the ``--fit`` models checked on the other
models, and broken down by op and TP degree. Beside it, what the measurements themselves allow
(:func:`error_floor`): the spread of repeated measurements of one shape, and the held-back error of
a per-series lookup that interpolates each held-back row between its two fitted neighbours
(cuBLAS picks its tiles per shape and token count, so GEMM times are a staircase in the token
count that no model smooth in the token count follows; that interpolation is not a cost model,
only a bound on what any model smooth between adjacent token counts can reach). The NCCL
all-reduce is fitted per tensor-parallel degree on the network profiles
(:mod:`gpu_validate.vidur_network`). Every fit is against the peaks of the card that ran the
measurements (:data:`MEASURED_ON`: Vidur's A100 is the 80 GB part); a file for another preset of
the same chip (``a100_40gb``: less memory bandwidth) keeps the fitted fractions of peak and
scales the measured shapes by the class model (:func:`transfer`). The output is a calibration file
(:meth:`simlab.cost.calibration.Calibration.load`) with that provenance; classes Vidur does not
measure (attention kernels, SSM scans, state copies) and the ``engine.costs`` terms keep their
defaults, and the file says so (``unmeasured``, ``terms``).

The file also carries the measurements themselves (``profiles``: per (op, layer shape, tp), the
seconds of one unit at every measured token count, and per tp one all-reduce call at every
measured message size, :class:`simlab.cost.profiles.Profile`), which the cost model uses for ops of
those shapes; their held-back error is checked the same way, with the
token counts of each (op, shape, tp) series alternating (:mod:`gpu_validate.profiles`), and their
extrapolation above 4,096 tokens on the series that go further (:func:`extrapolation_error`).

    python -m gpu_validate.vidur --gpu a100 --hardware a100_80gb --out gpu_validate/calibration/a100_80gb.json
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_validate import profiles, vidur_network
from gpu_validate.cases import load_hardware
from gpu_validate.fit import ClassFit, fit_class, fit_curve, hardware_json, roofline
from simlab import CostModel, Hardware, ModelSpec
from simlab.cost.calibration import DEFAULT_EFFICIENCY, Efficiency
from simlab.cost.shapes import BatchShape
from traces.atomic import atomic_path
from traces.paths import resolve_data_dir

log = logging.getLogger(__name__)

#: simlab op (one layer) -> the Vidur operators whose times it sums (and how many of each)
COVERS: dict[str, tuple[tuple[str, int], ...]] = {
    "attn_qkv_proj": (("attn_pre_proj", 1),),
    "attn_out_proj": (("attn_post_proj", 1),),
    "mlp": (("mlp_up_proj", 1), ("mlp_act", 1), ("mlp_down_proj", 1)),
    "norms_residuals": (("input_layernorm", 1), ("post_attention_layernorm", 1), ("add", 2)),
}
TOKEN_RANGES = ((1, 64), (65, 512), (513, 2048), (2049, 1 << 20))
#: the issue's acceptance per op class and GPU: |held-back relative error| median and P90
ACCEPTANCE = {"median": 0.05, "p90": 0.10}
UNMEASURED = ("attn_prefill", "attn_decode", "ssm_scan", "selective_scan", "ssm_step", "state_copy")
#: the preset of the card each Vidur device folder was measured on. Vidur's A100 is the 80 GB
#: SXM4 part: its device config says so (``A100DeviceSKUConfig.total_memory_gb = 80``), and the
#: data agree: at <= 64 tokens Llama-3-8B's MLP up-projection streams its 235 MB of weights at up
#: to 1,655 GB/s, more than a 40 GB card's 1,555 GB/s peak (:func:`weight_stream_gbps`)
MEASURED_ON = {"a100": "a100_80gb", "h100": "h100_sxm"}
#: what a calibration file for a preset should warn about
NOTES = {
    "a100_40gb": "fitted on Vidur's A100 measurements, taken on an A100-SXM4-80GB (2,039 GB/s; "
    "see measured_on). The class efficiencies are fractions of a card's peaks, so here they "
    "apply to this preset's 1,555 GB/s; the measured shapes (profiles) are Vidur's times, each "
    "scaled by the fitted class model's time on this preset over its time on the measured one "
    "(1 where compute-bound, up to 2,039 / 1,555 = 1.31 where memory-bound). Clocks, tensor "
    "peak and NVLink are the same on both cards; the all-reduce profiles are kept as measured",
}
#: engine.costs terms no Vidur profile pins down (they stay at their no-charge defaults)
TERMS = (
    "iteration_overhead_s",
    "sequence_overhead_s",
    "moe_dispatch_s_per_token",
    "mamba1_scan_scale",
    "mamba2_scan_scale",
    "state_load_s",
    "state_store_s",
)


def one_layer(row: pd.Series) -> ModelSpec:
    """A one-layer model with a Vidur row's dimensions (BF16)."""
    d, heads = int(row["n_embd"]), int(row["n_head"])
    return ModelSpec.from_config(
        {
            "name": "vidur-layer",
            "flop_formula": "exact",
            "d_model": d,
            "n_attn_layers": 1,
            "n_ssm_layers": 0,
            "n_mlp_layers": 1,
            "n_moe_layers": 0,
            "n_heads": heads,
            "n_kv_heads": int(row["n_kv_head"]),
            "head_dim": d // heads,
            "mlp_intermediate": int(row["n_expanded_embd"]),
            "mlp_gated": bool(row["use_gated_mlp"]),
            "dtype_bytes": 2,
            "vocab_size": int(row["vocab_size"]),
            "tie_embeddings": False,
        }
    )


def records_of(path: Path, model: str, hw: Hardware) -> list[dict[str, Any]]:
    """One record per (row, simlab op): the cost model's FLOPs, bytes and launches for the
    row's shape and the measured seconds."""
    frame = pd.read_csv(path)
    out = []
    for _, row in frame.iterrows():
        tokens, tp = int(row["num_tokens"]), int(row["num_tensor_parallel_workers"])
        ops = CostModel(one_layer(row), hw, tp=tp).ops(BatchShape(prefill=[(0, tokens)]))
        by_name = {op.name: op for op in ops}
        for name, covered in COVERS.items():
            ms = sum(float(row[f"time_stats.{op}.median"]) * k for op, k in covered)
            op = by_name[name]
            out.append(
                {
                    "model": model,
                    "op_name": name,
                    "op_class": op.op_class,
                    "tokens": tokens,
                    "tp": tp,
                    "flops": op.flops,
                    "bytes": op.bytes,
                    "launches": op.launches,
                    "median_s": ms / 1e3,
                    "shape": op.shape,
                    "units": op.units,
                }
            )
    return out


def transfer(
    records: Sequence[dict], fitted: dict[str, Efficiency], measured: Hardware, target: Hardware
) -> list[dict]:
    """Compute records measured on ``measured`` as ``target`` would time them: each measured
    time times the fitted class model's time on ``target`` over its time on ``measured`` (the
    same achieved fractions of each card's peaks). The records themselves when the presets'
    peaks agree."""
    if (target.peak_flops, target.mem_bw) == (measured.peak_flops, measured.mem_bw):
        return list(records)
    out = []
    for r in records:
        eff = fitted.get(r["op_class"], DEFAULT_EFFICIENCY[r["op_class"]])
        f, b, n, tok = (np.array([float(r[k])]) for k in ("flops", "bytes", "launches", "tokens"))
        ratio = roofline(f, b, n, target, eff, tok)[0] / roofline(f, b, n, measured, eff, tok)[0]
        out.append(r | {"median_s": r["median_s"] * float(ratio)})
    return out


def weight_stream_gbps(path: Path, max_tokens: int = 64) -> float:
    """The highest bandwidth at which a Vidur CSV's MLP up-projection (TP 1) streams its weights
    at up to ``max_tokens`` tokens (weights and activations over the measured median, GB/s): a
    lower bound on the measuring card's memory bandwidth (the weights do not fit in L2)."""
    frame = pd.read_csv(path)
    frame = frame[(frame["num_tensor_parallel_workers"] == 1) & (frame["num_tokens"] <= max_tokens)]
    d, inter, tokens = frame["n_embd"], frame["n_expanded_embd"], frame["num_tokens"]
    mats = np.where(frame["use_gated_mlp"].astype(bool), 2, 1)
    moved = (d * mats * inter + tokens * (d + mats * inter)) * 2
    return float((moved / (frame["time_stats.mlp_up_proj.median"] / 1e3)).max() / 1e9)


def load_records(gpu: str, hw: Hardware, data_dir: str | None = None) -> list[dict[str, Any]]:
    root = resolve_data_dir(data_dir) / "vidur_profiling" / "compute" / gpu / "meta-llama"
    files = sorted(root.glob("*/mlp.csv"))
    if not files:
        raise FileNotFoundError(
            f"no Vidur profiles under {root}: get data/profiling/compute from GitHub "
            "microsoft/vidur and place it under <data_dir>/vidur_profiling/compute"
        )
    return [r for f in files for r in records_of(f, f.parent.name, hw)]


def split_rows(records: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """Alternate token counts: in each (model, op, tp) series sorted by tokens, the even ranks
    are fitted and the odd ones held back (every token range is in both halves)."""
    series: dict[tuple, list[dict]] = {}
    for r in records:
        series.setdefault((r["model"], r["op_name"], r["tp"]), []).append(r)
    train: list[dict] = []
    test: list[dict] = []
    for rows in series.values():
        for i, r in enumerate(sorted(rows, key=lambda r: r["tokens"])):
            (train if i % 2 == 0 else test).append(r)
    return train, test


def fit_classes(train: Sequence[dict], hw: Hardware, curve: bool) -> dict[str, ClassFit]:
    return {
        cls: fit_class(
            [r for r in train if r["op_class"] == cls], hw, DEFAULT_EFFICIENCY[cls], cls, curve
        )
        for cls in sorted({r["op_class"] for r in train})
    }


def errors(records: Sequence[dict], hw: Hardware, fitted: dict[str, Efficiency]) -> pd.DataFrame:
    """Relative error ``predicted / measured - 1`` of every record under ``fitted``."""
    frame = pd.DataFrame(records)
    pred = np.empty(len(frame))
    for cls, rows in frame.groupby("op_class").groups.items():
        sub = frame.loc[rows]
        eff = fitted.get(str(cls), DEFAULT_EFFICIENCY[str(cls)])
        f, b, n, tok = (sub[k].to_numpy(float) for k in ("flops", "bytes", "launches", "tokens"))
        pred[frame.index.get_indexer(rows)] = roofline(f, b, n, hw, eff, tok)
    frame["rel_err"] = pred / frame["median_s"].to_numpy() - 1.0
    return frame


def error_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Median and P90 of |relative error| per (held-back model, op class, token range)."""
    bins = pd.IntervalIndex.from_tuples(TOKEN_RANGES, closed="both")
    frame = frame.assign(abs_err=frame["rel_err"].abs(), tokens=pd.cut(frame["tokens"], bins))
    grouped = frame.groupby(["model", "op_class", "tokens"], observed=True)["abs_err"]
    return pd.DataFrame(
        {"n": grouped.size(), "median": grouped.median(), "p90": grouped.quantile(0.9)}
    )


def per_class(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Median and P90 of |relative error| per op class."""
    return {
        str(cls): {"median": float(e.abs().median()), "p90": float(e.abs().quantile(0.9))}
        for cls, e in frame.groupby("op_class")["rel_err"]
    }


def breakdown(frame: pd.DataFrame, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Rows, median and P90 of |relative error| per value of ``keys`` (e.g. op and TP), plus
    the median signed error (``bias``: > 0 predicted too slow)."""
    frame = frame.assign(
        abs_err=frame["rel_err"].abs(),
        token_range=pd.cut(frame["tokens"], pd.IntervalIndex.from_tuples(TOKEN_RANGES, "both")),
    )
    out = []
    for key, sub in frame.groupby(list(keys), observed=True):
        key = key if isinstance(key, tuple) else (key,)
        err = sub["abs_err"]
        out.append(
            {
                k: (str(v) if k == "token_range" else _plain(v))
                for k, v in zip(keys, key, strict=True)
            }
            | {
                "n": len(sub),
                "median": float(err.median()),
                "p90": float(err.quantile(0.9)),
                "bias": float(sub["rel_err"].median()),
            }
        )
    return out


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def neighbour_floor(train: Sequence[dict], test: Sequence[dict]) -> pd.DataFrame:
    """Each held-back row predicted from its own (model, op, tp) series' fitted rows alone,
    linearly in (log tokens, log time) between the two nearest fitted token counts (repeated
    measurements of one token count averaged in log; the end values beyond the ends): the
    held-back error of a per-series lookup table. Not a cost model (it knows every measured
    shape and nothing else): a bound on what a model smooth between adjacent token counts of one
    shape can reach on this split. Columns as :func:`errors` (``rel_err``)."""
    fitted: dict[tuple, dict[int, list[float]]] = {}
    for r in train:
        key = (r["model"], r["op_name"], r["tp"])
        fitted.setdefault(key, {}).setdefault(int(r["tokens"]), []).append(math.log(r["median_s"]))
    rows = []
    for r in test:
        series = fitted[(r["model"], r["op_name"], r["tp"])]
        tokens = sorted(series)
        logs = [float(np.mean(series[t])) for t in tokens]
        pred = math.exp(float(np.interp(math.log(r["tokens"]), np.log(tokens), logs)))
        rows.append(r | {"rel_err": pred / r["median_s"] - 1.0})
    return pd.DataFrame(rows)


#: the extrapolation check: profiles measured up to this many tokens, checked above it
EXTRAPOLATE_FROM = 4096


def extrapolation_error(records: Sequence[dict]) -> dict[str, Any]:
    """Profiles built from the rows up to :data:`EXTRAPOLATE_FROM` tokens and checked on the
    series' rows above it (where :meth:`Profile.at` is proportional to the tokens): median and
    P90 per op class, and the token counts checked. Empty when no series goes beyond."""
    records = profiles.profiled(records)
    low = [r for r in records if r["tokens"] <= EXTRAPOLATE_FROM]
    high = [r for r in records if r["tokens"] > EXTRAPOLATE_FROM]
    if not high:
        return {}
    frame = pd.DataFrame(profiles.profiled_errors(low, high))
    return {
        "fitted_up_to_tokens": EXTRAPOLATE_FROM,
        "checked_tokens": [int(frame["tokens"].min()), int(frame["tokens"].max())],
        "models": sorted(set(frame["model"])),
        **per_class(frame),
    }


def series_curve_floor(
    train: Sequence[dict], test: Sequence[dict], hw: Hardware, fitted: dict[str, Efficiency]
) -> pd.DataFrame:
    """Each (model, op, tp) series with its own token-count curve (:func:`fit_curve` on its
    fitted rows, over its class's fitted efficiency) checked on its held-back rows: a per-shape
    curve of ~13 knots, far more freedom than the per-class model, still smooth in log tokens.
    Columns as :func:`errors`."""
    series: dict[tuple, list[dict]] = {}
    for r in train:
        series.setdefault((r["model"], r["op_name"], r["tp"]), []).append(r)
    out = []
    for key, rows in sorted(series.items()):
        held = [r for r in test if (r["model"], r["op_name"], r["tp"]) == key]
        cls = rows[0]["op_class"]
        base = replace(fitted[cls], curve=())
        out.append(errors(held, hw, {cls: fit_curve(rows, hw, base)}))
    return pd.concat(out, ignore_index=True)


def repeat_spread(records: Sequence[dict]) -> pd.DataFrame:
    """Shapes Vidur measured more than once (same model, op, tp, tokens): ``spread`` =
    largest / smallest median - 1, the measurements' own reproducibility."""
    frame = pd.DataFrame(records)
    keys = ["model", "op_class", "op_name", "tp", "tokens"]
    grouped = frame.groupby(keys)["median_s"]
    spread = (grouped.max() / grouped.min() - 1.0)[grouped.size() > 1]
    return spread.rename("spread").reset_index()


def error_floor(
    records: Sequence[dict],
    train: Sequence[dict],
    test: Sequence[dict],
    hw: Hardware,
    fitted: dict[str, Efficiency],
) -> dict:
    """Per op class: the repeat spread (:func:`repeat_spread`), the per-series lookup's
    held-back error (:func:`neighbour_floor`) and the per-series curve's
    (:func:`series_curve_floor`), median / P90 (the lookup also per op)."""
    spread = repeat_spread(records)
    lookup = neighbour_floor(train, test)
    curves = series_curve_floor(train, test, hw, fitted)
    out: dict[str, Any] = {}
    for cls, e in lookup.groupby("op_class")["rel_err"]:
        rep = spread.loc[spread["op_class"] == cls, "spread"]
        out[str(cls)] = {
            "repeats": {
                "n": len(rep),
                "median": float(rep.median()) if len(rep) else None,
                "p90": float(rep.quantile(0.9)) if len(rep) else None,
            },
            "neighbour_lookup": _median_p90(e),
            "series_curve": _median_p90(curves.loc[curves["op_class"] == cls, "rel_err"]),
        }
    out["neighbour_lookup_by_op"] = breakdown(lookup, ["op_class", "op_name"])
    return out


def _median_p90(err: pd.Series) -> dict[str, float]:
    return {"median": float(err.abs().median()), "p90": float(err.abs().quantile(0.9))}


def acceptance(summary: dict[str, dict[str, float]]) -> dict[str, dict[str, bool]]:
    """Per class: whether the held-back median and P90 meet :data:`ACCEPTANCE`."""
    return {
        cls: {f"{k}_ok": bool(v[k] <= ACCEPTANCE[k]) for k in ACCEPTANCE}
        for cls, v in summary.items()
    }


def held_back(
    train: Sequence[dict], test: Sequence[dict], hw: Hardware, curve: bool
) -> tuple[dict[str, ClassFit], pd.DataFrame]:
    fits = fit_classes(train, hw, curve)
    return fits, errors(test, hw, {c: f.efficiency for c, f in fits.items()})


def calibrate(
    gpu: str, hardware: str, fit_models: Sequence[str], data_dir: str | None = None
) -> dict[str, Any]:
    """The calibration file's content: fitted classes (token-count curves included) on
    alternate token counts of every model, held-back errors on the others (and, as a check
    of generalisation, on the models left out of a fit on ``fit_models``), the all-reduce
    (:mod:`gpu_validate.vidur_network`), provenance."""
    target = load_hardware(hardware)
    measured_on = MEASURED_ON.get(gpu, hardware)
    hw = load_hardware(measured_on)  # the card that ran the measurements: every fit is against it
    if (target.peak_flops, target.link_bw) != (hw.peak_flops, hw.link_bw):
        raise ValueError(
            f"--hardware {hardware}: not the chip Vidur's {gpu} profiles were measured on "
            f"({measured_on}); only the memory bandwidth may differ"
        )
    records = load_records(gpu, hw, data_dir)
    train, test = split_rows(records)
    by_model = [r for r in records if r["model"] in fit_models]
    others = [r for r in records if r["model"] not in fit_models]
    if not by_model:
        raise ValueError(f"--fit {list(fit_models)}: no Vidur profile of these models for {gpu}")
    fits, held = held_back(train, test, hw, curve=True)
    plain = held_back(train, test, hw, curve=False)[1]
    models = held_back(by_model, others, hw, curve=True)[1] if others else pd.DataFrame()
    network = vidur_network.calibrate(gpu, hw, data_dir)
    efficiency = {cls: fit.efficiency for cls, fit in fits.items()}
    measured = transfer(profiles.profiled(records), efficiency, hw, target)
    measured += network["profile_records"]
    profiled = pd.DataFrame(profiles.profiled_errors(*profiles.split_profiles(measured)))
    summary = per_class(held)
    summary["allreduce"] = network["held_back_error"]["held_back"]
    floor = error_floor(records, train, test, hw, efficiency)
    return {
        "hardware": hardware_json(target, f"preset {hardware}"),
        "device": f"Vidur {gpu}",
        "measured_on": hardware_json(hw, f"preset {measured_on}: the card Vidur's {gpu} ran on"),
        "ops": {cls: fit.as_json() for cls, fit in fits.items()} | {"allreduce": network["entry"]},
        "unmeasured": {cls: "not in Vidur's profiles: cost-model default" for cls in UNMEASURED},
        "terms": {
            k: "not measured (Vidur times kernels, not an engine): engine.costs default"
            for k in TERMS
        },
        "fit": {
            "model": "t = [max(F/(eta_c*peak), B/(eta_m*bw)) + launches*t0] * curve(tokens)",
            "curve": "per class, piecewise linear in log2(tokens), fitted on the residual ratio",
            "source": f"vidur_profiling/compute/{gpu}/meta-llama/*/mlp.csv (medians)",
            "models": sorted({r["model"] for r in records}),
            "split": "alternate token counts per (model, op, tp): even ranks fitted, odd held back",
            "records": {"fit": len(train), "held_back": len(test)},
            "covers": {op: [f"{k}x {v}" for v, k in ops] for op, ops in COVERS.items()},
            "allreduce": network["provenance"],
        },
        "note": NOTES.get(hardware, ""),
        "held_back_error": summary,
        "acceptance": {"target": ACCEPTANCE, **acceptance(summary)},
        "profiles": profiled_section(measured, profiled, gpu),
        "held_back_by_op": breakdown(held, ["op_class", "op_name"]),
        "held_back_by_op_tp": breakdown(held, ["op_class", "op_name", "tp"]),
        "held_back_by_op_tokens": breakdown(held, ["op_class", "op_name", "token_range"]),
        "error_floor": floor,
        "held_back_error_plain_roofline": per_class(plain),
        "held_back_error_by_model": {
            "fitted_on": list(fit_models),
            "held_back": sorted({r["model"] for r in others}),
            **(per_class(models) if others else {}),
        },
        "allreduce_held_back": network["held_back_error"],
        "held_back_table": _rows(error_table(held)),
        "allreduce_table": network["table"],
    }


def profiled_section(records: Sequence[dict], held: pd.DataFrame, gpu: str) -> dict[str, Any]:
    """The file's ``profiles`` (:func:`gpu_validate.profiles.section`) with the acceptance, the
    held-back error by op, by token range and (the all-reduce) by tp (``held``:
    :func:`profiles.profiled_errors` on the split) and the extrapolation check."""
    topology = vidur_network.TOPOLOGY[gpu][0]
    source = (
        f"vidur_profiling/compute/{gpu}/meta-llama/*/mlp.csv and "
        f"vidur_profiling/network/{topology}/all_reduce.csv (medians, every row)"
    )
    out = profiles.section(records, source)
    series = out.pop("series")
    compute = held[held["op_class"] != "allreduce"]
    return out | {
        "acceptance": acceptance(per_class(held)),
        "held_back_by_op": breakdown(held, ["op_class", "op_name"]),
        "held_back_by_op_tokens": breakdown(compute, ["op_class", "op_name", "token_range"]),
        "held_back_allreduce_by_tp": breakdown(held[held["op_class"] == "allreduce"], ["tp"]),
        "extrapolation": extrapolation_error([r for r in records if r["op_class"] != "allreduce"]),
        "series": series,
    }


def _rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {"model": m, "op_class": c, "tokens": str(t), **{k: float(v) for k, v in row.items()}}
        for (m, c, t), row in table.iterrows()
    ]


def format_result(result: dict[str, Any]) -> str:
    """The held-back error per op class (and the all-reduce per tp) as printed lines."""
    lines = [
        f"{'class':12s} {'held back rows':>22s} {'plain roofline':>22s} {'held-back models':>22s}"
    ]
    by_model = result["held_back_error_by_model"]
    for cls, held in result["held_back_error"].items():
        cells = [held, result["held_back_error_plain_roofline"].get(cls), by_model.get(cls)]
        text = [f"{100 * c['median']:5.1f}% / {100 * c['p90']:5.1f}%" if c else "-" for c in cells]
        lines.append(f"{cls:12s} " + " ".join(f"{t:>22s}" for t in text))
    for cls, floor in result.get("error_floor", {}).items():
        if cls in result["held_back_error"]:
            rep, look, cur = floor["repeats"], floor["neighbour_lookup"], floor["series_curve"]
            rep_text = f"{100 * rep['median']:.1f}% / {100 * rep['p90']:.1f}%" if rep["n"] else "-"
            lines.append(
                f"{cls} floor: repeated shapes ({rep['n']}) {rep_text}, per-series neighbour "
                f"lookup {100 * look['median']:.1f}% / {100 * look['p90']:.1f}%, per-series curve "
                f"{100 * cur['median']:.1f}% / {100 * cur['p90']:.1f}%"
            )
    profiled = result.get("profiles", {}).get("held_back_error", {})
    for cls, e in profiled.items():
        lines.append(
            f"{cls} measured shapes (profiles), held back: "
            f"{100 * e['median']:.1f}% / {100 * e['p90']:.1f}%"
        )
    for label, summary in result["allreduce_held_back"].items():
        for tp, e in summary["by_tp"].items():
            lines.append(
                f"allreduce tp {tp} {label}: median {100 * e['median']:.1f}% P90 {100 * e['p90']:.1f}%"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_validate.vidur", description=__doc__)
    parser.add_argument("--gpu", default="a100", help="Vidur device folder (a100, h100)")
    parser.add_argument("--hardware", default="a100_80gb", help="simlab hardware preset")
    parser.add_argument("--fit", nargs="+", default=["Llama-2-7b-hf"], help="models to fit on")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        result = calibrate(args.gpu, args.hardware, args.fit, args.data_dir)
    except (FileNotFoundError, ValueError) as err:
        sys.stderr.write(f"gpu_validate.vidur: error: {err}\n")
        return 2
    with atomic_path(args.out) as tmp:
        tmp.write_text(profiles.dumps(result) + "\n")
    sys.stdout.write(format_result(result) + f"\ncalibration: {args.out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
