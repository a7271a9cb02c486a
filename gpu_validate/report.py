"""Validation report: predicted vs measured, uncalibrated and calibrated (no ``torch``).

Predictions go through the simlab cost model itself (:meth:`CostModel.op_time` on the ops the
records carry): per op record one op, per composed-stack record the sum over the iteration's
ops (what :meth:`CostModel.time` computes). "Uncalibrated" is the cost model's spec-sheet
default efficiencies on the same peaks; "calibrated" is the calibration file (in a composed
stack, ops of a shape the file measured, its ``profiles``, are timed from them, as simlab does;
a single op record is always timed by its class model). Per-op errors of
the calibrated model are in-sample (the fit saw those records), so the report also gives a
2-fold cross-validated error per op class; the composed stack is never fitted, so its error is
out of sample.

Writes ``report.md`` (tables), ``predictions.csv`` (one row per record), ``summary.json`` and
``pred_vs_meas.png`` into the output directory, and with composed-stack prefills
``stack_prefill.csv`` (:func:`write_stack_table`): those measurements as the table that
``python -m simlab.predict measured.path=...`` checks its prediction against.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpu_validate.fit import fit_records, hardware_from_json, select
from gpu_validate.records import headers, key_of, read_records, timed
from simlab import CostModel, ModelSpec
from simlab.cost.calibration import Calibration, Efficiency
from simlab.cost.shapes import Op

_DUMMY = ModelSpec(d_model=8, n_attn_layers=1, n_ssm_layers=0, n_heads=1)  # op_time ignores it


def _ops(record: dict[str, Any]) -> list[Op]:
    if record["kind"] == "stack":  # ops of a measured shape as simlab times them
        return [
            Op(
                o["name"],
                o["op_class"],
                o["flops"],
                o["bytes"],
                o["launches"],
                o.get("tokens", 0),
                shape=tuple(o.get("shape", ())),
                units=o.get("units", 0),
            )
            for o in record["ops"]
        ]
    return [  # by its class model (a profile built from this very record would just echo it)
        Op(
            record["op_name"],
            record["op_class"],
            record["flops"],
            record["bytes"],
            record["launches"],
            record.get("tokens", 0),
        )
    ]


def predict(record: dict[str, Any], model: CostModel) -> float:
    """Seconds the cost model predicts for a record's op (or a stack's whole iteration)."""
    return sum(model.op_time(op) for op in _ops(record))


def label(record: dict[str, Any]) -> str:
    v = record.get("variant") or ""
    if record["kind"] == "stack":
        return f"{record['op_name']} {v}".strip()
    return f"{record['op_name']}[{v}]" if v else record["op_name"]


def _stats(errs: Sequence[float]) -> tuple[float, float]:
    a = np.abs(np.asarray(errs, dtype=float))
    return float(np.median(a)), float(np.percentile(a, 90))


def cross_validated(used: list[dict[str, Any]], hw: Any) -> dict[int, float]:
    """Relative error of each fitted record (by position in ``used``) when predicted by a fit
    on the other half of its op class's records (records alternate between the halves)."""
    by_class: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(used):
        by_class[r["op_class"]].append(i)
    out: dict[int, float] = {}
    for idx in by_class.values():
        if len(idx) < 6:
            continue
        idx = sorted(idx, key=lambda i: json.dumps(used[i]["params"], sort_keys=True))
        folds = (idx[0::2], idx[1::2])
        for train, test in (folds, folds[::-1]):
            fits = fit_records([used[i] for i in train], hw)
            for i in test:
                eff: Efficiency = fits[used[i]["op_class"]].efficiency
                model = CostModel(
                    _DUMMY, hw, Calibration({**Calibration().efficiency, used[i]["op_class"]: eff})
                )
                out[i] = predict(used[i], model) / used[i]["median_s"] - 1.0
    return out


def build_report(
    paths: Sequence[str | Path], calibration: str | Path, out_dir: str | Path
) -> dict[str, Any]:
    """Compare records with the uncalibrated and the calibrated cost model; write the files."""
    records = read_records(paths)
    cal_data = json.loads(Path(calibration).read_text())
    hw = hardware_from_json(cal_data["hardware"])
    models = {
        "uncal": CostModel(_DUMMY, hw, Calibration()),
        "cal": CostModel(_DUMMY, hw, Calibration.load(calibration)),
    }
    used = select(records)
    fitted = {key_of(r) for r in used}
    rows = []
    for r in timed(records, ("op", "stack")):
        row = {
            "kind": r["kind"],
            "suite": r["suite"],
            "label": label(r),
            "op_class": r["op_class"] or "stack",
            "params": json.dumps(r["params"], sort_keys=True),
            "measured_s": r["median_s"],
            "p90_s": r["p90_s"],
            "impl": r.get("impl", ""),
            "fitted": key_of(r) in fitted,
        }
        for name, model in models.items():
            pred = predict(r, model)
            row[f"{name}_s"] = pred
            row[f"{name}_err"] = pred / r["median_s"] - 1.0
        rows.append(row)
    cv = cross_validated(used, hw)
    cv_by_class: dict[str, list[float]] = defaultdict(list)
    for i, e in cv.items():
        cv_by_class[used[i]["op_class"]].append(e)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = _summarise(rows, cv_by_class, cal_data, records)
    _write_csv(out / "predictions.csv", rows)
    write_stack_table(out / "stack_prefill.csv", records)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    (out / "report.md").write_text(_markdown(summary, cal_data))
    _plot(out / "pred_vs_meas.png", rows, hw.name)
    return summary


def write_stack_table(path: Path, records: list[dict[str, Any]]) -> int:
    """The composed stack's prefill records as a measured-prefill table (:mod:`simlab.experiments.measured`:
    ``prompt_tokens``, ``prefix_tokens``, ``ttft_ms``, the median of the repetitions), one row
    per record, for ``python -m simlab.predict model=<the run's> hardware=<its GPU>
    engine.token_budget=<the longest prompt> measured.path=PATH measured.prefix=prefix_tokens``
    (each record is one iteration of the whole model at TP 1, so the budget must not chunk it).
    Returns the rows; without any, no file (an earlier report's is removed)."""
    rows = [
        {
            "prompt_tokens": r["params"]["len"],
            "prefix_tokens": r["params"]["prefix"],
            "ttft_ms": 1000 * r["median_s"],
        }
        for r in timed(records, ("stack",))
        if r["params"].get("mode") == "prefill"
    ]
    if rows:
        _write_csv(path, rows)
    else:
        path.unlink(missing_ok=True)
    return len(rows)


def _group(rows: list[dict], key: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        out[r[key]].append(r)
    return dict(sorted(out.items()))


def _err_row(rows: list[dict]) -> dict[str, Any]:
    u_med, u_p90 = _stats([r["uncal_err"] for r in rows])
    c_med, c_p90 = _stats([r["cal_err"] for r in rows])
    return {
        "n": len(rows),
        "uncal_median": u_med,
        "uncal_p90": u_p90,
        "cal_median": c_med,
        "cal_p90": c_p90,
    }


def _summarise(
    rows: list[dict], cv_by_class: dict[str, list[float]], cal: dict, records: list[dict]
) -> dict[str, Any]:
    ops = [r for r in rows if r["kind"] == "op"]
    stack = [r for r in rows if r["kind"] == "stack"]
    hdr = headers(records)
    by_class = {}
    for cls, group in _group([r for r in ops if r["fitted"]], "op_class").items():
        entry = _err_row(group)
        if cv_by_class.get(cls):
            entry["cv_median"], entry["cv_p90"] = _stats(cv_by_class[cls])
        by_class[cls] = entry
    stack_groups = {k: _err_row(v) for k, v in _group(stack, "label").items()}
    prefill = [r for r in stack if r["label"].startswith("stack_prefill")]
    decode = [r for r in stack if r["label"].startswith("stack_decode")]
    return {
        "hardware": cal["hardware"],
        "device": hdr[-1].get("device_name") if hdr else None,
        "synthetic": bool(hdr and hdr[-1].get("synthetic")),
        "run_ids": sorted({h.get("run_id", "") for h in hdr}),
        "by_op": {k: _err_row(v) for k, v in _group(ops, "label").items()},
        "by_class": by_class,
        "stack": stack_groups,
        "stack_prefill": _err_row(prefill) if prefill else None,
        "stack_decode": _err_row(decode) if decode else None,
        "all_ops": _err_row(ops) if ops else None,
    }


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        path.write_text("")
        return
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _table(title: str, entries: dict[str, dict], cv: bool = False) -> list[str]:
    head = "| | n | uncal. median | uncal. P90 | cal. median | cal. P90 |"
    sep = "|---|---:|---:|---:|---:|---:|"
    if cv:
        head += " cal. 2-fold CV median | CV P90 |"
        sep += "---:|---:|"
    lines = [f"### {title}", "", head, sep]
    for name, e in entries.items():
        line = (
            f"| {name} | {e['n']} | {_pct(e['uncal_median'])} | {_pct(e['uncal_p90'])} | "
            f"{_pct(e['cal_median'])} | {_pct(e['cal_p90'])} |"
        )
        if cv:
            line += f" {_pct(e.get('cv_median'))} | {_pct(e.get('cv_p90'))} |"
        lines.append(line)
    return [*lines, ""]


def _markdown(summary: dict[str, Any], cal: dict) -> str:
    hw = summary["hardware"]
    lines = [
        "# Cost-model validation",
        "",
        f"Device: {summary['device']}; peaks used: {hw['name']} "
        f"({hw['peak_tflops']:.4g} TFLOP/s, {hw['mem_bw_gbps']:.4g} GB/s; {hw['source']}).",
        "Errors are |predicted / measured - 1| over the median of each shape's repetitions.",
        "uncal. = spec-sheet default efficiencies; cal. = the fitted calibration "
        "(in-sample for ops; the composed stack is not fitted).",
        "",
    ]
    if str(summary["device"] or "").startswith("cpu"):
        lines += [
            "**CPU run: a functional check of the harness (tiny shapes), not a calibration.**",
            "",
        ]
    if summary["synthetic"]:
        lines += [
            "**Synthetic records** (made by the cost model with known efficiencies "
            "plus noise): a test of the fit and the report, not a measurement.",
            "",
        ]
    if summary["stack_prefill"] or summary["stack_decode"]:
        comp = {}
        if summary["stack_prefill"]:
            comp["prefill (all hit ratios)"] = summary["stack_prefill"]
        if summary["stack_decode"]:
            comp["decode (all shapes)"] = summary["stack_decode"]
        comp.update(summary["stack"])
        lines += _table("Composed hybrid stack", comp)
    lines += _table("Per op class (the records the fit used)", summary["by_class"], cv=True)
    lines += _table("Per op (all records; MoE stand-in and flex are not fitted)", summary["by_op"])
    lines += [
        "### Calibration",
        "",
        "| class | eta_c | eta_m | t0 (us) | n |",
        "|---|---:|---:|---:|---:|",
    ]
    for cls, v in cal["ops"].items():
        lines.append(
            f"| {cls} | {v['eta_c']:.3f} | {v['eta_m']:.3f} | {v['t0'] * 1e6:.2f} | "
            f"{v.get('n', '')} |"
        )
    if cal.get("floors"):
        f = cal["floors"]
        lines += [
            "",
            "Floors: "
            + ", ".join(
                s
                for s in (
                    f"GEMM {f['gemm_tflops']:.4g} TFLOP/s" if "gemm_tflops" in f else "",
                    f"copy {f['copy_gbps']:.4g} GB/s (read + write)" if "copy_gbps" in f else "",
                    f"launch {f['launch_us']:.2f} us" if "launch_us" in f else "",
                )
                if s
            ),
        ]
    lines += ["", "![predicted vs measured](pred_vs_meas.png)", ""]
    return "\n".join(lines)


def _plot(path: Path, rows: list[dict], hw_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharex=True, sharey=True)
    classes = sorted({r["op_class"] for r in rows})
    colors = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(classes)}
    meas = np.array([r["measured_s"] for r in rows]) if rows else np.array([1e-6, 1.0])
    lo, hi = float(meas.min()) / 2, float(meas.max()) * 2
    for ax, (name, title) in zip(
        axes, (("uncal", "uncalibrated (defaults)"), ("cal", "calibrated")), strict=True
    ):
        for cls in classes:
            sel = [r for r in rows if r["op_class"] == cls]
            ax.scatter(
                [r["measured_s"] for r in sel],
                [r[f"{name}_s"] for r in sel],
                s=40 if cls == "stack" else 12,
                marker="*" if cls == "stack" else "o",
                color="black" if cls == "stack" else colors[cls],
                label=cls,
                alpha=0.8,
            )
        xs = np.array([lo, hi])
        ax.plot(xs, xs, "k-", lw=0.8)
        ax.fill_between(xs, xs * 0.9, xs * 1.1, color="grey", alpha=0.2, lw=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured (s)")
        ax.set_title(title)
    axes[0].set_ylabel("predicted (s)")
    axes[1].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"cost model vs measurement ({hw_name}; band = +-10%)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def format_summary(summary: dict[str, Any]) -> str:
    lines = []
    for title, key in (
        ("stack prefill", "stack_prefill"),
        ("stack decode", "stack_decode"),
        ("all ops", "all_ops"),
    ):
        e = summary.get(key)
        if e:
            lines.append(
                f"{title:<14} n={e['n']:<4} uncalibrated median {_pct(e['uncal_median'])} "
                f"P90 {_pct(e['uncal_p90'])} | calibrated median {_pct(e['cal_median'])} "
                f"P90 {_pct(e['cal_p90'])}"
            )
    for cls, e in summary["by_class"].items():
        lines.append(
            f"  {cls:<13} n={e['n']:<4} uncal {_pct(e['uncal_median'])}/{_pct(e['uncal_p90'])}"
            f"  cal {_pct(e['cal_median'])}/{_pct(e['cal_p90'])}"
            f"  cv {_pct(e.get('cv_median'))}/{_pct(e.get('cv_p90'))}"
        )
    return "\n".join(lines)
