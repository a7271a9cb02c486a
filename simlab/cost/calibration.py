"""Calibration: the achieved efficiency of each op class (:class:`Efficiency`, from a file
``gpu_validate`` writes, defaults otherwise), optionally per tensor-parallel degree and with a
measured token-count curve, and the measured op times the file may hold
(:mod:`simlab.cost.profiles`)."""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from simlab.cost.profiles import Profiles, profiles_from
from simlab.cost.shapes import OP_CLASSES

#: Largest efficiency accepted: kernels stay <= 1.5 (the fit's bound); an NVSwitch all-reduce
#: beats the ring's ``2 (tp-1)/tp`` bytes per link (NVLink SHARP), measured up to ~1.6 on H100.
ETA_MAX = 2.0


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of peak compute / bandwidth, fixed overhead (s) per launch, and an
    optional token-count curve: ``((tokens, scale), ...)`` with tokens increasing, the op's
    roofline time multiplied by ``scale`` interpolated linearly in log2(tokens) (constant
    beyond the ends). Empty: the plain roofline."""

    eta_c: float
    eta_m: float
    t0: float
    curve: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if not (0 < self.eta_c <= ETA_MAX and 0 < self.eta_m <= ETA_MAX):
            raise ValueError(
                f"eta_c and eta_m must be in (0, {ETA_MAX}], got {self.eta_c}, {self.eta_m}"
            )
        if not (self.t0 >= 0 and math.isfinite(self.t0)):
            raise ValueError(f"t0 (overhead per launch) must be >= 0 s and finite, got {self.t0}")
        knots = [k for k, _ in self.curve]
        if any(not k >= 1 for k in knots) or any(b <= a for a, b in itertools.pairwise(knots)):
            raise ValueError(f"curve tokens must be >= 1 and increasing, got {knots}")
        if any(not (v > 0 and math.isfinite(v)) for _, v in self.curve):
            raise ValueError(
                f"curve scales must be finite and > 0, got {[v for _, v in self.curve]}"
            )

    def scaled(self, factor: float) -> Efficiency:
        """The same class with ``eta_c`` and ``eta_m`` multiplied by ``factor`` (capped at
        :data:`ETA_MAX`)."""
        eta_c, eta_m = min(self.eta_c * factor, ETA_MAX), min(self.eta_m * factor, ETA_MAX)
        return replace(self, eta_c=eta_c, eta_m=eta_m)


LogCurve = tuple[tuple[float, ...], tuple[float, ...]]  # (log2 knots, scales)


def log_curve(curve: tuple[tuple[float, float], ...]) -> LogCurve:
    return tuple(math.log2(k) for k, _ in curve), tuple(v for _, v in curve)


def curve_scale(curve: LogCurve, tokens: float) -> float:
    """A :func:`log_curve` at ``tokens``: linear in log2(tokens) between knots, constant
    beyond (1 for an empty curve)."""
    xs, ys = curve
    if not xs:
        return 1.0
    x = math.log2(max(tokens, 1.0))
    i = bisect.bisect_right(xs, x)
    if i == 0:
        return ys[0]
    if i == len(xs):
        return ys[-1]
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] * (1 - w) + ys[i] * w


#: Defaults before calibration: typical achieved fractions on A100/H100-class GPUs.
DEFAULT_EFFICIENCY = {
    "gemm": Efficiency(0.70, 0.80, 4e-6),
    "attn_prefill": Efficiency(0.50, 0.75, 6e-6),
    "attn_decode": Efficiency(0.30, 0.70, 6e-6),
    "ssm_scan": Efficiency(0.30, 0.60, 10e-6),
    "selective_scan": Efficiency(0.30, 0.60, 10e-6),  # Mamba1: the old shared ssm_scan default
    "ssm_step": Efficiency(0.20, 0.60, 6e-6),
    "state_copy": Efficiency(1.00, 0.80, 3e-6),
    "elementwise": Efficiency(1.00, 0.80, 3e-6),
    "allreduce": Efficiency(1.00, 0.70, 10e-6),
}

#: Project root: relative calibration paths (hardware presets name theirs) resolve against it
#: when they do not exist relative to the working directory.
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Calibration:
    """Per-op-class efficiency factors; see :meth:`load` for the file format. ``by_tp``: per
    class, efficiencies for given tensor-parallel degrees (the all-reduce), used over
    ``efficiency`` at those degrees. ``hardware``: the preset the file was fitted against.
    ``profiles``: measured op times per shape (:class:`~simlab.cost.profiles.Profile`), which
    time the ops they match instead of the class model; ``profiled_held_back_error``: their
    own held-back error per op class."""

    efficiency: dict[str, Efficiency] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY))
    source: str = "defaults"
    by_tp: dict[str, dict[int, Efficiency]] = field(default_factory=dict)
    hardware: str | None = None
    held_back_error: dict[str, Any] = field(default_factory=dict)
    profiles: Profiles = field(default_factory=dict)
    profiled_held_back_error: dict[str, Any] = field(default_factory=dict)

    def without_profiles(self) -> Calibration:
        """The same calibration timing every op with the class model (``engine.profiles=false``)."""
        return replace(self, profiles={}, profiled_held_back_error={})

    def for_class(self, op_class: str, tp: int = 1) -> Efficiency:
        return self.by_tp.get(op_class, {}).get(tp, self.efficiency[op_class])

    @classmethod
    def load(cls, path: str | Path, hardware: str | None = None) -> Calibration:
        """Read ``{"hardware": {"name": ...} | name, "ops": {class: {"eta_c", "eta_m", "t0",
        ["curve": {"x": "tokens", "knots", "scale"}], ["by_tp": {tp: {...}}]}},
        ["unmeasured": {class: why}], ["profiles": {"series": [{"op", "shape", "tp", "tokens",
        "seconds"}]}]}``. Classes absent from ``ops`` keep their defaults; a
        file with ``unmeasured`` must name every class in one of the two (a class missing from
        both is an error). ``hardware``: the preset it is used with; a file fitted against
        another preset, or naming no hardware, is an error. Errors name the file."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            eff, by_tp = _op_efficiencies(data)
            fitted = _fitted_hardware(data, hardware)
            profiles = profiles_from(data.get("profiles") or {})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"calibration file {path}: {err}") from err
        held = data.get("held_back_error") or {}
        profiled = (data.get("profiles") or {}).get("held_back_error") or {}
        return cls(
            eff,
            str(path),
            by_tp,
            fitted,
            held if isinstance(held, dict) else {},
            profiles,
            profiled if isinstance(profiled, dict) else {},
        )


def _op_efficiencies(
    data: Mapping[str, Any],
) -> tuple[dict[str, Efficiency], dict[str, dict[int, Efficiency]]]:
    """A calibration file's ``ops`` over the defaults, and their ``by_tp`` entries."""
    eff = dict(DEFAULT_EFFICIENCY)
    by_tp: dict[str, dict[int, Efficiency]] = {}
    for name, values in data["ops"].items():
        if name not in OP_CLASSES:
            raise ValueError(f"unknown op class {name!r} (known: {', '.join(OP_CLASSES)})")
        eff[name] = _efficiency(values, f"ops.{name}")
        for tp, sub in (values.get("by_tp") or {}).items():
            by_tp.setdefault(name, {})[int(tp)] = _efficiency(sub, f"ops.{name}.by_tp.{tp}")
    if "unmeasured" in data:
        missing = [c for c in OP_CLASSES if c not in data["ops"] and c not in data["unmeasured"]]
        if missing:
            raise ValueError(f"op class {missing[0]!r} is neither in ops nor in unmeasured")
    return eff, by_tp


def _efficiency(values: Mapping[str, Any], where: str) -> Efficiency:
    """One ``ops`` entry of a calibration file (``where`` names it in errors)."""
    missing = [k for k in ("eta_c", "eta_m", "t0") if k not in values]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    curve: tuple[tuple[float, float], ...] = ()
    if values.get("curve"):
        c = values["curve"]
        if c.get("x", "tokens") != "tokens" or len(c["knots"]) != len(c["scale"]):
            raise ValueError(f"{where}.curve: needs x 'tokens' and as many scale as knots")
        curve = tuple((float(k), float(v)) for k, v in zip(c["knots"], c["scale"], strict=True))
    try:
        return Efficiency(
            float(values["eta_c"]), float(values["eta_m"]), float(values["t0"]), curve
        )
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err


def _fitted_hardware(data: Mapping[str, Any], hardware: str | None) -> str | None:
    """The preset a calibration file was fitted against; an error when ``hardware`` (the
    preset it is used with) is given and the file names another, or none."""
    fitted = data.get("hardware")
    fitted = fitted.get("name") if isinstance(fitted, Mapping) else fitted
    if hardware is not None and fitted is None:
        raise ValueError(
            f"no hardware name: cannot tell whether it was fitted for the preset "
            f'{hardware!r} (gpu_validate writes "hardware": {{"name": ...}})'
        )
    if hardware is not None and fitted != hardware:
        raise ValueError(f"fitted for hardware {fitted!r}, not for the preset {hardware!r}")
    return fitted


def resolve_calibration(path: str | Path) -> Path:
    """``path`` as given when it exists, else relative to the project root."""
    path = Path(path)
    if path.is_absolute() or path.exists() or not (ROOT / path).exists():
        return path
    return ROOT / path
