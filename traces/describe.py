"""Workload statistics of a canonical trace: sizes, length percentiles, ideal reuse and its kind.

Requests are taken in :meth:`traces.format.Trace.requests` order (arrival, then session, turn;
a trace whose arrivals are unassigned runs session after session).

**Ideal reuse** (an infinite cache at id granularity, the bound every policy is measured against):
for request ``r`` with input ``x`` (``n`` ids), ``M_full(r)`` = the longest prefix of ``x`` that is a
prefix of some *earlier* request's full sequence (input followed by output ids), and

    reuse(r) = min(M_full(r), n - 1)

(a prefill always computes at least one id, as in :class:`simlab.cache.prefix.PrefixCache`).

**Kind of reuse** (Marconi's taxonomy of reused prefixes). ``M_in(r)`` = the longest prefix of
``x`` that is a prefix of some earlier request's *input* alone. Every earlier input is a prefix of
that request's full sequence, so ``M_in <= M_full``. Each request with ``reuse(r) > 0`` is
classified by its reused prefix as a whole:

* **purely input** when ``M_in(r) >= reuse(r)``: the reused prefix is part of an earlier input (a
  system prompt, a shared document, a Mooncake block chain); it is reusable even if no reply were
  ever cached;
* **input and output** when ``M_in(r) < reuse(r)``: the reused prefix runs past every earlier
  input, through an earlier request's reply (a chat history, an agent's previous calls).

The two classes' ``reuse`` sums partition the ideal reuse. A finer, token-level figure is also
reported: ``output_dependent = sum(reuse(r) - min(M_in(r), reuse(r)))``, the tokens that are
reusable *only* because replies are cached (ideal reuse minus this = the ideal reuse of a cache
that admits inputs only). Both matches come from two :class:`traces.radix.RadixTree` (one of
inputs, one of full sequences): O(total ids) work, seconds for SWE-bench's 44M tokens.

For block traces (``block_size > 1``) ids are blocks; reuse is reported in tokens with
:meth:`traces.format.Request.hit_tokens` (``min(blocks * block_size, input tokens)``), and input
lengths in true tokens (``ref_input_length``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from traces.format import Trace
from traces.radix import RadixTree

PERCENTILES = (5, 50, 95)


@dataclass
class ReuseTotals:
    """Ideal reuse summed over a trace, in tokens; per-request arrays in request order."""

    input_tokens: int = 0
    reuse: int = 0
    purely_input: int = 0
    input_and_output: int = 0
    requests_purely_input: int = 0
    requests_input_and_output: int = 0
    output_dependent: int = 0
    per_request: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def reuse_share(self) -> float:
        return self.reuse / self.input_tokens if self.input_tokens else 0.0


def ideal_reuse(trace: Trace) -> ReuseTotals:
    """Ideal (infinite-cache) reuse and its purely-input / input-and-output split (see module)."""
    inputs, fulls = RadixTree(), RadixTree()
    totals = ReuseTotals()
    per_request = []
    for req in trace.requests():
        m_in = inputs.insert(req.input_ids)
        m_full = fulls.match(req.input_ids)
        fulls.insert(req.full_sequence())
        reuse = min(m_full, req.input_len - 1)
        reuse_tokens = req.hit_tokens(reuse)
        totals.input_tokens += req.input_tokens
        totals.reuse += reuse_tokens
        totals.output_dependent += reuse_tokens - req.hit_tokens(min(m_in, reuse))
        if reuse and m_in >= reuse:
            totals.purely_input += reuse_tokens
            totals.requests_purely_input += 1
        elif reuse:
            totals.input_and_output += reuse_tokens
            totals.requests_input_and_output += 1
        per_request.append(reuse_tokens)
    totals.per_request = np.asarray(per_request, dtype=np.int64)
    return totals


def input_tokens(trace: Trace) -> np.ndarray:
    """True input tokens per row: ``ref_input_length`` when present, else ids x block_size."""
    if "ref_input_length" in trace.columns:
        return np.asarray(trace.column("ref_input_length"), dtype=np.int64)
    lengths = np.fromiter((len(ids) for ids in trace.column("input_ids")), np.int64, len(trace))
    return lengths * trace.block_size


def percentiles(values: np.ndarray) -> dict[str, int]:
    """p5/p50/p95 (observed values, inverted-CDF) and max of a non-empty array."""
    out = {f"p{q}": int(np.percentile(values, q, method="inverted_cdf")) for q in PERCENTILES}
    out["max"] = int(values.max())
    return out


def log2_histogram(values: np.ndarray) -> list[tuple[int, int, int]]:
    """``(low, high, count)`` for bins ``[2^k, 2^(k+1))`` from the smallest to the largest value
    (zeros fall in the first bin ``[0, 2)``)."""
    values = np.asarray(values, dtype=np.int64)
    exponents = np.floor(np.log2(np.maximum(values, 1))).astype(int)
    lo, hi = int(exponents.min()), int(exponents.max())
    counts = np.bincount(exponents - lo, minlength=hi - lo + 1)
    return [
        (0 if k == 0 else 2**k, 2 ** (k + 1), int(c))
        for k, c in zip(range(lo, hi + 1), counts, strict=True)
    ]


def describe(trace: Trace) -> dict[str, Any]:
    """The statistics of ``trace`` as a JSON-friendly dict (see the module docstring)."""
    frame = trace.frame
    inputs = input_tokens(trace)
    outputs = frame["output_len"].to_numpy(dtype=np.int64)
    turns = frame.groupby("session_id").size().to_numpy()
    started = time.perf_counter()
    reuse = ideal_reuse(trace)
    stats: dict[str, Any] = {
        "name": trace.name,
        "block_size": trace.block_size,
        "requests": len(frame),
        "sessions": trace.n_sessions,
        "requests_per_session": {"p50": int(np.median(turns)), "max": int(turns.max())},
        "input_tokens": {"total": int(inputs.sum()), **percentiles(inputs)},
        "output_tokens": {"total": int(outputs.sum()), **percentiles(outputs)},
        "ideal_reuse": {
            "tokens": reuse.reuse,
            "share": reuse.reuse_share,
            "purely_input_tokens": reuse.purely_input,
            "purely_input_requests": reuse.requests_purely_input,
            "input_and_output_tokens": reuse.input_and_output,
            "input_and_output_requests": reuse.requests_input_and_output,
            "output_dependent_tokens": reuse.output_dependent,
            "seconds": time.perf_counter() - started,
        },
        "input_histogram": log2_histogram(inputs),
        "output_histogram": log2_histogram(outputs),
    }
    if "ref_timestamp" in frame.columns:
        stamps = frame["ref_timestamp"].to_numpy(dtype=np.float64)
        span = float(np.nanmax(stamps) - np.nanmin(stamps))
        stats["ref_timestamp_span_s"] = span
        stats["ref_request_rate"] = len(frame) / span if span > 0 else math.inf
    return stats


def _pow2(n: int) -> str:
    """A power-of-two bin edge: ``512``, ``2K``, ``64K``, ``1M`` (K = 1024)."""
    if n >= 1 << 20:
        return f"{n >> 20}M"
    if n >= 1 << 10:
        return f"{n >> 10}K"
    return str(n)


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "n/a"


def _length_line(label: str, lengths: dict[str, int]) -> str:
    cells = "  ".join(f"{k} {v:,}" for k, v in lengths.items() if k != "total")
    return f"{label:<15} total {lengths['total']:>13,}   {cells}"


def _kind_line(label: str, reuse: dict[str, Any], kind: str, total_in: int) -> str:
    tokens = reuse[f"{kind}_tokens"]
    return (
        f"  {label:<17} {tokens:>13,}  {_pct(tokens, total_in)} of input, "
        f"{_pct(tokens, reuse['tokens'])} of reuse ({reuse[f'{kind}_requests']:,} requests)"
    )


def _histogram_lines(title: str, bins: list[tuple[int, int, int]], width: int = 40) -> list[str]:
    peak = max(c for _, _, c in bins) or 1
    lines = [title]
    for low, high, count in bins:
        bar = "#" * max(1 if count else 0, round(width * count / peak))
        lines.append(f"  [{_pow2(low):>5}, {_pow2(high):>5})  {bar:<{width}} {count:,}")
    return lines


def format_description(stats: dict[str, Any]) -> str:
    """Human-readable text of :func:`describe`'s dict."""
    reuse = stats["ideal_reuse"]
    total_in = stats["input_tokens"]["total"]
    unit = f" (ids are {stats['block_size']}-token blocks)" if stats["block_size"] > 1 else ""
    lines = [
        f"trace {stats['name']}{unit}",
        f"requests        {stats['requests']:,} in {stats['sessions']:,} sessions "
        f"(requests/session p50 {stats['requests_per_session']['p50']}, "
        f"max {stats['requests_per_session']['max']})",
        _length_line("input tokens", stats["input_tokens"]),
        _length_line("output tokens", stats["output_tokens"]),
        f"ideal reuse     {reuse['tokens']:,} tokens = {_pct(reuse['tokens'], total_in)} of input "
        f"(infinite cache; computed in {reuse['seconds']:.2f} s)",
        _kind_line("purely input", reuse, "purely_input", total_in),
        _kind_line("input and output", reuse, "input_and_output", total_in),
        f"  tokens reusable only because replies are cached: "
        f"{reuse['output_dependent_tokens']:,} ({_pct(reuse['output_dependent_tokens'], total_in)}"
        " of input)",
    ]
    if "ref_timestamp_span_s" in stats:
        lines.append(
            f"timestamps      span {stats['ref_timestamp_span_s']:,.1f} s, "
            f"{stats['ref_request_rate']:.2f} requests/s"
        )
    lines += _histogram_lines("input length histogram (tokens, K = 1024)", stats["input_histogram"])
    lines += _histogram_lines("output length histogram (tokens)", stats["output_histogram"])
    return "\n".join(lines)
