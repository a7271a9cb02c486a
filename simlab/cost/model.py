"""Analytic roofline cost model of one engine iteration.

Every operation of an iteration is reduced to (op class, FLOPs, bytes moved, kernel launches),
summed over the layers it runs in, and timed as

    t(op) = [max(FLOPs / (eta_c * peak), bytes / (eta_m * bandwidth)) + launches * t0] * s(tokens)
            + fixed

with ``(eta_c, eta_m, t0)`` per op class from a calibration file written by ``gpu_validate``
(defaults otherwise), ``s`` an optional measured token-count curve of the class (1 without one:
small-token GEMMs and cache-resident elementwise kernels are off the plain roofline) and
``fixed`` the terms the roofline misses (:class:`CostTerms`, ``engine.costs``: per-iteration and
per-sequence engine overhead, MoE dispatch, per-copy SSM checkpoint overhead; 0 by default).
Identical layers make the per-layer max equal to the max of the totals.

An iteration (:class:`BatchShape`) mixes prefill chunks ``(prefix, new)`` (``new`` tokens over
``prefix + new`` keys, lower-right causal) and decode steps with a given context. Options from
the seeds:

* RadixMLP intra-batch deduplication: position-wise work (projections, MLP/MoE, norms) runs on
  the ``unique_tokens`` of the batch, ``N'`` instead of ``N``; attention and scans do not.
* shared-context decode attention (intra-prompt parallel decoding / cascade): a prefix shared by
  several decoding requests has its KV read once per group; ``shared_kv_tokens`` counts the KV
  token reads saved that way.

Per-GPU work is divided by the tensor-parallel degree, and each attention / SSM / MLP layer adds
one all-reduce of its output: ``t0`` (the small-message latency, per call) plus ``2 (tp-1)/tp`` of
the activation bytes over ``eta_m`` x the link bandwidth; a calibration may give the all-reduce
one efficiency per tensor-parallel degree (``by_tp``). The scan of Mamba1 (selective scan, class
``selective_scan``) and of Mamba2 (SSD chunked scan, class ``ssm_scan``) are separate classes.
Mamba1's scan, the recurrent decode step and the elementwise ops run on CUDA cores in FP32, not
on tensor cores (:data:`CUDA_CORE_CLASSES`): their ``eta_c`` is capped at the preset's
``fp32_tflops / peak_tflops``, so no efficiency makes them beat the CUDA cores' peak (the
selective scan's default, 0.30 of the A100's tensor peak, was 4.8x it). Where the real kernel
lands below that ceiling no measurement says yet (``gpu_validate`` on a GPU measures it).
Mamba1's ``x_proj`` (``d_inner -> dt_rank + 2N``) and ``dt_proj`` (``dt_rank -> d_inner``) are
GEMMs (``ssm_x_proj``, ``ssm_dt_proj``), not scan work; ``x_proj`` is row-parallel in vLLM and
SGLang (``RowParallelLinear``), so under tensor parallelism each Mamba1 layer adds a second,
small all-reduce of ``dt_rank + 2N`` values per token (``ssm_x_proj_allreduce``).

Measured shapes. A calibration may also hold measured times of whole ops (:class:`Profile`, the
file's ``profiles``): per layer shape and tensor-parallel degree against the token count, and
for the all-reduce one call against its message bytes (Vidur's Llama layers and NCCL runs on
A100 and H100, or the shapes a ``gpu_validate`` run measured on its GPU). An op whose name, shape
(``Op.shape``: the layer dimensions and dtype) and tensor-parallel degree match a profile is
timed from it, ``units x profile(x)`` (plus its ``fixed_s``), instead of the roofline: GEMM times
are a staircase in the token count (cuBLAS picks tiles per shape) that no model smooth in the
tokens follows. Every other op, and every shape nobody measured, keeps the roofline above.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from simlab.model.spec import ModelSpec

OP_CLASSES = (
    "gemm",
    "attn_prefill",
    "attn_decode",
    "ssm_scan",
    "selective_scan",
    "ssm_step",
    "state_copy",
    "elementwise",
    "allreduce",
)
#: classes computed on CUDA cores in FP32, not tensor cores: Mamba1's selective scan
#: (``selective_scan_cuda``), the recurrent decode step (``selective_state_update``) and the
#: elementwise ops; their compute rate never exceeds :attr:`Hardware.fp32_tflops`
CUDA_CORE_CLASSES = ("selective_scan", "ssm_step", "elementwise")


@dataclass(frozen=True)
class Hardware:
    """Published peak numbers of one accelerator (dense FP16/BF16 tensor core; ``fp32_tflops``:
    the CUDA cores' FP32 peak, the ceiling of :data:`CUDA_CORE_CLASSES`, None: no ceiling)."""

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
        """The same class with ``eta_c`` and ``eta_m`` multiplied by ``factor`` (capped at 1.5)."""
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


#: ops a calibration may time from measured tables (:class:`Profile`): the GEMMs of one layer
#: (attention and SSM projections, dense MLP), the LM head, a layer's norm + residual add (over
#: the token count), and one tensor-parallel all-reduce call (over its message bytes)
PROFILED_OPS = (
    "attn_qkv_proj",
    "attn_out_proj",
    "ssm_in_proj",
    "ssm_out_proj",
    "mlp",
    "lm_head",
    "norms_residuals",
    "tp_allreduce",
)
#: the profiled op whose profile is over the bytes of one call's message, not the token count
ALLREDUCE = "tp_allreduce"
#: Mamba1's second all-reduce per layer (row-parallel ``x_proj``), timed by the same profile
X_PROJ_ALLREDUCE = "ssm_x_proj_allreduce"


def check_tp(model: ModelSpec, tp: int) -> None:
    """Tensor parallelism splits the attention heads, the KV heads and the SSM heads evenly
    over the GPUs: ``tp`` must divide each (KV-head replication when ``tp`` exceeds them, as
    vLLM does, is not modelled: the KV per GPU would be understated)."""
    heads = []
    if model.n_attn_layers:
        heads += [("attention heads", model.n_heads), ("KV heads", model.n_kv_heads)]
    if model.n_ssm_layers:
        heads.append(("SSM heads", model.ssm_n_heads))
    for what, n in heads:
        if n and n % tp:
            raise ValueError(
                f"engine.tp: {tp} does not divide {model.name}'s {n} {what} (tensor "
                "parallelism splits them evenly; replicated KV heads are not modelled)"
            )


@dataclass(frozen=True)
class Profile:
    """Measured seconds of one unit of an op (one layer's GEMM; one norm plus one residual add;
    one all-reduce call) at increasing token counts (the all-reduce: message bytes), for one
    shape and tensor-parallel degree.

    :meth:`at` is linear in (log tokens, log seconds) between measured counts, the first value
    below the first count, and proportional to the tokens above the last (every profiled op's
    FLOPs and activation bytes are linear in the tokens, and at the largest measured counts the
    weights' share of the traffic is small). Invariant: the seconds never decrease as the
    tokens grow, so neither does :meth:`at`."""

    tokens: tuple[float, ...]
    seconds: tuple[float, ...]
    _log_tokens: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _log_seconds: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tokens or len(self.tokens) != len(self.seconds):
            raise ValueError("needs as many seconds as tokens, at least one")
        if any(not k >= 1 for k in self.tokens) or any(
            b <= a for a, b in itertools.pairwise(self.tokens)
        ):
            raise ValueError(f"tokens must be >= 1 and increasing, got {list(self.tokens)[:8]}")
        if any(not (v > 0 and math.isfinite(v)) for v in self.seconds):
            raise ValueError("seconds must be finite and > 0")
        if any(b < a for a, b in itertools.pairwise(self.seconds)):
            raise ValueError(
                "seconds must not decrease as the tokens grow (gpu_validate.profiles makes "
                "them non-decreasing)"
            )
        object.__setattr__(self, "_log_tokens", tuple(math.log(k) for k in self.tokens))
        object.__setattr__(self, "_log_seconds", tuple(math.log(v) for v in self.seconds))

    def at(self, tokens: float) -> float:
        """Seconds of one unit at ``tokens``."""
        last = self.tokens[-1]
        if tokens >= last:
            return self.seconds[-1] * tokens / last
        if tokens <= self.tokens[0]:
            return self.seconds[0]
        i = bisect.bisect_left(self.tokens, tokens)  # tokens[i - 1] < tokens <= tokens[i]
        if self.tokens[i] == tokens:
            return self.seconds[i]
        xs, ys = self._log_tokens, self._log_seconds
        w = (math.log(tokens) - xs[i - 1]) / (xs[i] - xs[i - 1])
        return math.exp(ys[i - 1] * (1 - w) + ys[i] * w)


#: a calibration's profiles: (op name, shape, tensor-parallel degree) -> measured unit times
Profiles = dict[tuple[str, tuple[int, ...], int], Profile]


def _profiles(data: Any) -> Profiles:
    """The ``profiles`` entry of a calibration file: ``{"series": [{"op", "shape", "tp",
    "tokens", "seconds"}, ...]}``."""
    out: Profiles = {}
    for i, entry in enumerate(data.get("series") or []):
        where = f"profiles.series[{i}]"
        try:
            op = entry["op"]
            if op not in PROFILED_OPS:
                raise ValueError(f"unknown op {op!r} (known: {', '.join(PROFILED_OPS)})")
            shape = tuple(int(v) for v in entry["shape"])
            tp = int(entry["tp"])
            if tp < 1:
                raise ValueError(f"tp must be >= 1, got {tp}")
            profile = Profile(
                tuple(float(k) for k in entry["tokens"]), tuple(float(v) for v in entry["seconds"])
            )
        except KeyError as err:
            raise ValueError(f"{where}: missing {err}") from err
        except (ValueError, TypeError) as err:
            raise ValueError(f"{where}: {err}") from err
        if (op, shape, tp) in out:
            raise ValueError(f"{where}: a second series for {op} {list(shape)} at tp {tp}")
        out[(op, shape, tp)] = profile
    return out


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


@dataclass(frozen=True)
class Calibration:
    """Per-op-class efficiency factors; see :meth:`load` for the file format. ``by_tp``: per
    class, efficiencies for given tensor-parallel degrees (the all-reduce), used over
    ``efficiency`` at those degrees. ``hardware``: the preset the file was fitted against.
    ``profiles``: measured op times per shape (:class:`Profile`), which time the ops they match
    instead of the class model; ``profiled_held_back_error``: their own held-back error per op
    class."""

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
            eff = dict(DEFAULT_EFFICIENCY)
            by_tp: dict[str, dict[int, Efficiency]] = {}
            for name, values in data["ops"].items():
                if name not in OP_CLASSES:
                    raise ValueError(f"unknown op class {name!r} (known: {', '.join(OP_CLASSES)})")
                eff[name] = _efficiency(values, f"ops.{name}")
                for tp, sub in (values.get("by_tp") or {}).items():
                    by_tp.setdefault(name, {})[int(tp)] = _efficiency(sub, f"ops.{name}.by_tp.{tp}")
            if "unmeasured" in data:
                missing = [
                    c for c in OP_CLASSES if c not in data["ops"] and c not in data["unmeasured"]
                ]
                if missing:
                    raise ValueError(f"op class {missing[0]!r} is neither in ops nor in unmeasured")
            fitted = data.get("hardware")
            fitted = fitted.get("name") if isinstance(fitted, Mapping) else fitted
            if hardware is not None and fitted is None:
                raise ValueError(
                    f"no hardware name: cannot tell whether it was fitted for the preset "
                    f'{hardware!r} (gpu_validate writes "hardware": {{"name": ...}})'
                )
            if hardware is not None and fitted != hardware:
                raise ValueError(f"fitted for hardware {fitted!r}, not for the preset {hardware!r}")
            profiles = _profiles(data.get("profiles") or {})
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


def resolve_calibration(path: str | Path) -> Path:
    """``path`` as given when it exists, else relative to the project root."""
    path = Path(path)
    if path.is_absolute() or path.exists() or not (ROOT / path).exists():
        return path
    return ROOT / path


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


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of an iteration, totalled over the layers it runs in. ``tokens``: the
    class curve's argument, its GEMMs' rows (the positions it processes; for the MoE op, one
    expert's share of them); ``fixed_s``: seconds added as they are
    (the :class:`CostTerms`); ``shape`` and ``units``: the op is ``units`` repetitions of one
    unit with these dimensions (layer sizes and dtype bytes), which a measured :class:`Profile`
    of that name and shape may time (empty, 0: not profiled)."""

    name: str
    op_class: str
    flops: float
    bytes: float
    launches: int
    tokens: int = 0
    fixed_s: float = 0.0
    shape: tuple[int, ...] = ()
    units: int = 0


@dataclass
class BatchShape:
    """What one iteration computes."""

    prefill: list[tuple[int, int]] = field(default_factory=list)  # (prefix, new) per chunk
    decode: list[int] = field(default_factory=list)  # context length per decoding request
    unique_tokens: int | None = None  # RadixMLP: deduplicated position-wise tokens (N')
    shared_kv_tokens: int = 0  # decode KV token reads saved by shared-context attention
    state_loads: int = 0  # SSM checkpoints copied into running slots (prefix hits)
    state_stores: int = 0  # SSM checkpoints copied out for the prefix cache
    sampled: int | None = None  # positions needing logits (default: decodes + final chunks)

    @property
    def tokens(self) -> int:
        return sum(q for _, q in self.prefill) + len(self.decode)


TimedOp = tuple[Op, float]  # an op and its op_time
#: :meth:`CostModel._position_ops`: the attention projections, the SSM projections, and the
#: ops after the SSM layers' (MLP / MoE, norms), each op with its time
PositionOps = tuple[tuple[TimedOp, ...], tuple[TimedOp, ...], tuple[TimedOp, ...]]
#: position counts :meth:`CostModel._position_ops` remembers (then it starts afresh)
POSITION_MEMO = 4096

#: A decode batch's ops by their place around decode attention (:meth:`CostModel.decode_span_of`):
#: the summed seconds of the ops before it, its constants (None: no decode attention), the
#: seconds of each op after it, and the engine overhead the overlapped loop hides (0: none)
DecodeTemplate = tuple[
    float, tuple[float, float, float, float, float] | None, tuple[float, ...], float
]
#: the op of the engine's CPU work per iteration (``engine.costs``: iteration and sequence
#: overheads), which an overlapped loop runs beside the GPU's
ENGINE_OVERHEAD = "engine_overhead"


class CostModel:
    """Iteration time of a model on a hardware preset, per DESIGN.md "Cost model"."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: Hardware,
        calibration: Calibration | None = None,
        tp: int = 1,
        terms: CostTerms | None = None,
        overlap: bool = False,
    ):
        if tp < 1:
            raise ValueError(f"tensor-parallel degree must be >= 1, got {tp}")
        check_tp(model, tp)
        self.model = model
        self.hw = hardware
        self.calibration = calibration or Calibration()
        self.tp = tp
        self.terms = terms or CostTerms()
        #: the engine's overlapped loop (``engine.overlap``): its CPU work (op
        #: ``engine_overhead``) runs while the GPU computes, so an iteration lasts the longer
        #: of the two instead of their sum
        self.overlap = overlap
        eff = {name: self.calibration.for_class(name, tp) for name in OP_CLASSES}
        ceiling = hardware.fp32_flops / hardware.peak_flops
        for name in CUDA_CORE_CLASSES:  # no efficiency makes CUDA cores beat their FP32 peak
            if eff[name].eta_c > ceiling:
                eff[name] = replace(eff[name], eta_c=ceiling)
        if self.terms.mamba1_scan_scale != 1.0:
            eff["selective_scan"] = eff["selective_scan"].scaled(self.terms.mamba1_scan_scale)
        if self.terms.mamba2_scan_scale != 1.0:
            eff["ssm_scan"] = eff["ssm_scan"].scaled(self.terms.mamba2_scan_scale)
        if self.terms.allreduce_latency_s is not None:
            eff["allreduce"] = replace(eff["allreduce"], t0=self.terms.allreduce_latency_s)
        self.efficiency = eff
        self._rate = {
            name: (e.eta_c * hardware.peak_flops, e.eta_m * hardware.mem_bw, e.t0)
            for name, e in eff.items()
        }

        e = eff["allreduce"]
        self._rate["allreduce"] = (e.eta_c * hardware.peak_flops, e.eta_m * hardware.link_bw, e.t0)
        self._rate["overhead"] = (math.inf, math.inf, 0.0)  # fixed-time terms only
        self._curve = {name: log_curve(e.curve) for name, e in eff.items() if e.curve}
        self._profiles = {
            (name, shape): p
            for (name, shape, t), p in self.calibration.profiles.items()
            if t == tp and not (name == ALLREDUCE and self.terms.allreduce_latency_s is not None)
        }
        # one all-reduce call's message bytes per token, per all-reduce op (its profile's x)
        self._message_bytes_per_token = {ALLREDUCE: model.d_model * model.dtype_bytes}
        if model.n_ssm_layers and model.ssm_kind == "mamba1":
            x_proj_out = model.ssm_dt_rank + 2 * model.ssm_state_dim
            self._message_bytes_per_token[X_PROJ_ALLREDUCE] = x_proj_out * model.dtype_bytes
        self._allreduce_profile = self._profiles.get((ALLREDUCE, ()))
        self._decode_templates: dict[int, DecodeTemplate | None] = {}
        self._position_memo: dict[int, PositionOps] = {}
        self._lm_head_memo: dict[int, TimedOp] = {}
        self._allreduce_memo: dict[int, tuple[TimedOp, ...]] = {}

    # ------------------------------------------------------------------ timing
    def op_time(self, op: Op) -> float:
        if op.units and self._profiles:
            measured = self._profile_of(op)
            if measured is not None:
                profile, x = measured
                return profile.at(x) * op.units + op.fixed_s
        peak, bw, t0 = self._rate[op.op_class]
        t = max(op.flops / peak, op.bytes / bw) + op.launches * t0
        curve = self._curve.get(op.op_class)
        if curve:
            t *= curve_scale(curve, op.tokens)
        return t + op.fixed_s

    def time(self, batch: BatchShape) -> float:
        """Seconds for one iteration computing ``batch`` (0 for an empty batch): the sum of
        :meth:`op_time` over :meth:`ops`, in their order; with :attr:`overlap` the larger of
        the engine overhead and the sum of the other ops."""
        if not batch.prefill and not batch.decode:
            return 0.0
        timed = self._timed_ops(batch)
        if not self.overlap:
            return sum([t for _, t in timed])
        gpu = sum([t for op, t in timed if op.name != ENGINE_OVERHEAD])
        return max(gpu, sum([t for op, t in timed if op.name == ENGINE_OVERHEAD]))

    def _profile_of(self, op: Op) -> tuple[Profile, float] | None:
        """The measured :class:`Profile` that times ``op`` and its argument (an all-reduce's:
        one call's message bytes; every other op's: its tokens), or None."""
        per_token = self._message_bytes_per_token.get(op.name)
        if per_token is not None:
            profile = self._allreduce_profile
            return None if profile is None else (profile, float(op.tokens * per_token))
        profile = self._profiles.get((op.name, op.shape))
        return None if profile is None else (profile, op.tokens)

    def measured(self, op: Op) -> bool:
        """Whether a measured :class:`Profile` times ``op`` (not the roofline)."""
        return bool(op.units) and self._profile_of(op) is not None

    def measured_share(self, batch: BatchShape) -> float:
        """The share of ``batch``'s predicted time timed from measured shapes (0: all modelled)."""
        timed = self._timed_ops(batch) if batch.prefill or batch.decode else []
        total = sum([t for _, t in timed])
        return sum([t for op, t in timed if self.measured(op)]) / total if total else 0.0

    def breakdown(self, batch: BatchShape) -> dict[str, float]:
        """Seconds per op name (for reports and calibration)."""
        return {op.name: t for op, t in self._timed_ops(batch)}

    def prefill_time(self, prefix: int, new: int) -> float:
        """One request prefilling ``new`` tokens after a cached ``prefix``, alone in a batch
        (a hybrid with a prefix hit also loads its checkpoint)."""
        loads = 1 if (prefix and self.model.is_hybrid) else 0
        return self.time(BatchShape(prefill=[(prefix, new)], state_loads=loads))

    def decode_span(
        self, contexts: np.ndarray, steps: int, shared_kv_tokens: int = 0
    ) -> np.ndarray:
        """Durations of ``steps`` consecutive decode-only iterations of the same requests
        (contexts grow by one per step). Every op's FLOPs and bytes are affine in the step, so
        two evaluations give all of them."""
        ctx = np.asarray(contexts, dtype=np.int64)
        return self.decode_span_of(len(ctx), int(ctx.sum()), steps, shared_kv_tokens)

    def decode_span_of(
        self, n: int, context_sum: int, steps: int, shared_kv_tokens: int = 0
    ) -> np.ndarray:
        """:meth:`decode_span` of ``n`` requests whose contexts sum to ``context_sum``.

        Only decode attention depends on the contexts; every other op of a decode batch depends
        on ``n`` alone, so its time is computed once per ``n`` (:meth:`_decode_template`). The
        floats are the step-by-step ones bit for bit: each op's time comes from the same
        formula, and the ops are added to the total in the same order."""
        template = self._decode_template(n)
        if template is None:  # an op other than decode attention depends on the contexts
            # ops read a decode batch's contexts through their sum only: any with that sum
            ctx = [context_sum - n + 1] + [1] * (n - 1) if n else []
            return self._decode_span_generic(ctx, steps, shared_kv_tokens)
        head, var, tail, hidden = template
        if var is None:
            total = np.full(steps, head)
        else:
            peak, bw, launch_s, scale, fixed = var
            a = self._per_gpu(self._attn_decode_op(n, context_sum, shared_kv_tokens))
            b = self._per_gpu(self._attn_decode_op(n, context_sum + n, shared_kv_tokens))
            j = np.arange(steps, dtype=np.float64)
            flops = a.flops + (b.flops - a.flops) * j
            moved = a.bytes + (b.bytes - a.bytes) * j
            total = head + ((np.maximum(flops / peak, moved / bw) + launch_s) * scale + fixed)
        for t in tail:
            total += t
        return np.maximum(total, hidden) if hidden else total

    def _decode_template(self, n: int) -> DecodeTemplate | None:
        """Per ``n``: the summed time of the ops before decode attention, decode attention's
        constants, and the times of the ops after it (None: the ops of a decode batch do not
        have that shape, :meth:`decode_span_of` then builds them per call)."""
        if n in self._decode_templates:
            return self._decode_templates[n]
        ops = self.ops(BatchShape(decode=[1] * n))
        other = self.ops(BatchShape(decode=[2] * n, shared_kv_tokens=1))
        template: DecodeTemplate | None = None
        if [op.name for op in ops] == [op.name for op in other]:
            head, var, tail, hidden = 0.0, None, [], 0.0
            for op, op2 in zip(ops, other, strict=True):
                if op.name == "attn_decode" and var is None:
                    var = self._op_constants(op)
                elif op != op2:
                    break
                elif self.overlap and op.name == ENGINE_OVERHEAD:
                    hidden += self._span_term(op)
                elif var is None:
                    head += self._span_term(op)
                else:
                    tail.append(self._span_term(op))
            else:
                template = (head, var, tuple(tail), hidden)
        self._decode_templates[n] = template
        return template

    def _op_constants(self, op: Op) -> tuple[float, float, float, float, float]:
        """``(peak, bandwidth, launch seconds, curve scale, fixed seconds)`` of ``op``: all of
        its time but its FLOPs and bytes."""
        peak, bw, t0 = self._rate[op.op_class]
        scale = curve_scale(self._curve.get(op.op_class, ((), ())), op.tokens)
        return peak, bw, op.launches * t0, scale, op.fixed_s

    def _span_term(self, op: Op) -> float:
        """``op``'s time as :meth:`_decode_span_generic` adds it (the scale always applied)."""
        if self.measured(op):
            return self.op_time(op)
        peak, bw, launch_s, scale, fixed = self._op_constants(op)
        return (max(op.flops / peak, op.bytes / bw) + launch_s) * scale + fixed

    def _decode_span_generic(
        self, ctx: list[int], steps: int, shared_kv_tokens: int = 0
    ) -> np.ndarray:
        """:meth:`decode_span` from the ops of the first two steps (any model)."""
        ops0 = self.ops(BatchShape(decode=ctx, shared_kv_tokens=shared_kv_tokens))
        ops1 = self.ops(BatchShape(decode=[c + 1 for c in ctx], shared_kv_tokens=shared_kv_tokens))
        j = np.arange(steps, dtype=np.float64)
        total, hidden = np.zeros(steps), 0.0
        for a, b in zip(ops0, ops1, strict=True):
            if self.overlap and a.name == ENGINE_OVERHEAD:  # its seqs are the same every step
                hidden += self.op_time(a)
                continue
            if self.measured(a):  # its tokens (the decode count) are the same every step
                total += self.op_time(a)
                continue
            peak, bw, t0 = self._rate[a.op_class]
            flops = a.flops + (b.flops - a.flops) * j
            moved = a.bytes + (b.bytes - a.bytes) * j
            scale = curve_scale(self._curve.get(a.op_class, ((), ())), a.tokens)  # same each step
            total += (np.maximum(flops / peak, moved / bw) + a.launches * t0) * scale + a.fixed_s
        return np.maximum(total, hidden) if hidden else total

    # ------------------------------------------------------------------ operations
    def ops(self, batch: BatchShape) -> list[Op]:
        """The operations of one iteration (order and names are stable for a given model)."""
        return [op for op, _ in self._timed_ops(batch)]

    def _timed_ops(self, batch: BatchShape) -> list[TimedOp]:
        """:meth:`ops` with each op's :meth:`op_time`. The ops that depend on the batch's
        position count alone (projections, MLP / MoE, norms) come from a memo per count
        (:meth:`_position_ops`), the rest are built per batch."""
        m = self.model
        n_tok = batch.tokens
        pos = batch.unique_tokens if batch.unique_tokens is not None else n_tok
        attn_proj, ssm_proj, after = self._position_ops(pos)
        timed = self._timed
        ops: list[TimedOp] = []
        if m.n_attn_layers:
            ops += attn_proj
            ops += [timed(self._per_gpu(op)) for op in self._attention_batch_ops(batch)]
        if m.n_ssm_layers:
            ops += ssm_proj
            ops += [timed(self._per_gpu(op)) for op in self._ssm_batch_ops(batch)]
        ops += after
        ops += self._output_ops(batch)
        return ops + [timed(op) for op in self._fixed_ops(batch, pos)]

    def _timed(self, op: Op) -> TimedOp:
        return op, self.op_time(op)

    def _position_ops(self, pos: int) -> PositionOps:
        """The per-GPU ops that depend on the position count ``pos`` alone, timed, by their
        place in :meth:`ops`: the attention projections, the SSM projections, and MLP / MoE
        and the norms (memoised per ``pos``; Ops are immutable)."""
        memo = self._position_memo
        if pos in memo:
            return memo[pos]
        m = self.model
        attn = tuple(self._timed(self._per_gpu(op)) for op in self._attention_proj_ops(pos))
        ssm = tuple(self._timed(self._per_gpu(op)) for op in self._ssm_proj_ops(pos))
        after: list[Op] = []
        if m.n_mlp_layers:
            after.append(self._mlp_op(pos))
        if m.n_moe_layers:
            after.append(self._moe_op(pos))
        after.append(self._norms_op(pos))
        entry = attn, ssm, tuple(self._timed(self._per_gpu(op)) for op in after)
        if len(memo) >= POSITION_MEMO:
            memo.clear()
        memo[pos] = entry
        return entry

    def _fixed_ops(self, batch: BatchShape, pos: int) -> list[Op]:
        """The :class:`CostTerms` not tied to an op of the roofline, only when charged (> 0)."""
        terms, ops = self.terms, []
        seqs = len(batch.prefill) + len(batch.decode)
        engine = terms.iteration_overhead_s + terms.sequence_overhead_s * seqs
        if engine > 0:
            ops.append(Op(ENGINE_OVERHEAD, "overhead", 0.0, 0.0, 0, seqs, engine))
        dispatch = terms.moe_dispatch_s_per_token * pos * self.model.n_moe_layers
        if dispatch > 0:
            ops.append(Op("moe_dispatch", "overhead", 0.0, 0.0, 0, pos, dispatch))
        return ops

    def _per_gpu(self, op: Op) -> Op:
        if self.tp == 1 or op.op_class in ("allreduce", "elementwise"):
            return op
        return replace(op, flops=op.flops / self.tp, bytes=op.bytes / self.tp)

    def _gemm(self, name: str, tokens: int, d_in: int, d_out: int, layers: int) -> Op:
        w = self.model.dtype_bytes
        flops = 2.0 * tokens * d_in * d_out * layers
        moved = (d_in * d_out + tokens * (d_in + d_out)) * w * layers
        return Op(name, "gemm", flops, moved, layers, tokens, shape=(d_in, d_out, w), units=layers)

    def _attention_proj_ops(self, pos: int) -> list[Op]:
        m = self.model
        if not m.n_attn_layers:
            return []
        na, D = m.n_attn_layers, m.d_model
        qdim, kvdim = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
        return [
            self._gemm("attn_qkv_proj", pos, D, qdim + 2 * kvdim, na),
            self._gemm("attn_out_proj", pos, qdim, D, na),
        ]

    def _attention_batch_ops(self, batch: BatchShape) -> list[Op]:
        """Prefill and decode attention: what depends on the chunks and the contexts."""
        m = self.model
        na, w = m.n_attn_layers, m.dtype_bytes
        qdim, kvdim = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
        ops: list[Op] = []
        if batch.prefill:
            flops = bytes_ = 0.0
            for prefix, new in batch.prefill:
                flops += 4.0 * qdim * (new * prefix + new * (new + 1) / 2)
                bytes_ += (2 * new * qdim + (prefix + new) * 2 * kvdim) * w
            new_tok = sum(q for _, q in batch.prefill)
            ops.append(Op("attn_prefill", "attn_prefill", flops * na, bytes_ * na, na, new_tok))
        if batch.decode:
            ops.append(
                self._attn_decode_op(len(batch.decode), sum(batch.decode), batch.shared_kv_tokens)
            )
        return ops

    def _attn_decode_op(self, n: int, context_sum: int, shared_kv_tokens: int) -> Op:
        """Decode attention of ``n`` requests whose contexts sum to ``context_sum``."""
        m = self.model
        na, w = m.n_attn_layers, m.dtype_bytes
        qdim, kvdim = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
        ctx = float(context_sum)
        kv_reads = max(ctx - shared_kv_tokens, 0.0)
        flops = 4.0 * qdim * ctx
        bytes_ = (kv_reads * 2 * kvdim + 2 * n * qdim) * w
        return Op("attn_decode", "attn_decode", flops * na, bytes_ * na, na, n)

    def _ssm_proj_ops(self, pos: int) -> list[Op]:
        m = self.model
        if not m.n_ssm_layers:
            return []
        ns, D, N, di = m.n_ssm_layers, m.d_model, m.ssm_state_dim, m.ssm_d_inner
        if m.ssm_kind == "mamba2":
            in_dim = 2 * di + 2 * m.ssm_n_groups * N + m.ssm_n_heads
            return [
                self._gemm("ssm_in_proj", pos, D, in_dim, ns),
                self._gemm("ssm_out_proj", pos, di, D, ns),
            ]
        R = m.ssm_dt_rank
        return [
            self._gemm("ssm_in_proj", pos, D, 2 * di, ns),
            self._gemm("ssm_x_proj", pos, di, R + 2 * N, ns),
            self._gemm("ssm_dt_proj", pos, R, di, ns),
            self._gemm("ssm_out_proj", pos, di, D, ns),
        ]

    def _ssm_batch_ops(self, batch: BatchShape) -> list[Op]:
        """The scan of the prefill chunks, the decode step, the checkpoint copies."""
        m = self.model
        ns, w, N, di = m.n_ssm_layers, m.dtype_bytes, m.ssm_state_dim, m.ssm_d_inner
        conv_ch, K = m.ssm_conv_channels, m.ssm_conv_kernel
        state = m.ssm_state_bytes_per_layer
        if m.ssm_kind == "mamba2":
            scan_tok = 6 * di * N + 2 * K * conv_ch + 10 * di
        else:  # x_proj and dt_proj are GEMMs of their own (_ssm_proj_ops)
            scan_tok = 9 * di * N + 2 * K * di + 10 * di
        ops: list[Op] = []
        prefill_tok = sum(q for _, q in batch.prefill)
        if prefill_tok:
            # activations in and out of conv + scan, plus each sequence's state read and written
            moved = prefill_tok * (conv_ch + 2 * di) * w + 2 * state * len(batch.prefill)
            scan = "ssm_scan" if m.ssm_kind == "mamba2" else "selective_scan"
            flops = scan_tok * prefill_tok * ns
            ops.append(Op("ssm_scan", scan, flops, moved * ns, ns, prefill_tok))
        if batch.decode:
            n = len(batch.decode)
            moved = n * ((conv_ch + 2 * di) * w + 2 * state)
            ops.append(Op("ssm_step", "ssm_step", scan_tok * n * ns, moved * ns, ns, n))
        copies = batch.state_loads + batch.state_stores
        if copies:
            fixed = batch.state_loads * self.terms.state_load_s
            fixed += batch.state_stores * self.terms.state_store_s
            copied = 2.0 * state * copies * ns
            ops.append(Op("ssm_state_copy", "state_copy", 0.0, copied, copies, copies, fixed))
        return ops

    def _mlp_op(self, pos: int) -> Op:
        m = self.model
        mats = 3 if m.mlp_gated else 2
        w, D, inter, n = m.dtype_bytes, m.d_model, m.mlp_intermediate, m.n_mlp_layers
        flops = 2.0 * pos * D * inter * mats * n
        moved = (mats * D * inter + pos * (2 * D + mats * inter)) * w * n
        shape = (D, inter, int(m.mlp_gated), w)
        return Op("mlp", "gemm", flops, moved, 2 * n, pos, shape=shape, units=n)

    def _moe_op(self, pos: int) -> Op:
        m = self.model
        mats = 3 if m.mlp_gated else 2
        w, D, inter, n = m.dtype_bytes, m.d_model, m.moe_intermediate, m.n_moe_layers
        active = min(m.moe_experts, pos * m.moe_top_k)  # distinct experts whose weights are read
        flops = (2.0 * pos * D * m.moe_experts + 2.0 * pos * m.moe_top_k * D * inter * mats) * n
        moved = (active * mats * D * inter + pos * m.moe_top_k * (2 * D + mats * inter)) * w * n
        # the GEMM class curve's argument is a GEMM's rows: an expert's, not the batch's (at
        # the batch's count the dense curve's ridge bump made 128 tokens slower than 1,042)
        rows = max(1, round(pos * m.moe_top_k / m.moe_experts))
        return Op("moe", "gemm", flops, moved, 3 * n, rows)

    def _norms_op(self, pos: int) -> Op:
        m = self.model
        w, D = m.dtype_bytes, m.d_model
        layers = m.n_attn_layers + m.n_ssm_layers + m.n_mlp_layers + m.n_moe_layers
        return Op(
            "norms_residuals",
            "elementwise",
            8.0 * pos * D * layers,
            4.0 * pos * D * w * layers,
            layers,
            pos,
            shape=(D, w),
            units=layers,  # one unit: a norm and a residual add
        )

    def _output_ops(self, batch: BatchShape) -> list[TimedOp]:
        """The LM head over the sampled positions and the tensor-parallel all-reduce, per GPU
        and timed (memoised per sampled count and per position count)."""
        m = self.model
        ops: list[TimedOp] = []
        sampled = (
            batch.sampled if batch.sampled is not None else len(batch.decode) + len(batch.prefill)
        )
        if m.vocab_size and sampled:
            head = self._lm_head_memo.get(sampled)
            if head is None:
                head = self._timed(
                    self._per_gpu(self._gemm("lm_head", sampled, m.d_model, m.vocab_size, 1))
                )
                if len(self._lm_head_memo) >= POSITION_MEMO:
                    self._lm_head_memo.clear()
                self._lm_head_memo[sampled] = head
            ops.append(head)
        if self.tp > 1:
            ops += self._allreduces(batch.tokens)
        return ops

    def _allreduces(self, tokens: int) -> tuple[TimedOp, ...]:
        """The tensor-parallel all-reduces of an iteration over ``tokens`` positions, timed:
        one call per layer of ``tokens x d_model x dtype`` bytes, and for Mamba1 one more per
        SSM layer of its ``x_proj`` output (memoised per count)."""
        timed = self._allreduce_memo.get(tokens)
        if timed is None:
            m = self.model
            layers = m.n_attn_layers + m.n_ssm_layers + m.n_mlp_layers + m.n_moe_layers
            calls = {ALLREDUCE: layers, X_PROJ_ALLREDUCE: m.n_ssm_layers}
            ring = 2.0 * (self.tp - 1) / self.tp
            timed = tuple(
                self._timed(
                    Op(
                        name,
                        "allreduce",
                        0.0,
                        ring * tokens * per_token * calls[name],
                        calls[name],
                        tokens,
                        units=calls[name],
                    )
                )
                for name, per_token in self._message_bytes_per_token.items()
            )
            if len(self._allreduce_memo) >= POSITION_MEMO:
                self._allreduce_memo.clear()
            self._allreduce_memo[tokens] = timed
        return timed
