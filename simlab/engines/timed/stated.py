"""The stated error of a timed run's latencies: how far the timed engine's TTFT and TPOT were
from NVIDIA's measured serving points on the same engine (``docs/validation/silicon.md``).

``stated_error.json`` beside this module is written by ``python -m simlab.validate state DIR``
from a ``python -m simlab.validate silicon --out DIR`` run: per engine, the mean absolute
relative error of TTFT and TPOT held out (each model's points predicted with the overheads
fitted on the other models'), the points, models and GPUs it covers, and the overheads fitted
on all of them. A run on measured kernels records it as ``summary.json``'s ``latency_error``
with whether its model and GPU were among those points and whether its overheads are the
fitted ones; a run on the roofline alone states none (it was not validated end to end).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

#: the stated errors (``python -m simlab.validate state DIR`` writes it)
STATED = Path(__file__).with_name("stated_error.json")
#: where the errors and their replay are explained
DOCS = "docs/validation/silicon.md"


@functools.cache
def table(path: Path = STATED) -> dict[str, Any] | None:
    """The stated errors (None: no file, as in a checkout that removed it)."""
    return json.loads(path.read_text()) if path.is_file() else None


def stated_error(
    backend: str,
    model: str,
    system: str,
    overheads: tuple[float, float],
    kernels: bool,
    hybrid: bool = False,
) -> dict[str, Any]:
    """``latency_error`` of a run of ``model`` (a ``hybrid`` of attention and recurrent layers,
    or not) on ``system`` with ``backend``'s timed engine at ``overheads`` (s per iteration, s
    per request), on measured ``kernels`` or the roofline."""
    if not kernels:
        return {
            "validated": False,
            "why": f"engine.kernels=roofline: not validated end to end ({DOCS})",
        }
    found = table() or {"engines": {}}
    engine = found["engines"].get(backend)
    if engine is None:
        return {"validated": False, "why": f"no serving point of {backend} was replayed ({DOCS})"}
    fitted = engine["overheads_s"]
    return {
        "validated": True,
        "engine": backend,
        "ttft_mape_held_out": engine["ttft_mape_held_out"],
        "ttft_median_held_out": engine["ttft_median_held_out"],
        "tpot_mape_held_out": engine["tpot_mape_held_out"],
        "points": engine["points"],
        "models": engine["models"],
        "gpus": engine["gpus"],
        "model_among_them": model in engine["models"],
        "gpu_among_them": system in engine["gpus"],
        # a hybrid run on an engine whose points hold no hybrid: its recurrent layers untested
        "hybrid_among_them": not hybrid or bool(engine["hybrid_models"]),
        "fitted_overheads_s": fitted,
        "overheads_as_fitted": (
            abs(overheads[0] - fitted["iteration"]) < 1e-9
            and abs(overheads[1] - fitted["request"]) < 1e-9
        ),
        "this_model_and_gpu": found["groups"].get(f"{model} x {system} x {backend}"),
        "code_version": found["code_version"],
        "docs": DOCS,
    }


#: ``engine.overheads``: the run's own ``engine.costs.iteration_overhead_s`` and
#: ``engine.request_overhead_s``, or those fitted on its engine's serving points
OVERHEADS = ("none", "fitted")


def fitted_overheads(backend: str, kernels: str, set_s: tuple[float, float]) -> tuple[float, float]:
    """``engine.overheads=fitted``: the seconds an iteration and a request fitted on
    ``backend``'s serving points (in sample, all models), for a run on measured ``kernels``
    whose own overheads ``set_s`` are left at 0; else a ``ValueError`` naming the key."""
    if kernels != "measured":
        raise ValueError(
            f"engine.overheads=fitted: the overheads were fitted on measured kernels, not "
            f"engine.kernels={kernels}; set engine.overheads=none"
        )
    for key, value in zip(("costs.iteration_overhead_s", "request_overhead_s"), set_s, strict=True):
        if value:
            raise ValueError(
                f"engine.overheads=fitted sets engine.{key}, which is {value:g} here: leave it "
                "at 0, or set engine.overheads=none"
            )
    engine = (table() or {"engines": {}})["engines"].get(backend)
    if engine is None:
        raise ValueError(
            f"engine.overheads=fitted: no serving point of {backend} was replayed, so none "
            f"were fitted ({DOCS}); set engine.overheads=none"
        )
    fitted = engine["overheads_s"]
    return float(fitted["iteration"]), float(fitted["request"])


def line(error: dict[str, Any]) -> str:
    """``error`` (:func:`stated_error`) in one line."""
    if not error.get("validated"):
        return f"latency error not stated: {error['why']}"
    short = [m.split("/")[-1] for m in error["models"]]
    fitted = error["fitted_overheads_s"]
    outside = [
        what
        for what, among in (("model", error["model_among_them"]), ("GPU", error["gpu_among_them"]))
        if not among
    ]
    return (
        f"stated latency error ({error['engine']}): TTFT {100 * error['ttft_mape_held_out']:.0f}% "
        f"MAPE held out (median {100 * error['ttft_median_held_out']:.0f}%), TPOT "
        f"{100 * error['tpot_mape_held_out']:.0f}%, on {error['points']} measured serving points "
        f"({', '.join(short)} on {', '.join(error['gpus'])})"
        + (f"; this run's {' and '.join(outside)} not among them" if outside else "")
        + ("" if error["hybrid_among_them"] else ", nor any hybrid model")
        + (
            f"; on this model and GPU, {100 * group['ttft_mape_held_out']:.0f}% and "
            f"{100 * group['tpot_mape_held_out']:.0f}% ({group['points']} points)"
            if (group := error.get("this_model_and_gpu"))
            else ""
        )
        + (
            ""
            if error["overheads_as_fitted"]
            else f"; the overheads fitted on them are {fitted['iteration']:g} s an iteration and "
            f"{fitted['request']:g} s a request, not this run's (engine.overheads=fitted applies "
            "them)"
        )
        + f" ({error['docs']})"
    )


def lines(policies: dict[str, dict[str, Any]]) -> list[str]:
    """The :func:`line` of each policy's ``latency_error`` (``summary.json``'s), once each."""
    found = [p["latency_error"] for p in policies.values() if p.get("latency_error")]
    return list(dict.fromkeys(line(error) for error in found))
