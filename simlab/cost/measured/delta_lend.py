"""The GDN kernels a GPU's tables lack for an engine: lent from another engine on the same GPU
(:func:`elsewhere`), and the chunked prefill scan from other GPUs (:func:`gdn_scan`). KDA's
kernels are not lent: its engines run different ones (vLLM's FlashKDA, SGLang's ``chunk_kda``).

**Another engine, same GPU.** vLLM and SGLang run the same causal conv1d and recurrent decode
kernels, and on the GPUs where vLLM has no FlashInfer scan (Ada, consumer Blackwell) the same
Triton chunked scan as SGLang (FLA's ``chunk_gated_delta_rule``): on the GPUs both measured,
vLLM's time over SGLang's has a median of 0.88-1.06 for each kernel (conv1d, conv update,
recurrent step; L40S, RTX Pro 6000, H100, B200) and 0.98 / 1.02 for the scan (L40S / RTX Pro
6000). So where the chosen engine has no table of the family on a GPU (vLLM and TensorRT-LLM on
A100: only SGLang 0.5.10 measured GDN there), the first of :data:`LENDERS` that has one lends
its newest; FlashInfer's scan (vLLM on Hopper and Blackwell) never lends, since it is another
kernel.

**Other GPUs.** No table measures the chunked scan on A100: SGLang 0.5.10's holds its conv1d
and decode rows only. The calibrated roofline is no stand-in: on every GPU that measured it the
scan with its conv takes 2-11x the roofline of its traffic from 4,096 tokens (Qwen3.5-35B-A3B
at 16,384 tokens with SGLang: H100 8.0x, L40S 5.0x, RTX Pro 6000 4.2x). Triton lowers the scan's small matrix products to
``mma.sync`` on Ampere, Ada and consumer Blackwell (:data:`MMA_SYNC`; Hopper's ``wgmma`` and
datacenter Blackwell's ``tcgen05`` are other paths), so a GPU of that class lacking the scan takes
it from the class's GPUs that measured FLA's scan (SGLang's tables), each scaled by
``floor + bytes / bandwidth`` (:func:`scan_bytes`: the scan streams its inputs, outputs and
intermediates), the target's floor the sources' geometric mean (a shape a class GPU's own
table lacks too)::

    t(x) = geomean_g [ t_g(x) * (floor + bytes(x) / bw) / (floor_g + bytes(x) / bw_g) ]

It is ``interpolated``. Its error, each source GPU left out and timed from the others, is
:func:`held_out_errors` (``gdn_scan_gpu`` in ``python -m simlab.cost.measured.heldout``); its
P90 bounds the time (:mod:`~simlab.cost.measured.unmeasured`).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simlab.cost.measured import tables
from simlab.cost.measured.interpolate import Grid
from simlab.cost.measured.sources import INTERPOLATED

if TYPE_CHECKING:
    from simlab.cost.measured.kernels import Kernels

#: the engines whose GDN table lends, first found first
LENDERS = ("sglang", "vllm", "trtllm")
#: the engine whose tables time FLA's Triton chunked scan on every GPU
SCAN_SOURCE = "sglang"
#: SM versions whose Triton matrix products run on ``mma.sync``: Ampere, Ada, consumer Blackwell
MMA_SYNC = frozenset({80, 86, 87, 89, 120, 121})
#: the head width the tables measure (keys and values)
HEAD_DIM = 128
#: the scan kernels of each phase, preferred in this order (:func:`grid`)
SCAN_KERNELS = ("chunk_gated_delta_rule", "flashkda", "chunk_kda", "packed_decode")
#: the short causal conv before the scan
CONV_KERNEL = "causal_conv1d"
#: a kernel that is another engine's own and never lends
OWN_KERNEL = "flashinfer"

#: the GDN kernel other GPUs lend: the chunked prefill scan (phase, part)
SCAN = ("context", "scan")
#: its entry in ``Kernels.delta_lent``
GPU_LENT = "gdn context scan (other GPUs)"

Timed = tuple[float, str] | None
Shape = tuple[tuple[int, int], int, float]  # (key heads, value heads), batch, length


def grid(path: Path, phase: str, part: str, d_model: int, lent: bool = False) -> Grid | None:
    """The grid of one delta-rule kernel: ``part`` (``scan`` or ``conv``) in ``phase``, at
    128-wide heads, over (key heads, value heads, batch, length); the rows measured for a model
    of ``d_model`` where there are some (the tables repeat a head count per model, within a few
    percent); ``lent``: without an engine's own kernel (:data:`OWN_KERNEL`)."""
    frame = tables.rows(
        path, (("phase", phase), ("head_k_dim", HEAD_DIM), ("head_v_dim", HEAD_DIM))
    )
    kernel = frame["kernel_source"].astype(str)
    conv = kernel.str.contains(CONV_KERNEL, regex=False)
    keep = conv if part == "conv" else ~conv
    if lent:
        keep &= ~kernel.str.contains(OWN_KERNEL, regex=False)
    frame = tables.kernel_rows(frame[keep], SCAN_KERNELS)
    if (frame["d_model"] == d_model).any():
        frame = frame[frame["d_model"] == d_model]
    if frame.empty:
        return None
    axes = ["num_k_heads", "num_v_heads", "batch_size", "seq_len"]
    columns = [frame[a].to_numpy() for a in axes]
    return Grid.from_columns(columns, frame["latency"].to_numpy(dtype=np.float64), 1.0)


def elsewhere(
    kernels: Kernels, family: str, phase: str, part: str, d_model: int
) -> tuple[Grid, str] | None:
    """The grid of the first other engine on ``kernels``' GPU whose newest ``family`` table has
    this kernel (``part`` in ``phase``), and that engine and version; None if none has."""
    for backend in LENDERS:
        if backend == kernels.backend:
            continue
        have = tables.versions(kernels.system, backend, kernels.local)
        path = kernels.path(family, backend, have[-1]) if have else None
        if path is None:
            continue
        found = kernels.grid(("delta_at", str(path), phase, part, d_model))
        if found is not None:
            return found, f"{backend} {path.parent.name}"
    return None


def scan_bytes(heads: tuple[int, int], batch: float, length: float) -> float:
    """The bytes a chunked GDN prefill scan streams: per token, BF16 queries and keys per key
    head, and values, the transformed values and the output per value head."""
    k_heads, v_heads = heads
    return batch * length * 2.0 * HEAD_DIM * (2 * k_heads + 3 * v_heads)


def sm_version(system: str) -> int | None:
    """The GPU's SM version from its system file (None: none given)."""
    spec = tables.system_spec(system)
    value = None if spec is None else spec["gpu"].get("sm_version")
    return None if value is None else int(value)


@functools.lru_cache(maxsize=16)
def sources(system: str, local: Path | None) -> tuple[Any, ...]:
    """``(gpu, Kernels, bandwidth bytes/ms, floor ms)`` of each other GPU of ``system``'s class
    (:data:`MMA_SYNC`) whose :data:`SCAN_SOURCE` tables measured the chunked scan."""
    from simlab.cost.measured.kernels import Kernels  # here: it imports this module

    if sm_version(system) not in MMA_SYNC:
        return ()
    out = []
    for gpu in tables.systems():
        have = tables.versions(gpu, SCAN_SOURCE, local)
        peaks = tables.peaks(gpu)
        if gpu == system or sm_version(gpu) not in MMA_SYNC or not have or peaks is None:
            continue
        source = Kernels(gpu, SCAN_SOURCE, have[-1], local=local)
        measured = source.grid(("gdn", *SCAN, 0))
        if measured is not None:
            floor = float(np.exp(np.nanmin(measured.log_y)))
            out.append((gpu, source, peaks["mem_bw_gbps"] * 1e6, floor))
    return tuple(out)


def transferred(
    lenders: tuple[Any, ...], bandwidth: float, shape: Shape, d_model: int
) -> float | None:
    """The scan's ms at ``shape`` on a GPU of ``bandwidth`` (bytes/ms) from ``lenders``
    (:func:`sources` rows); None where none covers the shape."""
    heads, batch, length = shape
    moved = scan_bytes(heads, batch, length)
    floor = math.exp(sum(math.log(f) for *_, f in lenders) / len(lenders)) if lenders else 0.0
    logs = []
    for _, source, bw, own_floor in lenders:
        timed = source.delta_rule("gdn", *SCAN, batch, length, heads, d_model, from_class=False)
        if timed is not None:
            scale = (floor + moved / bandwidth) / (own_floor + moved / bw)
            logs.append(math.log(timed[0] * scale))
    return math.exp(sum(logs) / len(logs)) if logs else None


def gdn_scan(kernels: Kernels, shape: Shape, d_model: int) -> Timed:
    """GDN's chunked prefill scan (one layer) at ``shape`` on ``kernels``' GPU from the other
    GPUs of its class (None: not of the class, or no source covers the shape)."""
    peaks = tables.peaks(kernels.system)
    lenders = sources(kernels.system, kernels.local)
    if peaks is None or not lenders:
        return None
    ms = transferred(lenders, peaks["mem_bw_gbps"] * 1e6, shape, d_model)
    if ms is None:
        return None
    kernels.record_lent(GPU_LENT, ", ".join(g for g, *_ in lenders) + " at this GPU's bandwidth")
    return ms, INTERPOLATED


@functools.lru_cache(maxsize=16)
def held_out_errors(system: str, local: Path | None) -> np.ndarray:
    """``|predicted / measured - 1|`` of each source GPU's measured scans, that GPU left out
    and timed from the other sources of ``system``'s class as :func:`gdn_scan` times it."""
    lenders = sources(system, local)
    errors = []
    for i, (_, source, bw, _) in enumerate(lenders):
        others = lenders[:i] + lenders[i + 1 :]
        measured = source.grid(("gdn", *SCAN, 0))
        if not others or measured is None:
            continue
        for index in zip(*np.nonzero(np.isfinite(measured.log_y)), strict=True):
            k, v, batch, length = (axis[j] for axis, j in zip(measured.axes, index, strict=True))
            ms = transferred(others, bw, ((int(k), int(v)), int(batch), length), 0)
            if ms is not None:
                errors.append(abs(ms / math.exp(measured.log_y[index]) - 1))
    return np.asarray(errors)


def transfer_p90(kernels: Kernels) -> float | None:
    """The P90 of :func:`held_out_errors` for ``kernels``' GPU (None: no points)."""
    errors = held_out_errors(kernels.system, kernels.local)
    return float(np.quantile(errors, 0.9)) if errors.size else None
