"""Captions: one or two lines on every page saying what was run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simlab.cost.calibration import Calibration, resolve_calibration
from simlab.cost.hardware import Hardware
from simlab.cost.measured.sources import SOURCES
from simlab.cost.model import CostModel
from simlab.cost.shapes import BatchShape
from simlab.cost.terms import CostTerms
from simlab.engines.timed import stated
from simlab.model.spec import ModelSpec
from simlab.report.load import RunResults, SweepResults
from simlab.report.style import fmt_value
from simlab.run.summary import alpha_label


def trace_label(config: dict[str, Any], trace: dict[str, Any] | None = None) -> str:
    tcfg = config.get("trace") or {}
    name = tcfg.get("name") or (trace or {}).get("name") or "?"
    opts = [
        f"{k} {fmt_value(v)}"
        for k, v in tcfg.items()
        if not k.startswith("_") and k != "name" and v is not None
    ]
    label = f"trace {name}" + (f" ({', '.join(opts)})" if opts else "")
    if trace and "requests" in trace:
        label += f": {trace['requests']} requests, {trace.get('sessions', '?')} sessions"
    return label


def engine_label(config: dict[str, Any]) -> str:
    """The engine a run used: ``engine.name`` (``engine.kind`` in results before engines were
    objects), ``?`` when unknown."""
    engine = config.get("engine") or {}
    return str(engine.get("name", engine.get("kind", "?")))


def hardware_label(config: dict[str, Any]) -> str:
    """`` on <GPU> x tp N`` for an engine that times requests on a GPU; empty for a replay."""
    engine = config.get("engine") or {}
    hardware = engine.get("hardware") or {}
    if not isinstance(hardware, dict) or "name" not in hardware:
        return ""
    tp, ep = engine.get("tp", 1), engine.get("ep", 1)
    experts = f" (experts: ep {ep})" if ep and ep != 1 else ""
    return f" on {hardware['name']}" + (f" x tp {tp}" if tp and tp != 1 else "") + experts


def cache_label(config: dict[str, Any]) -> str:
    cache = config.get("cache") or {}
    size = cache.get("size_gb", "?")
    if _numeric(size) and math.isinf(float(size)):
        text = "cache unbounded (size_gb inf)"
    else:
        text = f"cache {fmt_value(float(size)) if _numeric(size) else size} GB"
    page = cache.get("page_size", 1)
    return text + (f", page {page} tokens" if page not in (1, None) else "")


def _numeric(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def run_parts(config: dict[str, Any], trace: dict[str, Any] | None) -> list[str]:
    arrivals = config.get("arrivals") or {}
    parts = [
        trace_label(config, trace),
        f"model {(config.get('model') or {}).get('name', '?')}",
        cache_label(config),
        f"engine {engine_label(config)}{hardware_label(config)}",
        f"seed {config.get('seed', '?')}",
    ]
    if arrivals:
        parts.append(
            f"arrivals {arrivals.get('mode', '?')} {fmt_value(arrivals.get('session_rate', '?'))} "
            f"sessions/s, think {fmt_value(arrivals.get('think_time_mean', '?'))} s"
        )
    return parts


def policy_label(name: str, summary: dict[str, Any]) -> str:
    """A policy's name, with its alpha when it was tuned (``marconi (alpha 0.0 (untuned))``)."""
    alpha = summary.get("alpha")
    return f"{name} (alpha {alpha_label(alpha)})" if isinstance(alpha, dict) else name


def run_caption(run: RunResults) -> str:
    summaries = run.summary["policies"]
    names = ", ".join(policy_label(p, summaries.get(p, {})) for p in run.policies)
    parts = [*run_parts(run.config, run.trace), f"policies {names}"]
    return "Run: " + " | ".join(parts) + f"\nResults: {run.path}"


def sweep_caption(sweep: SweepResults) -> str:
    swept = [f"{k} in {{{', '.join(swept_values(sweep, k))}}}" for k in sweep.swept_keys]
    swept += [f"{k}={fmt_value(v)} (fixed)" for k, v in sweep.fixed.items()]
    base = run_parts(sweep.base.config, None)
    parts = [f"{len(sweep.point_ids)} points", f"swept {'; '.join(swept) or 'nothing'}"]
    text = "Sweep: " + " | ".join(parts) + "\nBase (point 0 values for swept keys): "
    text += " | ".join(base) + f" | policies {', '.join(sweep.policies)}"
    return text + f"\nResults: {sweep.path}"


def swept_values(sweep: SweepResults, key: str) -> list[str]:
    return [fmt_value(v) for v in unique_in_order(sweep.points[key])]


def unique_in_order(values: Sequence[Any]) -> list[Any]:
    """Distinct values, numbers ascending (inf last), others in first-seen order."""
    seen = list(dict.fromkeys(values))
    if all(_numeric(v) and not isinstance(v, str) for v in seen):
        return sorted(seen, key=float)
    return seen


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """``cache.size_gb`` -> ``size_gb`` unless two keys would share a short name."""
    short = {k: k.rsplit(".", 1)[-1] for k in keys}
    clashes = {s for s in short.values() if list(short.values()).count(s) > 1}
    return {k: (k if s in clashes else s) for k, s in short.items()}


def point_label(values: dict[str, Any], sep: str = "\n") -> str:
    names = short_names(list(values))
    return sep.join(f"{names[k]}={fmt_value(v)}" for k, v in values.items()) or "point"


def results_dir_name(path: Path) -> str:
    return path.resolve().name


#: the calibration note's last clause
NOT_VALIDATED = "; whole-model TTFT not validated against a measured table"


def cost_model_note(config: dict[str, Any]) -> str:
    """What the TTFTs of a timed run rest on, so nobody reads them as measured: the calibration
    file and its own held-back per-op error (median / P90 per op class), or a warning that the
    roofline ran on uncalibrated default efficiencies. Empty for an engine without time."""
    engine = config.get("engine") or {}
    if not isinstance(engine.get("hardware"), dict):
        return ""
    note = _calibration_note(config)
    for key in ("engine_overheads", "engine_defaults"):
        if config.get(key):
            note += f"; {config[key]}"
    if pool := config.get("engine_pool"):  # cache.size_gb=engine
        note += (
            f"; KV pool {pool['kv_pool_gb']:g} GB as {engine.get('backend')} sizes it "
            f"({pool['kv_pool_tokens']:,} tokens, memory fraction {pool['memory_fraction']:g})"
        )
    if engine.get("kernels") == "measured" and engine["hardware"].get("system"):
        # the whole model's latencies are validated: latency_error_note states how well
        note = note.replace(NOT_VALIDATED, "")
        return note.replace(
            "Cost model: ", "Cost model: measured kernels first; ops without one: ", 1
        )
    return note


def latency_error_note(policies: dict[str, dict[str, Any]]) -> str:
    """The stated error of a timed run's latencies (``summary.json``'s ``latency_error``), once
    per engine; empty for a run without one."""
    return " ".join(stated.lines(policies))


def _calibration_note(config: dict[str, Any]) -> str:
    """:func:`cost_model_note`'s sentence on the calibration."""
    engine = config["engine"]
    path = engine.get("calibration")
    if not path:
        return (
            "Cost model: roofline on default efficiencies (engine.calibration=null), not "
            "validated against measurements: TTFTs are model estimates"
        )
    try:
        calibration = Calibration.load(resolve_calibration(path))
    except ValueError as err:
        return f"Cost model: calibration {path} (not readable now: {err})"
    measured = ""
    if calibration.profiles and engine.get("profiles", True):
        share = measured_share(config, calibration)
        measured = (
            f"; ops of a measured shape timed from the measurements ("
            f"{_errors(calibration.profiled_held_back_error) or 'error not recorded'})"
            + (f", {100 * share:.0f}% of a {NOTE_PREFILL:,}-token prefill" if share else "")
        )
    return (
        f"Cost model: calibration {Path(path).name}; held-back per-op error median/P90: "
        f"{_errors(calibration.held_back_error) or 'not recorded'}{measured}; other op classes "
        f"(attention, SSM scans) on defaults{NOT_VALIDATED}"
    )


def time_sources_note(config: dict[str, Any], policies: dict[str, dict[str, Any]]) -> str:
    """Where a timed run's simulated GPU time came from (``summary.json``'s ``time_sources``,
    mean over the policies): measured kernels, interpolated between them, or the roofline, and
    each fused-MoE shape or kernel its tables lack (``kernels.moe_versions``, ``moe_shapes``,
    ``moe_kernels``), a non-gated model's rows (``moe_gating``), each delta-rule kernel lent
    (``delta_rule_lent``) and each attention width (``head_widths``).
    Empty for a run without measured kernels."""
    shares = [p["time_sources"] for p in policies.values() if p.get("time_sources")]
    if not shares:
        return ""
    engine = config.get("engine") or {}
    system = (engine.get("hardware") or {}).get("system")
    version = engine.get("backend_version") or "newest measured"
    mean = {tag: sum(s.get(tag, 0.0) for s in shares) / len(shares) for tag in SOURCES}
    parts = ", ".join(f"{100 * v:.0f}% {tag}" for tag, v in mean.items())
    lent = {
        f"{shape}{how}{whence}"
        for p in policies.values()
        for key, how in (
            ("moe_versions", " from the table of "),
            ("moe_shapes", " timed from "),
            ("moe_kernels", " its kernel from "),
            ("moe_gating", ": "),
        )
        for shape, whence in ((p.get("kernels") or {}).get(key) or {}).items()
    }
    lent_note = "".join(f"; fused MoE {line}" for line in sorted(lent))
    delta = {
        f"{kernel} {prefix}{lent}"
        for p in policies.values()
        for key, prefix in (("delta_rule_lent", "from "), ("head_widths", ""))
        for kernel, lent in ((p.get("kernels") or {}).get(key) or {}).items()
    }
    lent_note += "".join(f"; {line}" for line in sorted(delta))
    kv = sorted(
        {str((p.get("kernels") or {}).get("kv_cache_dtype", "bf16")) for p in policies.values()}
    )
    return (
        f"Kernel times: {engine.get('backend')} ({version}) kernels measured on {system}, "
        f"KV cache {'/'.join(kv)}; "
        f"simulated GPU time {parts} (summary.json time_sources){lent_note}; unmeasured ops (SSM "
        "scans, state copies, cached-prefix attention) modelled, docs/guides/latency.md"
    )


#: the prompt length at which the note gives the share of the predicted time that is measured
NOTE_PREFILL = 4096


def measured_share(config: dict[str, Any], calibration: Calibration) -> float:
    """The share of a :data:`NOTE_PREFILL`-token prefill's predicted time that the run's cost
    model takes from measurements (0 when the run's model or costs cannot be rebuilt)."""
    engine = config["engine"]
    try:
        cost = CostModel(
            ModelSpec.from_config(config["model"]),
            Hardware.from_config(engine["hardware"]),
            calibration,
            int(engine.get("tp", 1)),
            CostTerms.from_config(engine.get("costs")),
        )
    except (KeyError, TypeError, ValueError):
        return 0.0
    return cost.measured_share(BatchShape(prefill=[(0, NOTE_PREFILL)]))


def _errors(errors: dict[str, Any]) -> str:
    """``class median/P90%, ...`` of a held-back error table."""
    return ", ".join(
        f"{cls} {100 * e['median']:.0f}/{100 * e['p90']:.0f}%"
        for cls, e in errors.items()
        if isinstance(e, dict) and {"median", "p90"} <= set(e)
    )
