"""Measured shapes: the ``profiles`` section of a calibration file (numpy and scipy, no ``torch``).

A profile is one (op, layer shape, tensor-parallel degree) series of measured unit times
(:class:`simlab.cost.profiles.Profile`); the cost model times an op of that shape from it. Both
calibration paths write the section from their op records: :mod:`gpu_validate.vidur` (Vidur's
A100/H100 Llama profiles) and :mod:`gpu_validate.fit` (the harness's own GPU runs, TP 1). A
record here is a dict with ``op_name``, ``op_class``, ``shape`` and ``units`` (the cost model's
``Op.shape`` / ``Op.units``), ``tp``, ``tokens``, ``median_s`` and ``model``.

Held-back error: alternate token counts of each series are fitted, the others checked, every
measurement of one count on the same side (:func:`split_profiles`), each held-back record timed
exactly as the cost model times the op (:func:`profiled_errors`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from simlab.cost.profiles import PROFILED_OPS, Profile

WHAT = (
    "measured seconds of one unit (a layer's GEMM; a norm + residual add; one all-reduce call) "
    "per token count (the all-reduce: per message bytes), per (op, shape, tp); simlab times the "
    "ops they match from them"
)
BETWEEN = (
    "linear in (log tokens, log seconds); above the last count: proportional to the tokens; "
    "below the first: the first; the measured seconds made non-decreasing in the tokens "
    "(least-absolute-deviation isotonic regression in log seconds, weighted by repeats)"
)
SPLIT = "alternate token counts per (op, shape, tp): even ranks fitted, odd held back"


def profiled(records: Sequence[dict]) -> list[dict]:
    """The records a profile can hold: ops of :data:`~simlab.cost.profiles.PROFILED_OPS` with a
    shape (``units`` > 0) and a measured time."""
    return [
        r
        for r in records
        if r["op_name"] in PROFILED_OPS and r.get("units") and "shape" in r and r["median_s"] > 0
    ]


def series_of(records: Sequence[dict]) -> dict[tuple, list[dict]]:
    """Records per (op, shape, tp): a profile's key (two models with the same layer shape share
    one series)."""
    out: dict[tuple, list[dict]] = {}
    for r in records:
        out.setdefault((r["op_name"], tuple(r["shape"]), int(r["tp"])), []).append(r)
    return out


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The lower weighted median: the smallest value whose cumulative weight (values sorted)
    reaches half the total."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(np.asarray(weights, dtype=float)[order])
    return float(
        np.asarray(values, dtype=float)[order][np.searchsorted(cumulative, cumulative[-1] / 2)]
    )


def median_isotonic(values: Sequence[float], weights: Sequence[float]) -> np.ndarray:
    """The non-decreasing sequence nearest ``values`` in weighted absolute deviation
    (``sum w |fit - value|`` minimal): pool adjacent violators, each pooled block at its
    weighted median. scipy's ``isotonic_regression`` minimises squares instead, which puts a
    block of bimodal measurements between its two modes, where neither lies."""
    blocks: list[tuple[list[float], list[float], float]] = []  # values, weights, level
    for value, weight in zip(values, weights, strict=True):
        block = ([float(value)], [float(weight)], float(value))
        while blocks and blocks[-1][2] > block[2]:
            prev = blocks.pop()
            merged_values, merged_weights = prev[0] + block[0], prev[1] + block[1]
            block = (merged_values, merged_weights, weighted_median(merged_values, merged_weights))
        blocks.append(block)
    return np.array([level for vals, _, level in blocks for _ in vals])


def profile_of(rows: Sequence[dict]) -> Profile:
    """One series' unit times: seconds per unit (``units``: one for a layer's GEMM, two norm +
    residual units per decoder layer) at each token count, repeats averaged in log, then made
    non-decreasing in the tokens by :func:`median_isotonic` in log seconds (weighted by
    repeats). Invariant: more tokens (a bigger message) never take less time. Vidur's small
    all-reduce times are bimodal (H100, TP 2: 41 us at 16 tokens, 8 us at 32), and interpolated
    as measured they made a longer prompt, or a cache hit, predict less time than a shorter
    one; a least-squares fit sat between the modes, off both (all-reduce held-back P90 13.8% on
    A100 and 11.8% on H100, against 12.2% and 6.8% with the median)."""
    logs: dict[int, list[float]] = {}
    for r in rows:
        logs.setdefault(int(r["tokens"]), []).append(math.log(r["median_s"] / r["units"]))
    tokens = sorted(logs)
    means = [float(np.mean(logs[t])) for t in tokens]
    weights = [float(len(logs[t])) for t in tokens]
    level = median_isotonic(means, weights)
    return Profile(tuple(float(t) for t in tokens), tuple(float(v) for v in np.exp(level)))


def series_json(records: Sequence[dict]) -> list[dict[str, Any]]:
    """``profiles.series`` (:meth:`simlab.cost.calibration.Calibration.load`) from ``records``."""
    out = []
    for (op, shape, tp), rows in sorted(series_of(records).items()):
        profile = profile_of(rows)
        out.append(
            {
                "op": op,
                "shape": list(shape),
                "tp": tp,
                "models": sorted({str(r["model"]) for r in rows}),
                "tokens": [int(t) for t in profile.tokens],
                "seconds": list(profile.seconds),
            }
        )
    return out


def split_profiles(records: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """Alternate token counts of each (op, shape, tp) series: even ranks fitted, odd held back,
    every measurement of one count on the same side (no held-back count is also measured in the
    fitted half, by another model of the same shape)."""
    train: list[dict] = []
    test: list[dict] = []
    for rows in series_of(records).values():
        rank = {t: i for i, t in enumerate(sorted({int(r["tokens"]) for r in rows}))}
        for r in rows:
            (train if rank[int(r["tokens"])] % 2 == 0 else test).append(r)
    return train, test


def profiled_errors(train: Sequence[dict], test: Sequence[dict]) -> list[dict]:
    """Each ``test`` record with ``rel_err``: timed as the cost model times a profiled op
    (``units x Profile.at(tokens)``), the profile built from ``train`` records of its series."""
    profiles = {key: profile_of(rows) for key, rows in series_of(train).items()}
    out = []
    for r in test:
        profile = profiles[(r["op_name"], tuple(r["shape"]), int(r["tp"]))]
        pred = profile.at(r["tokens"]) * r["units"]
        out.append(r | {"rel_err": pred / r["median_s"] - 1.0})
    return out


def median_p90(errors: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Median and P90 of |relative error| per op class."""
    by_class: dict[str, list[float]] = {}
    for r in errors:
        by_class.setdefault(str(r["op_class"]), []).append(abs(r["rel_err"]))
    return {
        cls: {"median": float(np.median(e)), "p90": float(np.quantile(e, 0.9))}
        for cls, e in sorted(by_class.items())
    }


def section(records: Sequence[dict], source: str) -> dict[str, Any]:
    """The calibration file's ``profiles``: what they are, the held-back error per op class
    (empty when a series has a single token count: nothing to hold back) and the series built
    from every record."""
    records = profiled(records)
    train, test = split_profiles(records)
    fitted = series_of(train)
    test = [r for r in test if (r["op_name"], tuple(r["shape"]), int(r["tp"])) in fitted]
    return {
        "what": WHAT,
        "source": source,
        "between": BETWEEN,
        "split": SPLIT,
        "held_back_error": median_p90(profiled_errors(train, test)),
        "series": series_json(records),
    }


def dumps(result: dict[str, Any], sort_keys: bool = False) -> str:
    """A calibration file's text: indented JSON, each profile's token and seconds lists on one
    line (thousands of numbers), the seconds to 6 significant digits (far below the
    measurements' own spread)."""
    flat, series = {}, []
    for i, entry in enumerate(result.get("profiles", {}).get("series", [])):
        entry = dict(entry)
        for key in ("tokens", "seconds"):
            marker = f"@{key}{i}@"
            values = entry[key] if key == "tokens" else [float(f"{v:.6g}") for v in entry[key]]
            flat[json.dumps(marker)] = json.dumps(values)
            entry[key] = marker
        series.append(entry)
    if series:
        result = result | {"profiles": result["profiles"] | {"series": series}}
    text = json.dumps(result, indent=1, sort_keys=sort_keys)
    for marker, values in flat.items():
        text = text.replace(marker, values)
    return text
