"""What a run reports: per-policy summaries, the bounds, the trace, and the table printed at the end."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simlab.engines.records import Columns, as_frame
from simlab.engines.timed import stated
from simlab.util.provenance import provenance
from traces.describe import input_tokens as trace_input_tokens
from traces.format import Trace

if TYPE_CHECKING:
    import pandas as pd

SUMMARY_COLUMNS = {
    "token_hit_rate": "token hit",
    "request_hit_rate": "req hit",
    "flops_saved_ratio": "FLOPs saved",
    "peak_kv_gb": "peak KV GB",
    "peak_ssm_gb": "peak SSM GB",
    "peak_gb": "peak total GB",  # KV and SSM peak at different times: not their sum
}
TIMED_COLUMNS = {
    "ttft_p5": "TTFT p5 s",
    "ttft_p50": "TTFT p50 s",
    "ttft_p95": "TTFT p95 s",
    "throughput_rps": "served req/s",
    "gpu_busy_frac": "GPU busy",
    "load": "load",  # the verdict: ok, queueing or saturated (simlab.engines.timed.load)
}


@dataclass
class Summary:
    """Per-policy results of one run plus what was run."""

    policies: dict[str, dict[str, Any]]
    trace: dict[str, Any]
    config: dict[str, Any]
    bounds: dict[str, float] = field(default_factory=dict)
    out_dir: Path | None = None
    record_columns: Columns = field(default_factory=dict, repr=False)
    #: per policy, the route that computed it and why faster ones were refused
    #: (:class:`simlab.run.routes.Route`)
    routes: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def records(self) -> pd.DataFrame:
        """The run's records as a DataFrame (``records.parquet``'s; built on each call)."""
        return as_frame(self.record_columns)

    def table(self) -> str:
        columns = dict(SUMMARY_COLUMNS)
        if "clairvoyant" in self.bounds:
            columns["hit_vs_clairvoyant"] = "of clairvoyant"
        if any("ttft_p50" in p for p in self.policies.values()):
            columns |= TIMED_COLUMNS
        rules = {p.get("request_hit_rule") for p in self.policies.values()} - {None}
        if len(rules) == 1:
            columns["request_hit_rate"] = f"req hit ({rules.pop()})"
        rows = [[p.get(key, math.nan) for key in columns] for p in self.policies.values()]
        headers = list(columns.values())
        if any("alpha" in p for p in self.policies.values()):
            headers.append("alpha")
            for row, p in zip(rows, self.policies.values(), strict=True):
                row.append(alpha_label(p["alpha"]) if "alpha" in p else "")
        text = text_table(list(self.policies), headers, rows)
        if self.bounds:
            text += "\nbounds (token hit rate): " + ", ".join(
                f"{name} {rate:.4f}" for name, rate in self.bounds.items()
            )
        text += self.breakdown_lines()
        text += self.latency_error_lines()
        return text + "\n" + self.speed_line() + self.saturation_lines() + self.caveat_lines()

    def latency_error_lines(self) -> str:
        """The stated error of the timed runs' latencies (``latency_error``), once per engine."""
        return "".join(f"\n{line}" for line in stated.lines(self.policies))

    def breakdown_lines(self) -> str:
        """Per policy, where its input tokens went (``reuse_breakdown``, shares of the input)."""
        lines = [
            f"\n{name}: " + ", ".join(f"{part} {share:.4f}" for part, share in parts.items())
            for name, p in self.policies.items()
            if (parts := p.get("reuse_breakdown"))
        ]
        return "\nwhere the input went (share of input tokens):" + "".join(lines) if lines else ""

    def caveat_lines(self) -> str:
        """A warning per caveat of a policy (``summary.json``'s: a setting that disables reuse,
        a tuning that fell short)."""
        return "".join(
            f"\nwarning: {name}: {caveat}"
            for name, p in self.policies.items()
            for caveat in p.get("caveats", [])
        )

    def saturation_lines(self) -> str:
        """A warning per saturated timed run: its latencies measure the backlog. Where the KV
        pool is the bottleneck and the run set its size, it names the engine's own pool."""
        sized = "engine_pool" in self.config  # cache.size_gb=engine

        def remedy(why: str) -> str:
            pool = "pool" in why and not sized
            return ", or take the engine's own KV pool (cache.size_gb=engine)," if pool else ""

        return "".join(
            f"\nwarning: {name} is saturated ({p['saturation']}); its latencies measure the "
            f"backlog: lower the load (arrivals.session_rate){remedy(p['saturation'])} to "
            "compare policies"
            for name, p in self.policies.items()
            if p.get("saturated")
        )

    def speed_line(self) -> str:
        """How fast the simulator ran (wall clock of each policy's run): not a result column."""
        speeds = {n: p["requests_per_s"] for n, p in self.policies.items() if "requests_per_s" in p}
        return "simulator speed: " + ", ".join(f"{n} {v:,.0f} req/s" for n, v in speeds.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "policies": self.policies,
            "bounds": self.bounds,
            "trace": self.trace,
            "config": self.config,
            "routes": self.routes,
            "provenance": provenance(),
        }


def alpha_label(alpha: dict[str, Any]) -> str:
    """A tuned policy's alpha (``summary.json``'s ``alpha``) in a few words: ``0.0 (untuned)``,
    ``0.3 (1 tuning)`` or ``1.5 (3 tunings, 0.5-1.5)``."""
    final, n = alpha["final"], alpha["tunings"]
    if not alpha["tuned"]:
        return f"{final} (untuned)"
    spread = "" if alpha["min"] == alpha["max"] else f", {alpha['min']}-{alpha['max']}"
    return f"{final} ({n} tuning{'s' if n != 1 else ''}{spread})"


def text_table(index: list[str], headers: list[str], rows: list[list[Any]]) -> str:
    """Rows under their headers, right-aligned, each row led by its left-aligned index label;
    floats with 4 decimals (the layout of ``DataFrame.to_string``)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    label = max([len(i) for i in index], default=0)
    lines = [" " * label + "".join(f" {h:>{w}}" for h, w in zip(headers, widths, strict=True))]
    for name, row in zip(index, cells, strict=True):
        values = "".join(f" {v:>{w}}" for v, w in zip(row, widths, strict=True))
        lines.append(f"{name:<{label}}{values}")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    """A number to 4 decimals; NaN, or the null that stands for it in ``summary.json``
    (:func:`simlab.engines.records.strict_json`), as ``n/a``."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float | np.floating):
        return "n/a" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def trace_stats(trace: Trace) -> dict[str, Any]:
    input_lens = trace_input_tokens(trace)
    stats: dict[str, Any] = {
        "name": trace.name,
        "block_size": trace.block_size,
        "requests": len(trace),
        "sessions": trace.n_sessions,
        "input_tokens": int(input_lens.sum()),
        "output_tokens": int(trace.column("output_len").sum()),
        "input_len_p50": float(np.median(input_lens)),
        "input_len_p95": float(np.quantile(input_lens, 0.95)),
    }
    if {"ref_prompt_tokens", "ref_cached_tokens"} <= set(trace.columns):
        prompt = float(np.nansum(trace.column("ref_prompt_tokens")))
        stats["ref_prompt_tokens"] = prompt
        stats["ref_cached_tokens"] = float(np.nansum(trace.column("ref_cached_tokens")))
        stats["ref_cached_share"] = stats["ref_cached_tokens"] / prompt if prompt else 0.0
    return stats


def add_bound_ratios(policies: dict[str, dict[str, Any]], bounds: dict[str, float]) -> None:
    """Each policy's token hit rate as a fraction of each bound."""
    for summary in policies.values():
        for name, rate in bounds.items():
            summary[f"hit_vs_{name}"] = summary["token_hit_rate"] / rate if rate else math.nan
