"""NVIDIA's own estimator (aiconfigurator-core's SDK) on the measured serving points simlab
validates against: ``python -m bench.silicon_peer --out DIR [--model ID] [--limit N]`` writes
``DIR/silicon_peer.json`` and prints TTFT / TPOT MAPE per model x GPU x engine.

The points are :func:`simlab.experiments.silicon.points` of ``silicon_sample.csv`` (1,072, as
``python -m simlab.validate silicon`` replays them). Each is estimated the way aiconfigurator's
own silicon comparison does it (``tools/accuracy_tracking/run_silicon.py`` and
``tools/accuracy_regression_testing/predict_silicon_sample.py`` in ai-dynamo/aiconfigurator:
``cli_estimate(mode="agg", ...)`` per csv row, whose agg path ``_run_agg_estimate`` is rebuilt
here from the core SDK, as the ``aiconfigurator`` CLI package is not installed):

1. ``perf_database.get_database_view(system, backend, version, database_mode="SILICON")``;
2. ``config_builders.build_model_config(tp, 1, 1, moe_tp=tp / ep, moe_ep=ep, gemm_quant_mode=,
   moe_quant_mode=)`` with the csv row's ``gemm_quant_mode`` / ``moe_quant_mode`` (KV cache,
   FMHA and communication modes left to aiconfigurator's checkpoint inference);
3. ``models.helpers.resolve_context_fmha_by_data(..., is_context_role=True)``,
   ``resolve_dsv4_moe_arch`` and ``resolve_nvfp4_for_system`` (as ``_run_agg_estimate``);
4. ``models.get_model(model_path, model_config, backend)``; ``RuntimeConfig(isl, osl,
   batch_size=concurrency)``;
5. ``backends.factory.get_backend(backend).run_agg(model, db, runtime_config, ctx_tokens=isl,
   decode_tokens_per_iteration=1.0)`` (``cli_estimate``'s default ``ctx_tokens`` is the ISL;
   ``max_seq_len`` / ``free_gpu_memory_fraction`` left at the backend defaults); TTFT and TPOT
   (ms) are the ``InferenceSummary``'s result dict ``ttft`` / ``tpot``. ``check_oom()`` fails a
   point (``cli_estimate`` raises); ``check_kv_cache_oom()`` only flags it (it warns).

Version: aiconfigurator-core 0.12.0 answers only its queryable slots (``current``, ``next``;
``systems/query_versions.yaml``): older data directories hold partial tables (``no GEMM rows``).
The version used is simlab's ``version_for(point)`` when it is a slot, else the closest slot
above it (below it if none is above); the row records both. Model path: the csv's
``meta-llama/Llama-3.1-70B`` is not shipped (aiconfigurator would download it from Hugging Face;
this machine is offline), so its shipped copy ``meta-llama/Meta-Llama-3.1-70B`` is used.
Lengths: the nominal ISL / OSL, as aiconfigurator's comparison uses them.

Sensitivity variants, each changing one thing from the above (``primary``):
``aic_version`` (the upstream rule: the csv's version if a slot, else ``current``),
``checkpoint_quant`` (all quant modes inferred from the model's FP8 checkpoint where
aiconfigurator ships one: DeepSeek's block FP8 -> ``fp8_block`` GEMM and MoE; Llama's
``nvidia/Llama-3.1-70B-Instruct-FP8`` -> ``fp8_static`` GEMM, FP8 KV; Qwen3.5 unchanged),
``token_budget`` (``ctx_tokens`` = the server's token budget,
:func:`simlab.experiments.silicon_recipes.recipe`, capped at ``isl * (C - 1)`` as
aiconfigurator's own sweep keeps one decode request, at least ``isl``) and ``mean_lengths``
(ISL / OSL = the mean of the client's uniform ``[int(0.8 L), L]``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from aiconfigurator_core.sdk.backends.factory import get_backend
from aiconfigurator_core.sdk.config import RuntimeConfig
from aiconfigurator_core.sdk.config_builders import build_model_config
from aiconfigurator_core.sdk.models import get_model
from aiconfigurator_core.sdk.models.helpers import (
    resolve_context_fmha_by_data,
    resolve_dsv4_moe_arch,
    resolve_nvfp4_for_system,
)
from aiconfigurator_core.sdk.perf_database import get_database_view, get_version_slots
from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

from simlab.cost.measured import tables
from simlab.experiments.silicon import Point, points, version_for
from simlab.experiments.silicon_recipes import recipe

log = logging.getLogger(__name__)

VARIANTS = ("primary", "aic_version", "checkpoint_quant", "token_budget", "mean_lengths")
#: csv model path -> the config aiconfigurator-core ships for it
MODEL_ALIASES = {"meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B"}
#: the FP8 checkpoint aiconfigurator-core ships for a model (the ``checkpoint_quant`` variant)
FP8_CHECKPOINTS = {"meta-llama/Llama-3.1-70B": "nvidia/Llama-3.1-70B-Instruct-FP8"}
RANGE_RATIO = 0.8  # the client's --random-range-ratio
GROUP = ("model", "system", "backend")  # simlab's model x GPU x engine


@dataclass(frozen=True)
class Args:
    """The arguments of one estimate."""

    model_path: str
    version: str
    gemm: str | None
    moe: str | None
    isl: int
    osl: int
    ctx_tokens: int


def _slots(p: Point) -> tuple[dict[str, str], list[str]]:
    slots = get_version_slots(p.system, p.backend) or {}
    return slots, sorted(set(slots.values()), key=tables.version_key)


def slot_version(p: Point) -> str:
    """simlab's version if aiconfigurator queries it, else the closest slot above (or below)."""
    wanted = version_for(p) or p.version
    _, ordered = _slots(p)
    if not ordered or wanted in ordered:
        return wanted
    above = [v for v in ordered if tables.version_key(v) >= tables.version_key(wanted)]
    return above[0] if above else ordered[-1]


def aic_version(p: Point) -> str:
    """The upstream comparison's rule: the csv's version if queryable, else ``current``."""
    slots, ordered = _slots(p)
    return p.version if p.version in ordered else slots.get("current", p.version)


def _quant(value: Any) -> str | None:
    return None if pd.isna(value) or not str(value) else str(value)


def args_for(p: Point, row: Any, variant: str) -> Args:
    """The arguments of ``p``'s estimate under ``variant``."""
    path = MODEL_ALIASES.get(p.model, p.model)
    gemm, moe = _quant(row.gemm_quant_mode), _quant(row.moe_quant_mode)
    a = Args(path, slot_version(p), gemm, moe, p.isl, p.osl, p.isl)
    if variant == "aic_version":
        return replace(a, version=aic_version(p))
    if variant == "checkpoint_quant":
        path = FP8_CHECKPOINTS.get(p.model, path) if p.precision == "fp8" else path
        quantized = "quantization_config" in get_model_config_from_model_path(path)["raw_config"]
        return replace(a, model_path=path, gemm=None, moe=None) if quantized else a
    if variant == "token_budget":
        cap = p.isl * max(p.concurrency - 1, 1)
        return replace(a, ctx_tokens=max(p.isl, min(recipe(p).token_budget, cap)))
    if variant == "mean_lengths":
        isl, osl = ((int(RANGE_RATIO * n) + n) // 2 for n in (p.isl, p.osl))
        return replace(a, isl=isl, osl=osl, ctx_tokens=isl)
    return a


def estimate(p: Point, a: Args) -> dict[str, Any]:
    """aiconfigurator's aggregated-serving estimate of ``p`` with ``a`` (raises on failure)."""
    db = get_database_view(p.system, p.backend, a.version, database_mode="SILICON")
    if db is None:
        raise ValueError(f"Failed to load perf database {p.system}/{p.backend}/{a.version}")
    moe_tp = p.tp // p.ep  # the experts over ep GPUs, each split moe_tp ways
    mc = build_model_config(p.tp, 1, 1, moe_tp, p.ep, gemm_quant_mode=a.gemm, moe_quant_mode=a.moe)
    resolve_context_fmha_by_data(mc, a.model_path, db, p.backend, is_context_role=True)
    resolve_dsv4_moe_arch(mc, a.model_path, system_name=p.system, backend_name=p.backend)
    resolve_nvfp4_for_system(mc, p.system, a.model_path)
    model = get_model(a.model_path, mc, p.backend)
    runtime = RuntimeConfig(isl=a.isl, osl=a.osl, batch_size=p.concurrency)
    summary = get_backend(p.backend).run_agg(
        model, db, runtime, ctx_tokens=a.ctx_tokens, decode_tokens_per_iteration=1.0
    )
    if summary.check_oom():
        raise RuntimeError("OOM: weights + activations + KV of the batch exceed GPU memory")
    d = summary.get_result_dict()
    if d is None:  # as cli_estimate
        raise RuntimeError("Estimation produced no results. The configuration may be invalid.")
    sources = {s for ops in (summary.get_per_ops_source() or {}).values() for s in ops.values()}
    return {
        "ttft_ms": float(d["ttft"]),
        "tpot_ms": float(d["tpot"]),
        "kv_cache_oom": bool(summary.check_kv_cache_oom()),
        "quant": {k: d[k] for k in ("gemm", "moe", "kvcache", "fmha", "comm")},
        "non_silicon_sources": sorted(str(s) for s in sources - {"silicon"}),
    }


def reason(err: Exception) -> str:
    """The failure's type and message, paths dropped (the count key)."""
    text = re.sub(r"\s*(at|from \d+ source\(s\) \(first:)\s*/\S+", "", str(err).splitlines()[0])
    return f"{type(err).__name__}: {text.replace('perf database error: ', '')}"[:240]


def run(pts: list[Point], frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Every point under every variant: its estimate or its failure."""
    rows = []
    for i, p in enumerate(pts):
        row = frame.loc[p.id]
        out: dict[str, Any] = asdict(p) | {"version_simlab": version_for(p)}
        for variant in VARIANTS:
            a = args_for(p, row, variant)
            try:
                got: dict[str, Any] = estimate(p, a)
            except Exception as err:  # noqa: BLE001 - a point's failure is a result, counted
                got = {"error": reason(err)}
            out[variant] = asdict(a) | got
        rows.append(out)
        if (i + 1) % 50 == 0:
            log.info("%d / %d points", i + 1, len(pts))
    return rows


def stats(rows: list[dict[str, Any]], variant: str) -> dict[str, Any]:
    """MAPE and median |predicted / measured - 1| of TTFT and TPOT over ``rows``' estimates."""
    ok = [r for r in rows if "error" not in r[variant]]
    out: dict[str, Any] = {"points": len(rows), "estimated": len(ok), "failed": len(rows) - len(ok)}
    for m in ("ttft", "tpot"):
        e = np.array([abs(r[variant][f"{m}_ms"] / r[f"{m}_ms"] - 1) for r in ok])
        out[f"{m}_mape"] = float(e.mean()) if len(e) else None
        out[f"{m}_median"] = float(np.median(e)) if len(e) else None
    return out


def _by(rows: list[dict[str, Any]], variant: str, key: Any) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return {k: stats(v, variant) for k, v in sorted(groups.items())}


def summarise(rows: list[dict[str, Any]], wall_s: float, skipped: dict[str, int]) -> dict[str, Any]:
    """``silicon_peer.json``: per variant overall, per group, per model, per engine, failures."""
    result: dict[str, Any] = {"method": __doc__, "wall_s": wall_s, "skipped_by_simlab": skipped}
    for variant in VARIANTS:
        failures: dict[str, int] = {}
        for r in rows:
            if "error" in r[variant]:
                failures[r[variant]["error"]] = failures.get(r[variant]["error"], 0) + 1
        result[variant] = stats(rows, variant) | {
            "failures": failures,
            "kv_cache_oom_flagged": sum(bool(r[variant].get("kv_cache_oom")) for r in rows),
            "groups": _by(rows, variant, lambda r: " x ".join(r[k] for k in GROUP)),
            "by_model": _by(rows, variant, lambda r: r["model"]),
            "by_engine": _by(rows, variant, lambda r: r["backend"]),
            "by_model_engine": _by(rows, variant, lambda r: f"{r['model']} x {r['backend']}"),
        }
    return result | {"rows": rows}


def simlab_on(rows: list[dict[str, Any]], validation: dict[str, Any]) -> dict[str, Any]:
    """simlab's errors (``python -m simlab.validate silicon``'s ``validation.json``) on each
    variant's estimated points: TTFT and TPOT MAPE (median) held out and in sample, overall,
    by engine and for the hybrid Qwen3.5."""
    mine = {r["id"]: r for r in validation["rows"]}

    def errors(ids: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"points": len(ids)}
        for m in ("ttft", "tpot"):
            for fit in ("held_out", "in_sample"):
                e = np.array([abs(mine[i][f"{m}_ms_{fit}"] / mine[i][f"{m}_ms"] - 1) for i in ids])
                out[f"{m}_mape_{fit}"] = float(e.mean()) if len(e) else None
                out[f"{m}_median_{fit}"] = float(np.median(e)) if len(e) else None
        return out

    result = {}
    for variant in VARIANTS:
        ok = [r for r in rows if "error" not in r[variant] and r["id"] in mine]
        groups = {"overall": [r["id"] for r in ok]}
        for r in ok:
            groups.setdefault(r["backend"], []).append(r["id"])
            if "Qwen3.5" in r["model"]:
                groups.setdefault("hybrid Qwen3.5", []).append(r["id"])
        result[variant] = {k: errors(v) for k, v in groups.items()}
    return result


def write(out: Path, result: dict[str, Any]) -> Path:
    """``out/silicon_peer.json``, written to a temporary file and renamed (atomic)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "silicon_peer.json"
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".silicon_peer.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(result, indent=1) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{100 * x:5.1f}%"


def lines(result: dict[str, Any], variant: str = "primary") -> list[str]:
    """The printed table of ``variant``: MAPE (median) per model x GPU x engine."""
    head = f"{'model x GPU x engine':<52} {'points':>6} {'failed':>6}"
    head += "  TTFT MAPE (median)   TPOT MAPE (median)"
    out = [f"aiconfigurator-core {variant}:", head]
    v = result[variant]
    for key, g in [*v["groups"].items(), *v["by_engine"].items(), ("overall", v)]:
        out.append(
            f"{key:<52} {g['points']:>6} {g['failed']:>6}  "
            f"{_pct(g['ttft_mape'])} ({_pct(g['ttft_median'])})   "
            f"{_pct(g['tpot_mape'])} ({_pct(g['tpot_median'])})"
        )
    out += [f"failed: {n} x {why}" for why, n in v["failures"].items()]
    for other in VARIANTS[1:]:
        o = result[other]
        out.append(
            f"variant {other:<17} estimated {o['estimated']:>4}: TTFT {_pct(o['ttft_mape'])} "
            f"({_pct(o['ttft_median'])}), TPOT {_pct(o['tpot_mape'])} ({_pct(o['tpot_median'])})"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.silicon_peer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, type=Path, help="writes DIR/silicon_peer.json")
    parser.add_argument(
        "--model", default=None, help="only the points of models whose id contains this"
    )
    parser.add_argument("--limit", type=int, default=None, help="the first N points only")
    parser.add_argument(
        "--validation",
        type=Path,
        default=None,
        help="simlab's validation.json (python -m simlab.validate silicon): its errors on the "
        "same points beside the peer's",
    )
    args = parser.parse_args(argv)
    if args.validation is not None and not args.validation.is_file():
        parser.error(f"--validation {args.validation}: no such file")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)  # progress every 50 points
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)  # per-load warnings
    csv = tables.systems_dir()
    if csv is None:
        parser.error("aiconfigurator-core is not installed")
    pts, skipped = points(csv / "silicon_sample.csv")
    pts = [p for p in pts if args.model is None or args.model in p.model]
    pts = pts[: args.limit] if args.limit is not None else pts
    frame = pd.read_csv(csv / "silicon_sample.csv").set_index("id")
    t0 = time.perf_counter()
    rows = run(pts, frame)
    result = summarise(rows, time.perf_counter() - t0, skipped)
    if args.validation is not None:
        result["simlab_on_same_points"] = simlab_on(rows, json.loads(args.validation.read_text()))
    path = write(args.out, result)
    print("\n".join(lines(result)))
    for variant, groups in result.get("simlab_on_same_points", {}).items():
        for key, g in groups.items():
            print(
                f"simlab on {variant}'s {key} ({g['points']}): TTFT held out "
                f"{_pct(g['ttft_mape_held_out'])} ({_pct(g['ttft_median_held_out'])}), in sample "
                f"{_pct(g['ttft_mape_in_sample'])}; TPOT held out {_pct(g['tpot_mape_held_out'])}"
                f" ({_pct(g['tpot_median_held_out'])}), in sample {_pct(g['tpot_mape_in_sample'])}"
            )
    print(f"wall {result['wall_s']:.0f} s; written {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
