"""Which measured kernels time a run (:func:`select`): the hardware preset's GPU in the tables
(``hardware.system``), the engine backend and version, and the model's dtype; every bad key is
a one-line error naming it."""

from __future__ import annotations

import logging
from pathlib import Path

from simlab.cost.hardware import Hardware
from simlab.cost.measured import moe_kernel, tables
from simlab.cost.measured.kernels import Kernels
from simlab.model.spec import ModelSpec

log = logging.getLogger(__name__)

#: ``engine.kernels``: measured tables first (the default), or the calibrated roofline only
KERNEL_MODES = ("measured", "roofline")
#: a model's weight bytes per value -> its dtype's tables (``engine.dtype`` null)
DTYPE_OF_BYTES = {2: "bf16", 1: "fp8"}
#: a checkpoint's weight format (``ModelSpec.weight_quant``) -> the tables that time it
QUANT_TABLES = {"fp8": "fp8", "nvfp4": "fp4"}
#: relative difference of bandwidth between a preset and its tables' GPU that warns
BANDWIDTH_WARN = 0.05


def check(mode: str, backend: str, version: str | None, dtype: str | None) -> None:
    """The ``engine`` keys' values, before any table is read (ValueError naming the key)."""
    if mode not in KERNEL_MODES:
        raise ValueError(f"engine.kernels must be one of {', '.join(KERNEL_MODES)}, got {mode!r}")
    if backend not in tables.BACKENDS:
        known = ", ".join(tables.BACKENDS)
        raise ValueError(f"engine.backend must be one of {known}, got {backend!r}")
    if dtype is not None and dtype not in tables.DTYPES:
        known = ", ".join(tables.DTYPES)
        raise ValueError(f"engine.dtype must be null or one of {known}, got {dtype!r}")
    if version is not None and not isinstance(version, str):
        raise ValueError(
            f"engine.backend_version must be a string, got the number {version!r}: quote it "
            f"(engine.backend_version=\"'{version}'\"), as a version like 0.10 reads as 0.1"
        )


def local_tables(path: str | None) -> Path | None:
    """``engine.kernel_tables``: a directory of tables in the package's layout (ValueError
    naming the key when it is not one)."""
    if path is None:
        return None
    if not Path(path).is_dir():
        raise ValueError(f"engine.kernel_tables: {path} is not a directory")
    return Path(path).resolve()


def resolve_version(
    system: str, backend: str, version: str | None, local: Path | None = None
) -> str | None:
    """``version`` if ``system`` has tables of ``backend`` at it, the newest one if None; an
    unmeasured version is a ValueError naming those measured (None: no tables at all)."""
    have = tables.versions(system, backend, local)
    if not have:
        return None
    if version is None:
        return have[-1]
    if version not in have:
        raise ValueError(
            f"engine.backend_version: {backend} {version} has no measured tables on {system} "
            f"(measured: {', '.join(have)})"
        )
    return version


def select(
    hardware: Hardware,
    mode: str,
    backend: str,
    version: str | None,
    dtype: str,
    local: Path | None = None,
    kv_dtype: str = "bf16",
    moe_kernel: str | None = None,
) -> Kernels | None:
    """The :class:`Kernels` of a run, or None: ``engine.kernels=roofline``, a preset without
    a ``system``, or tables not installed / not covering it (logged once)."""
    if mode != "measured" or hardware.system is None or tables.systems_dir() is None:
        if version is not None and mode == "measured" and hardware.system is None:
            raise ValueError(
                f"engine.backend_version: hardware {hardware.name} has no measured tables "
                "(its preset names no system)"
            )
        return None
    resolved = resolve_version(hardware.system, backend, version, local)
    if resolved is None:
        log.warning(
            "%s has no measured tables for engine.backend=%s: every op on the roofline",
            hardware.system,
            backend,
        )
        return None
    _warn_bandwidth(hardware)
    kernels = Kernels(hardware.system, backend, resolved, dtype, local, kv_dtype, moe_kernel)
    check_dtype(kernels)
    line = newer_tables(kernels)
    if line is not None and line not in _warned:
        _warned.add(line)
        log.warning("%s", line)
    return kernels


def check_dtype(kernels: Kernels) -> None:
    """A ValueError naming ``engine.dtype`` when the GEMM table measures no GEMM of the
    kernels' dtype (FP8 on A100, FP4 before Blackwell): their linear layers would all fall to
    the roofline, at a peak the GPU may not have."""
    path = kernels.path("gemm")
    if path is None:
        return
    have = set(tables.rows(path, ())["gemm_dtype"].astype(str))
    if tables.DTYPES[kernels.dtype]["gemm"] in have:
        return
    measured = ", ".join(d for d, names in tables.DTYPES.items() if names["gemm"] in have)
    raise ValueError(
        f"engine.dtype: {kernels.system}'s {kernels.backend} GEMM table ({path.parent.name}) "
        f"measured no {kernels.dtype} GEMM (measured: {measured or 'none'}); set engine.dtype "
        "to one of them"
    )


def newer_tables(kernels: Kernels) -> str | None:
    """A line when some tables were measured only at versions newer than the engine's, so
    :func:`~simlab.cost.measured.tables.table_path` took the oldest newer one (None: none)."""
    key = tables.version_key(kernels.version)
    newer = {kind: v for kind, v in kernels.used_versions().items() if tables.version_key(v) > key}
    if not newer:
        return None
    listed = ", ".join(f"{kind} {v}" for kind, v in sorted(newer.items()))
    return (
        f"engine.backend_version {kernels.backend} {kernels.version}: these tables are measured "
        f"only at later versions and come from the oldest of them ({listed}); their kernels "
        f"may differ from {kernels.version}'s"
    )


def model_dtype(dtype: str | None, dtype_bytes: int) -> str:
    """``engine.dtype``, else the model's by its weight bytes (ValueError naming the key)."""
    if dtype is not None:
        return dtype
    if dtype_bytes not in DTYPE_OF_BYTES:
        raise ValueError(
            f"model.dtype_bytes: {dtype_bytes} has no measured dtype; set engine.dtype "
            f"({', '.join(tables.DTYPES)}) or engine.kernels=roofline"
        )
    return DTYPE_OF_BYTES[dtype_bytes]


def check_moe_kernel(system: str, kernel: str | None, local: Path | None = None) -> None:
    """``engine.moe_kernel`` names a fused-MoE kernel some table on ``system`` measured
    (ValueError naming the key and those measured otherwise)."""
    if kernel is None or tables.systems_dir() is None:
        return
    names = moe_kernel.kernels_on(system, local)
    if not isinstance(kernel, str) or not kernel or not any(kernel in n for n in names):
        raise ValueError(
            f"engine.moe_kernel: no fused-MoE kernel on {system} matches {kernel!r} "
            f"(measured: {', '.join(sorted(names))})"
        )


def kv_dtype(kv_bytes: int) -> str:
    """The KV cache's dtype by its bytes per value (``model.kv_dtype_bytes``; ValueError
    naming the key where no table has it)."""
    if kv_bytes not in DTYPE_OF_BYTES:
        raise ValueError(
            f"model.kv_dtype_bytes: {kv_bytes} has no measured KV cache dtype (2: bf16, 1: fp8); "
            "set it or engine.kernels=roofline"
        )
    return DTYPE_OF_BYTES[kv_bytes]


_warned: set[str] = set()


def checkpoint_caveat(model: ModelSpec, dtype: str) -> str | None:
    """A line when the model's checkpoint keeps its weights in a format (``weight_quant``, from
    its config's ``quantization_config``) other than the tables' ``dtype`` that time them
    (None: the same, or a checkpoint in its torch dtype)."""
    quant, table = model.weight_quant, QUANT_TABLES.get(model.weight_quant)
    if not quant or table == dtype:
        return None
    fix = (
        f"engine.dtype={table} times them as the engines run them"
        if table
        else "no table measures that format"
    )
    return (
        f"model {model.name}: its checkpoint's weights are {quant} (config "
        f"quantization_config), but they are timed on the {dtype} tables and charged at "
        f"model.dtype_bytes={model.dtype_bytes}: {fix}"
    )


def warn_checkpoint(model: ModelSpec, dtype: str) -> None:
    """Log :func:`checkpoint_caveat` once per model and dtype."""
    line = checkpoint_caveat(model, dtype)
    if line is not None and line not in _warned:
        _warned.add(line)
        log.warning("%s", line)


def caveat(hardware: Hardware) -> str | None:
    """A line when the preset's memory bandwidth is not that of the GPU its kernels were
    measured on (None: the same, within :data:`BANDWIDTH_WARN`)."""
    peaks = tables.peaks(hardware.system or "")
    if peaks is None or abs(hardware.mem_bw_gbps / peaks["mem_bw_gbps"] - 1) <= BANDWIDTH_WARN:
        return None
    return (
        f"hardware {hardware.name}: its kernels were measured on {hardware.system} "
        f"({peaks['mem_bw_gbps']:.0f} GB/s, not {hardware.mem_bw_gbps:.0f} GB/s): memory-bound "
        "op times are off by up to that ratio"
    )


def _warn_bandwidth(hardware: Hardware) -> None:
    """Log :func:`caveat` once per preset."""
    line = caveat(hardware)
    if line is not None and hardware.name not in _warned:
        _warned.add(hardware.name)
        log.warning("%s", line)
