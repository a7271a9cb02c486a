"""The overheads no kernel measures, fitted to the silicon points with leave-one-model-out
cross-validation, and ``validation.json``'s summary of the errors.

Per backend: the engine's CPU time per iteration (``engine.costs.iteration_overhead_s``) and a
fixed time per request on its TTFT (the API server, tokenisation, the first scheduling; not in
the timed engine, added here). Each point was simulated at two overheads (0 and
:data:`~simlab.experiments.silicon.PROBE_S`); its TTFT and TPOT are taken as linear in the
overhead between them (an iteration's overhead adds once to each of its requests' waits), and
the overheads minimising the mean absolute relative error of TTFT and TPOT are found on the
points of every other model (leave one model out) and applied to the held-out model's points; in
sample, on all of them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import numpy as np

from simlab.experiments.silicon import PROBE_S, Point, pool_of, spec_of, version_for
from simlab.experiments.silicon_recipes import recipe

log = logging.getLogger(__name__)

#: the overheads searched: seconds per iteration, seconds per request (on its TTFT)
GRID_S = np.linspace(0.0, 0.03, 61)
REQUEST_GRID_S = np.linspace(0.0, 1.0, 201)


def errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted / measured - 1)


Overheads = tuple[float, float]  # (seconds per iteration, seconds per request)


def at(sims: np.ndarray, overheads: Overheads) -> np.ndarray:
    """Each point's (TTFT, TPOT) in ms at ``overheads``: linear in the iteration's between its
    two simulations (``sims[:, 0]`` at 0, ``sims[:, 1]`` at :data:`PROBE_S`; points x 2 x 2),
    plus the per-request one on the TTFT."""
    iteration_s, request_s = overheads
    out = sims[:, 0] + (sims[:, 1] - sims[:, 0]) * (iteration_s / PROBE_S)
    return out + np.array([1e3 * request_s, 0.0])


def fit(sims: np.ndarray, measured: np.ndarray) -> Overheads:
    """The overheads of :data:`GRID_S` x :data:`REQUEST_GRID_S` minimising the mean relative
    error of TTFT and TPOT."""
    grid = [(o, r) for o in GRID_S for r in REQUEST_GRID_S]
    losses = [float(np.mean(errors(at(sims, pair), measured))) for pair in grid]
    o, r = grid[int(np.argmin(losses))]
    return float(o), float(r)


def folds(models: set[str]) -> dict[str, str]:
    """Each model's held-out fold: the models of one architecture (their specs equal but for
    the name) leave together, named ``A + B``. DeepSeek-V3 and DeepSeek-R1 are one: the csv
    gives 62 of V3's 76 points the very measurements of R1's, so holding out one while
    fitting on the other would test it on what it was fitted to."""
    shapes: dict[str, list[str]] = {}
    for model in sorted(models):
        spec = spec_of(model, 1)
        key = model if spec is None else repr(dataclasses.replace(spec, name="", source=""))
        shapes.setdefault(key, []).append(model)
    return {model: " + ".join(same) for same in shapes.values() for model in same}


def cross_validate(pts: list[Point], sims: np.ndarray) -> dict[str, Any]:
    """Per backend, the overheads fitted on every other model's points (held out) and on all
    (in sample), each point's predictions, and the errors."""
    measured = np.array([[p.ttft_ms, p.tpot_ms] for p in pts])
    held, inside = np.zeros_like(measured), np.zeros_like(measured)
    fitted: dict[str, dict[str, Overheads]] = {}
    for backend in sorted({p.backend for p in pts}):
        mine = np.array([p.backend == backend for p in pts])
        fitted[backend] = {"in_sample": fit(sims[mine], measured[mine])}
        inside[mine] = at(sims[mine], fitted[backend]["in_sample"])
        fold = folds({p.model for p in pts if p.backend == backend})
        for left_out in sorted(set(fold.values())):
            test = mine & np.array([fold.get(p.model) == left_out for p in pts])
            train = mine & ~test
            pair = fit(sims[train], measured[train]) if train.any() else (0.0, 0.0)
            fitted[backend][f"without {left_out}"] = pair
            held[test] = at(sims[test], pair)
    return {
        "measured": measured,
        "held_out": held,
        "in_sample": inside,
        "own_group": own_group(pts, sims, measured),
        "overheads": fitted,
        "sims": sims,
    }


def own_group(pts: list[Point], sims: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Each point's times at the overheads fitted on its own model x GPU x engine group's
    points: an oracle no prediction has (it sees the group it is scored on), so its error is a
    floor under any fit of these two overheads -- what they cannot explain."""
    out = np.zeros_like(measured)
    for key in {(p.model, p.system, p.backend) for p in pts}:
        mask = np.array([(p.model, p.system, p.backend) == key for p in pts])
        out[mask] = at(sims[mask], fit(sims[mask], measured[mask]))
    return out


def distinct(pts: list[Point]) -> list[int]:
    """The index of each measurement's first point: the csv gives some measurements several
    rows (the same model -- by its fold, :func:`folds` --, GPU, engine, precision, TP,
    concurrency and lengths, and the same TTFT and TPOT to nine digits), one per dump file it
    came in."""
    fold = folds({p.model for p in pts})
    seen: dict[tuple[object, ...], int] = {}
    for i, p in enumerate(pts):
        shape = (p.system, p.backend, p.precision, p.tp, p.concurrency, p.isl, p.osl)
        same = (f"{p.ttft_ms:.9g}", f"{p.tpot_ms:.9g}")  # the dumps differ in the last digit
        seen.setdefault((fold[p.model], *shape, *same), i)
    return sorted(seen.values())


def summary(pts: list[Point], cv: dict[str, Any]) -> dict[str, Any]:
    """``validation.json``: overall MAPEs (fractions), the same over each measurement once
    (``distinct``: :func:`distinct`), per model x GPU x engine, and rows."""
    m, held, inside = cv["measured"], cv["held_out"], cv["in_sample"]
    eh, ei, eo = errors(held, m), errors(inside, m), errors(cv["own_group"], m)
    groups = {}
    for key in sorted({(p.model, p.system, p.backend) for p in pts}):
        mask = np.array([(p.model, p.system, p.backend) == key for p in pts])
        groups[" x ".join(key)] = {
            "points": int(mask.sum()),
            "ttft_mape_held_out": float(eh[mask, 0].mean()),
            "ttft_median_held_out": float(np.median(eh[mask, 0])),
            "tpot_mape_held_out": float(eh[mask, 1].mean()),
            "ttft_mape_in_sample": float(ei[mask, 0].mean()),
            "tpot_mape_in_sample": float(ei[mask, 1].mean()),
        }
    rows = [
        p.__dict__
        | {"version_used": version_for(p)}  # the measured version closest to the one it ran
        | {"recipe": recipe(p).source}  # the InferenceX script its flags come from
        | {"kv_cache": {1: "fp8", 2: "bf16"}[recipe(p).kv_dtype_bytes]}
        | {"kv_pool": None if (pool := pool_of(p)) is None else pool.row()}
        | {"ttft_ms_held_out": float(h[0]), "tpot_ms_held_out": float(h[1])}
        | {"ttft_ms_in_sample": float(i[0]), "tpot_ms_in_sample": float(i[1])}
        | {"simulated_ms": sim.tolist()}  # (TTFT, TPOT) at iteration overhead 0 and PROBE_S
        for p, h, i, sim in zip(pts, held, inside, cv["sims"], strict=True)
    ]
    first = distinct(pts)
    unsized = sum(row["kv_pool"] is None for row in rows)
    if unsized:
        log.warning(
            "%d of %d points ran with memory unconstrained: aiconfigurator-core's memory model "
            "could not size their KV pool (validation.json rows with a null kv_pool)",
            unsized,
            len(rows),
        )
    return {
        "ttft_mape_held_out": float(eh[:, 0].mean()),
        "tpot_mape_held_out": float(eh[:, 1].mean()),
        "ttft_mape_in_sample": float(ei[:, 0].mean()),
        "tpot_mape_in_sample": float(ei[:, 1].mean()),
        # each group's own overheads, fitted on the points scored (:func:`own_group`): a floor
        "own_group_overheads": {
            "ttft_mape": float(eo[:, 0].mean()),
            "tpot_mape": float(eo[:, 1].mean()),
        },
        "overheads_s": cv["overheads"],
        "distinct": {  # each measurement once: the csv repeats some from several dump files
            "points": len(first),
            "ttft_mape_held_out": float(eh[first, 0].mean()),
            "tpot_mape_held_out": float(eh[first, 1].mean()),
            "ttft_mape_in_sample": float(ei[first, 0].mean()),
            "tpot_mape_in_sample": float(ei[first, 1].mean()),
        },
        "kv_pools": {"sized": len(rows) - unsized, "unconstrained": unsized},
        "groups": groups,
        "engines": by_engine(rows, cv["overheads"]),
        "rows": rows,
    }


def by_engine(rows: list[dict[str, Any]], overheads: dict[str, Any]) -> dict[str, Any]:
    """Per engine, the errors of its points (``validation.json``'s rows) and what they cover:
    the stated latency error of a timed run on that engine (:mod:`simlab.engines.timed.stated`),
    with the overheads fitted on all its points (in sample), which the held-out errors assume."""
    out: dict[str, Any] = {}
    for backend in sorted({row["backend"] for row in rows}):
        mine = [row for row in rows if row["backend"] == backend]
        measured = np.array([[r["ttft_ms"], r["tpot_ms"]] for r in mine])
        held = errors(
            np.array([[r["ttft_ms_held_out"], r["tpot_ms_held_out"]] for r in mine]), measured
        )
        inside = errors(
            np.array([[r["ttft_ms_in_sample"], r["tpot_ms_in_sample"]] for r in mine]), measured
        )
        models = sorted({r["model"] for r in mine})
        specs = {m: spec_of(m, 1) for m in models}
        iteration_s, request_s = overheads[backend]["in_sample"]
        out[backend] = {
            "points": len(mine),
            "ttft_mape_held_out": float(held[:, 0].mean()),
            "ttft_median_held_out": float(np.median(held[:, 0])),
            "tpot_mape_held_out": float(held[:, 1].mean()),
            "ttft_mape_in_sample": float(inside[:, 0].mean()),
            "tpot_mape_in_sample": float(inside[:, 1].mean()),
            "models": models,
            "hybrid_models": [
                m for m in models if (spec := specs[m]) is not None and spec.is_hybrid
            ],
            "gpus": sorted({r["system"] for r in mine}),
            "overheads_s": {"iteration": iteration_s, "request": request_s},
        }
    return out


def lines(result: dict[str, Any]) -> list[str]:
    """The printed table: MAPE and median error per model x GPU x engine."""
    out = [
        f"{'model x GPU x engine':<52} {'points':>6}  TTFT MAPE held-out (median) / in-sample"
        "   TPOT MAPE held-out / in-sample"
    ]
    for key, g in result["groups"].items():
        out.append(
            f"{key:<52} {g['points']:>6}  {100 * g['ttft_mape_held_out']:6.1f}% "
            f"({100 * g['ttft_median_held_out']:5.1f}%) / {100 * g['ttft_mape_in_sample']:5.1f}%"
            f"      {100 * g['tpot_mape_held_out']:6.1f}% / {100 * g['tpot_mape_in_sample']:5.1f}%"
        )
    out.append(
        f"overall: TTFT MAPE {100 * result['ttft_mape_held_out']:.1f}% held out, "
        f"{100 * result['ttft_mape_in_sample']:.1f}% in sample; TPOT "
        f"{100 * result['tpot_mape_held_out']:.1f}% / {100 * result['tpot_mape_in_sample']:.1f}%"
    )
    own = result["own_group_overheads"]
    out.append(
        f"with each group's own overheads, fitted on the points scored (a floor, not a "
        f"prediction): TTFT {100 * own['ttft_mape']:.1f}%, TPOT {100 * own['tpot_mape']:.1f}%"
    )
    once = result["distinct"]
    out.append(
        f"each measurement once ({once['points']} of {len(result['rows'])} points; the csv "
        f"repeats the others): TTFT {100 * once['ttft_mape_held_out']:.1f}% held out, "
        f"{100 * once['ttft_mape_in_sample']:.1f}% in sample; TPOT "
        f"{100 * once['tpot_mape_held_out']:.1f}% / {100 * once['tpot_mape_in_sample']:.1f}%"
    )
    out += [
        f"{backend}: TTFT MAPE {100 * e['ttft_mape_held_out']:.1f}% held out "
        f"({e['points']} points), TPOT {100 * e['tpot_mape_held_out']:.1f}%"
        for backend, e in result["engines"].items()
    ]
    out.append("overheads (s per iteration, s per request): " + json.dumps(result["overheads_s"]))
    return out
