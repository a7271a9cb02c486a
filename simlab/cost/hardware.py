"""An accelerator's published peaks (``configs/hardware`` presets)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hardware:
    """Published peak numbers of one accelerator (dense FP16/BF16 tensor core; ``fp32_tflops``:
    the CUDA cores' FP32 peak, the ceiling of :data:`simlab.cost.shapes.CUDA_CORE_CLASSES`,
    None: no ceiling)."""

    name: str
    peak_tflops: float
    mem_bw_gbps: float
    mem_gb: float
    link_bw_gbps: float
    fp32_tflops: float | None = None

    def __post_init__(self) -> None:
        keys = ("peak_tflops", "mem_bw_gbps", "mem_gb", "link_bw_gbps", "fp32_tflops")
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
        return cls(
            **{k: v for k, v in dict(cfg).items() if not str(k).startswith("_") and k not in skip}
        )

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
