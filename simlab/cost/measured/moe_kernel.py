"""The fused MoE's rows of one shape, and of one kernel (``engine.moe_kernel``).

The engines run their fused MoE with one of several kernels, chosen by a server flag
(TensorRT-LLM's ``moe_config.backend``: ``CUTLASS``, ``TRTLLM``, ``DEEPGEMM``; SGLang's
``--moe-runner-backend``; vLLM's per-quantization choice). The tables name the kernel of each
row (``kernel_source``). ``engine.moe_kernel`` is a substring of those names (``deepgemm``,
``cutlass``, ``flashinfer_trtllm``, ``triton``, ``marlin``...): the MoE takes that kernel's
rows. Where the engine's own table has none for the shape, the same kernel measured on the same
GPU in another engine's table times it (its newest version first; vLLM, SGLang, TensorRT-LLM in
turn): the same kernel's rows, not another kernel's. For example, TensorRT-LLM's Blackwell
tables time DeepSeek's FP8 experts with DeepGEMM only, while its ``TRTLLM`` backend runs
TensorRT-LLM's own generated kernels, which SGLang's and vLLM's B200 tables measure through
FlashInfer (``flashinfer_trtllm``): 0.050 and 0.053 ms at 4 tokens, against DeepGEMM's 0.133.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from simlab.cost.measured import tables, transfer

if TYPE_CHECKING:
    from simlab.cost.measured.kernels import Kernels

#: a fused-MoE table's shape columns (:data:`~simlab.cost.measured.transfer.Shape`)
MOE_COLUMNS = ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size")
MOE_DISTRIBUTIONS = ("power_law_1.01", "balanced", "power_law_1.2")
BACKENDS = ("vllm", "sglang", "trtllm")


def shape_rows(path: Path, dtypes: tuple[str, ...], shape: tuple[int, ...]) -> tuple[Any, str]:
    """The rows of ``shape`` in the table at ``path``, in the first of ``dtypes`` that has any,
    at the first routing distribution of :data:`MOE_DISTRIBUTIONS` measured, and that dtype."""
    for dtype in dtypes:
        frame = tables.rows(path, (("moe_dtype", dtype),))
        for column, value in zip(MOE_COLUMNS, shape, strict=True):
            frame = frame[frame[column] == value]
        if not frame.empty:
            break
    if "distribution" in frame.columns:
        for distribution in MOE_DISTRIBUTIONS:
            picked = frame[frame["distribution"] == distribution]
            if not picked.empty:
                return picked, dtype
    return frame, dtype


def of(frame: Any, kernel: str) -> Any:
    """The rows of the kernel whose name holds ``kernel`` (the one with most rows of several)."""
    if frame.empty or "kernel_source" not in frame.columns:
        return frame.iloc[0:0]
    mine = frame[frame["kernel_source"].astype(str).str.contains(kernel, regex=False)]
    return tables.kernel_rows(mine)


def elsewhere(
    system: str,
    backend: str,
    shape: tuple[int, ...],
    dtypes: tuple[str, ...],
    kernel: str,
    local: Path | None = None,
) -> tuple[Any, str] | None:
    """``kernel``'s rows of ``shape`` in another engine's table on ``system`` and where they
    come from (``backend version kernel_source``; None: no table has them)."""
    for other in BACKENDS:
        if other == backend:
            continue
        for version in reversed(tables.versions(system, other, local)):
            path = tables.table_path(system, "moe", other, version, "moe_perf", local)
            if path is None or path.parent.name != version:
                continue
            rows = of(shape_rows(path, dtypes, shape)[0], kernel)
            if not rows.empty:
                return rows, f"{other} {version} {rows['kernel_source'].iloc[0]}"
    return None


def kernels_on(system: str, local: Path | None = None) -> set[str]:
    """Every fused-MoE kernel name in ``system``'s tables (every engine and version)."""
    names: set[str] = set()
    for backend in BACKENDS:
        for version in tables.versions(system, backend, local):
            path = tables.table_path(system, "moe", backend, version, "moe_perf", local)
            if path is not None and path.parent.name == version:
                names |= set(tables.rows(path, ())["kernel_source"].astype(str).unique())
    return names


def chosen_rows(kernels: Kernels, frame: Any, shape: tuple[int, ...]) -> Any:
    """``frame``'s rows of ``kernels.moe_kernel`` (None: the kernel with most rows); where the
    table has none, that kernel's rows in another engine's table on this GPU, else the table's
    own kernel (each warned once and listed in ``kernels.moe_kernels``)."""
    if kernels.moe_kernel is None or frame.empty:
        return tables.kernel_rows(frame)
    mine = of(frame, kernels.moe_kernel)
    if not mine.empty:
        return mine
    found = elsewhere(
        kernels.system,
        kernels.backend,
        shape,
        kernels.moe_dtypes(),
        kernels.moe_kernel,
        kernels.local,
    )
    own = tables.kernel_rows(frame)
    if found is None:
        name = own["kernel_source"].iloc[0] if "kernel_source" in own.columns else "its rows"
        where = f"not measured: the table's {name}"
    else:
        where = found[1]
    if shape not in kernels.moe_kernels:
        kernels.moe_kernels[shape] = where
        kernels.warn_once(
            f"fused MoE {transfer.label(shape)}: engine.moe_kernel={kernels.moe_kernel} from "
            f"{where} (summary.json kernels.moe_kernels)"
        )
    return own if found is None else found[0]
