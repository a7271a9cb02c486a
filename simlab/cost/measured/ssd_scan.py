"""A Mamba2 layer's SSD chunked scan from FLA's GDN chunked scan (:func:`scan`), for the
engines whose own SSD kernels have a public timing.

No public table measures the SSD scan. Two public timings of engines' SSD kernels exist. Each
sits at a steady multiple of FLA's Triton GDN chunked scan (``chunk_gated_delta_rule``, which
SGLang's tables time) on the same GPU, at the same state size and batch shape. Each is
2.8-23x the roofline of the scan's traffic, which the other engines' scan takes
(:mod:`.unmeasured`):

* **vLLM, tables before 0.19** (A100's 0.14). These versions ran the SSD kernels from before
  vLLM's March 2026 optimization (pull request 35397). Pull request 27299 timed those kernels
  on one H100 at granite-4.0-h-small's layer (128 heads of 64, state 128, one group): 0.34,
  0.65, 1.27 and 2.78 ms at 4,096 to 32,768 tokens. That is 0.49-0.50x FLA's scan at that state.
* **SGLang.** Its SSD kernels run Triton's default 16-wide tiles, because their autotune was
  never imported (sglang pull request 39130, open). A public ``torch.profiler`` write-up of a
  kernel-fusion study (2026-08-04) timed Falcon-H1-1.5B-Instruct (48 heads of 64, state 256,
  one group) on one H200, four prompts of 4,000 tokens in one prefill: three of the five SSD
  kernels took 148.8 ms over its 24 layers. That is 0.98x FLA's scan at that state and batch.
  The two kernels not in that sum (``bmm``, ``cumsum``) make it a floor.

So, for these engines, a layer's scan is FLA's GDN scan at the equal state and batch shape,
times the engine's factor (:func:`factor`: the median of its points), plus the causal conv1d.
The equal state is ``heads x head_dim x state`` over 128 x 128 value heads
(:func:`value_heads`). FLA's scan comes from SGLang's newest tables on the GPU; where those lack
it, from the GPU's class (:mod:`.delta_lend`). The conv is the GDN conv1d of these tables,
scaled to the layer's conv channels (it is memory-bound: linear in them).

The result is tagged ``interpolated``, warned once and recorded as :data:`LENT` in
``kernels.delta_rule_lent``. Its range (:mod:`.unmeasured`): low, the scan's bytes at the peak
bandwidth; high, :data:`SPREAD` x it, since each engine has one shape on one GPU. A scan lent
from the class is also widened by that transfer's P90.

vLLM from 0.19 and TensorRT-LLM have no public timing of their SSD kernels: their scan stays on
the roofline, with its stated range (:mod:`.unmeasured`).
"""

from __future__ import annotations

import functools
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from simlab.cost.measured import delta_lend, tables
from simlab.cost.measured.sources import INTERPOLATED

if TYPE_CHECKING:
    from simlab.cost.measured.hooks import MeasuredOps
    from simlab.cost.measured.kernels import Kernels
    from simlab.cost.shapes import Op

#: its entry in ``Kernels.delta_lent`` (``summary.json`` ``kernels.delta_rule_lent``)
LENT = "mamba2 context scan"
#: the high end of a scan timed from its engine's public timing, as a factor on it
SPREAD = 2.0
#: vLLM's SSD kernels were optimized in March 2026 (pull request 35397); the first vLLM version
#: the tables measured after it
VLLM_OPTIMIZED = "0.19"
#: the key and value head widths of the GDN tables
GDN_HEAD = delta_lend.HEAD_DIM


@dataclass(frozen=True)
class Public:
    """A public timing of an engine's SSD kernels: the GPU, the layer (heads, head dim, state
    dim), each point's (sequences, tokens each, ms per layer) and where it comes from."""

    gpu: str
    layer: tuple[int, int, int]
    points: tuple[tuple[int, int, float], ...]
    source: str


#: vLLM pull request 27299 (comment of 2025-10-25): tokens per second of vLLM's SSD chunked
#: scan alone ("Original", before pull request 35397) on one H100
VLLM_TOKENS_PER_S = {4096: 1.206409e7, 8192: 1.262327e7, 16384: 1.292440e7, 32768: 1.180002e7}

PUBLIC = {
    "vllm": Public(
        "h100_sxm",
        (128, 64, 128),  # granite-4.0-h-small
        tuple((1, n, n / rate * 1e3) for n, rate in VLLM_TOKENS_PER_S.items()),
        "vLLM's SSD kernels before 0.19 (pull request 27299, one H100)",
    ),
    "sglang": Public(
        "h200_sxm",
        (48, 64, 256),  # Falcon-H1-1.5B-Instruct
        ((4, 4000, 148.8 / 24),),  # _chunk_state, _chunk_scan, _state_passing: 64.3+51.3+33.2
        "SGLang's SSD kernels at 16-wide tiles (a torch.profiler write-up, one H200)",
    ),
}


def engine(kernels: Kernels) -> str | None:
    """The :data:`PUBLIC` entry whose kernels ``kernels``' engine and version run (None for
    vLLM from :data:`VLLM_OPTIMIZED` and for TensorRT-LLM)."""
    if kernels.backend == "sglang":
        return "sglang"
    old = tables.version_key(kernels.version) < tables.version_key(VLLM_OPTIMIZED)
    return "vllm" if kernels.backend == "vllm" and old else None


def value_heads(heads: int, head_dim: int, state: int) -> int:
    """GDN value heads of 128 x 128 state holding as many state elements as a Mamba2 layer's
    ``heads x head_dim x state``."""
    return max(1, round(heads * head_dim * state / (GDN_HEAD * GDN_HEAD)))


def key_heads(v_heads: int) -> tuple[int, ...]:
    """The key heads tried with ``v_heads`` value heads, the first a table has taken: a
    quarter, half or all of them, else the tables' counts (the keys' share barely moves the
    scan)."""
    tried = (v_heads // 4, v_heads // 2, v_heads, 16, 8, 4, 2, 1)
    return tuple(dict.fromkeys(k for k in tried if k >= 1))


@functools.lru_cache(maxsize=16)
def fla(system: str, dtype: str, local: Path | None) -> Kernels | None:
    """The kernels whose GDN scan is FLA's on ``system``: SGLang's newest tables (None: no
    SGLang table there)."""
    from simlab.cost.measured.kernels import Kernels  # here: it imports delta_lend

    have = tables.versions(system, delta_lend.SCAN_SOURCE, local)
    return Kernels(system, delta_lend.SCAN_SOURCE, have[-1], dtype, local) if have else None


def fla_scan(
    system: str, dtype: str, local: Path | None, v_heads: int, batch: int, length: float
) -> tuple[float, int] | None:
    """FLA's GDN chunked scan (ms, one layer) at ``v_heads`` value heads over ``batch``
    sequences of ``length`` tokens on ``system``, and the key heads it was taken at."""
    source = fla(system, dtype, local)
    if source is None:
        return None
    for k in key_heads(v_heads):
        timed = source.delta_rule("gdn", *delta_lend.SCAN, batch, length, (k, v_heads))
        if timed is not None:
            return timed[0], k
    return None


@functools.lru_cache(maxsize=8)
def factor(name: str, local: Path | None = None) -> float | None:
    """The median of :data:`PUBLIC` ``name``'s ms over FLA's scan at its equal state and batch
    on its GPU (None: the tables lack that scan)."""
    public = PUBLIC[name]
    v = value_heads(*public.layer)
    ratios = []
    for batch, length, ms in public.points:
        timed = fla_scan(public.gpu, "bf16", local, v, batch, length)
        if timed is not None:
            ratios.append(ms / timed[0])
    return statistics.median(ratios) if ratios else None


def scan(measured: MeasuredOps, op: Op) -> tuple[float, str] | None:
    """A Mamba2 layer's conv1d + SSD scan (seconds, all its layers) for an engine of
    :data:`PUBLIC` (None: another engine, or no table covers the shape)."""
    m, tp, kernels = measured.model, measured.tp, measured.kernels
    name = engine(kernels)
    ratio = None if name is None else factor(name, kernels.local)
    if name is None or ratio is None or m.ssm_n_heads % tp or not op.query:
        return None
    seqs = op.query[0]
    length = op.tokens / seqs
    v = value_heads(m.ssm_n_heads // tp, m.ssm_head_dim, m.ssm_state_dim)
    timed = fla_scan(kernels.system, kernels.dtype, kernels.local, v, seqs, length)
    if timed is None:
        return None
    conv_ms = conv(kernels, seqs, length, m.ssm_conv_channels / tp, v)
    if conv_ms is None:
        return None
    kernels.record_lent(LENT, described(name, ratio))
    source = fla(kernels.system, kernels.dtype, kernels.local)
    if source is not None and delta_lend.GPU_LENT in source.delta_lent:  # from the class
        kernels.record_lent(delta_lend.GPU_LENT, source.delta_lent[delta_lend.GPU_LENT])
    return m.n_ssm_layers * (ratio * timed[0] + conv_ms) / 1e3, INTERPOLATED


def conv(
    kernels: Kernels, batch: int, length: float, channels: float, v_heads: int
) -> float | None:
    """The causal conv1d (ms, one layer) over ``channels`` channels: the GDN conv of these
    tables at the first head count they hold near ``v_heads`` value heads, scaled by the
    channels (a GDN conv's are ``128 (2 key heads + value heads)``)."""
    for v in dict.fromkeys((v_heads, 2 * v_heads, max(1, v_heads // 2), 64, 32, 16)):
        for k in key_heads(v):
            timed = kernels.delta_rule("gdn", "context", "conv", batch, length, (k, v))
            if timed is not None:
                return timed[0] * channels / (GDN_HEAD * (2 * k + v))
    return None


def described(name: str, ratio: float) -> str:
    """How :func:`scan` timed the scan of :data:`PUBLIC` ``name``'s engine."""
    return f"FLA's GDN chunked scan at equal state x {ratio:.2f}: {PUBLIC[name].source}"


def lend_p90(kernels: Kernels) -> float | None:
    """The P90 of the class transfer where FLA's scan on ``kernels``' GPU came from other
    GPUs (:mod:`.delta_lend`; None: measured there)."""
    source = fla(kernels.system, kernels.dtype, kernels.local)
    if source is None or source.grid(("gdn", *delta_lend.SCAN, 0)) is not None:
        return None
    return delta_lend.transfer_p90(source)


def main(argv: list[str] | None = None) -> int:
    """Write each public timing beside FLA's GDN scan at its equal state and batch, their ratio
    and each engine's factor (``python -m simlab.cost.measured.ssd_scan``)."""
    del argv
    out = sys.stdout
    for name, public in PUBLIC.items():
        v = value_heads(*public.layer)
        out.write(f"{name}: {public.source}; layer {public.layer}, {v} GDN value heads\n")
        for batch, length, ms in public.points:
            timed = fla_scan(public.gpu, "bf16", None, v, batch, length)
            fla_ms = float("nan") if timed is None else timed[0]
            out.write(
                f"  {batch} x {length:>6,} tokens: public {ms:6.2f} ms, FLA's GDN scan "
                f"{fla_ms:6.2f} ms, ratio {ms / fla_ms:.3f}\n"
            )
        ratio = factor(name)
        out.write(f"  factor: {'none' if ratio is None else f'{ratio:.3f}'}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
