"""Measured shapes: a calibration's measured times of whole ops (:class:`Profile`, the file's
``profiles``), per layer shape and tensor-parallel degree against the token count, and for the
all-reduce one call against its message bytes (Vidur's Llama layers and NCCL runs on A100 and
H100, or the shapes a ``gpu_validate`` run measured on its GPU).

An op whose name, shape (``Op.shape``: the layer dimensions and dtype) and tensor-parallel
degree match a profile is timed from it, ``units x profile(x)`` (plus its ``fixed_s``), instead
of the roofline: GEMM times are a staircase in the token count (cuBLAS picks tiles per shape)
that no model smooth in the tokens follows. Every other op, and every shape nobody measured,
keeps the roofline.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

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


def profiles_from(data: Any) -> Profiles:
    """The ``profiles`` entry of a calibration file: ``{"series": [{"op", "shape", "tp",
    "tokens", "seconds"}, ...]}``."""
    out: Profiles = {}
    for i, entry in enumerate(data.get("series") or []):
        where = f"profiles.series[{i}]"
        try:
            key, profile = _series(entry)
        except KeyError as err:
            raise ValueError(f"{where}: missing {err}") from err
        except (ValueError, TypeError) as err:
            raise ValueError(f"{where}: {err}") from err
        if key in out:
            op, shape, tp = key
            raise ValueError(f"{where}: a second series for {op} {list(shape)} at tp {tp}")
        out[key] = profile
    return out


def _series(entry: Any) -> tuple[tuple[str, tuple[int, ...], int], Profile]:
    """One ``profiles.series`` entry: its key in :data:`Profiles` and its profile."""
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
    return (op, shape, tp), profile
