"""An accelerator's published peaks (``configs/hardware`` presets)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simlab.cost.measured import tables

#: the peaks a preset may leave null for its ``system``'s published ones
PEAK_KEYS = ("peak_tflops", "mem_bw_gbps", "mem_gb", "link_bw_gbps")


@dataclass(frozen=True)
class Hardware:
    """Published peak numbers of one accelerator (dense FP16/BF16 tensor core; ``fp32_tflops``:
    the CUDA cores' FP32 peak, the ceiling of :data:`simlab.cost.shapes.CUDA_CORE_CLASSES`,
    None: no ceiling; ``system``: the GPU's name in aiconfigurator-core's measured tables,
    :mod:`simlab.cost.measured`, None: none; ``compute_capability``: its CUDA compute
    capability, which vLLM's GDN prefill kernel follows)."""

    name: str
    peak_tflops: float
    mem_bw_gbps: float
    mem_gb: float
    link_bw_gbps: float
    fp32_tflops: float | None = None
    system: str | None = None
    #: CUDA compute capability (None: not a CUDA GPU); the engines' kernel choices follow it
    compute_capability: float | None = None

    def __post_init__(self) -> None:
        keys = ("peak_tflops", "mem_bw_gbps", "mem_gb", "link_bw_gbps", "fp32_tflops")
        if self.system is not None and not isinstance(self.system, str):
            raise ValueError(f"hardware.system must be a string or null, got {self.system!r}")
        for key in keys:
            value = getattr(self, key)
            if value is None and key == "fp32_tflops":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"hardware.{key} must be a number > 0, got {value!r}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Hardware:
        """From a ``configs/hardware`` preset; its ``calibration`` key (the preset's default
        calibration file) is the engine's business, not the peaks'."""
        skip = ("calibration",)
        values = {
            k: v for k, v in dict(cfg).items() if not str(k).startswith("_") and k not in skip
        }
        return cls(**_with_system_peaks(values))

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def fp32_flops(self) -> float:
        """The CUDA cores' FP32 peak (infinite when the preset does not give it)."""
        return math.inf if self.fp32_tflops is None else self.fp32_tflops * 1e12

    @property
    def mem_bw(self) -> float:
        return self.mem_bw_gbps * 1e9

    @property
    def link_bw(self) -> float:
        return self.link_bw_gbps * 1e9


def _with_system_peaks(values: dict[str, Any]) -> dict[str, Any]:
    """A preset's keys with the peaks it leaves null filled from its ``system``'s
    ``systems/<gpu>.yaml`` in aiconfigurator-core (ValueError naming the key when missing)."""
    missing = [k for k in PEAK_KEYS if values.get(k) is None]
    if not missing:
        return values
    system = values.get("system")
    peaks = None if system is None else tables.peaks(str(system))
    if peaks is None:
        where = f"aiconfigurator-core's systems/{system}.yaml" if system else "the preset"
        raise ValueError(f"hardware.{missing[0]} is not given and {where} does not give it")
    return values | {k: peaks[k] for k in missing}
