"""What the roofline misses (``engine.costs``): engine overheads, MoE dispatch, the all-reduce's
latency, factors on the scans' efficiency and the SSM checkpoint copies' overhead."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: ``engine.costs`` keys and what each charges (see :class:`CostTerms`)
COST_TERMS = (
    "iteration_overhead_s",
    "sequence_overhead_s",
    "moe_dispatch_s_per_token",
    "allreduce_latency_s",
    "mamba1_scan_scale",
    "mamba2_scan_scale",
    "state_load_s",
    "state_store_s",
)


@dataclass(frozen=True)
class CostTerms:
    """What the roofline misses (``engine.costs``). Every default charges nothing or keeps the
    calibration's value, so a zero term leaves every time unchanged:

    * ``iteration_overhead_s`` per iteration and ``sequence_overhead_s`` per sequence in it
      (scheduling, sampling, launch gaps): op ``engine_overhead``, which the engine's
      overlapped loop (``CostModel.overlap``) runs beside the GPU;
    * ``moe_dispatch_s_per_token``: routing / permutation per token per MoE layer (``moe_dispatch``);
    * ``allreduce_latency_s``: the all-reduce's per-call latency, over the calibration's ``t0``
      and instead of its measured all-reduce (null: keep them);
    * ``mamba1_scan_scale`` / ``mamba2_scan_scale``: factors on the achieved efficiency of the
      selective scan (class ``selective_scan``) / the SSD chunked scan (``ssm_scan``);
    * ``state_load_s`` per SSM checkpoint loaded at a hit, ``state_store_s`` per checkpoint
      stored for the cache, over the copy's bytes (op ``ssm_state_copy``).
    """

    iteration_overhead_s: float = 0.0
    sequence_overhead_s: float = 0.0
    moe_dispatch_s_per_token: float = 0.0
    allreduce_latency_s: float | None = None
    mamba1_scan_scale: float = 1.0
    mamba2_scan_scale: float = 1.0
    state_load_s: float = 0.0
    state_store_s: float = 0.0

    def __post_init__(self) -> None:
        for key in COST_TERMS:
            value = getattr(self, key)
            if value is None and key == "allreduce_latency_s":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"engine.costs.{key} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"engine.costs.{key} must be finite, got {value!r}")
            if key.endswith("_scale") and not value > 0:
                raise ValueError(f"engine.costs.{key} must be > 0, got {value!r}")
            if not value >= 0:
                raise ValueError(f"engine.costs.{key} must be >= 0 (seconds), got {value!r}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> CostTerms:
        cfg = dict(cfg or {})
        unknown = sorted(str(k) for k in cfg if k not in COST_TERMS)
        if unknown:
            raise ValueError(
                f"engine.costs.{unknown[0]}: unknown key (known: {', '.join(COST_TERMS)})"
            )
        return cls(**{k: v for k, v in cfg.items() if v is not None or k == "allreduce_latency_s"})
