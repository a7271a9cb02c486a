"""``policy.tuning``: the tuning protocols and their settings, validated (the protocols:
:mod:`simlab.engines.tuning`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OBJECTIVES = ("token_hit_rate", "flops_saved")
SNAPSHOTS = ("start", "first_eviction")
#: The reference code's grid (``ConfigTuner.tune_config``): 0, 0.1, ..., 2.0.
PAPER_GRID = tuple(round(0.1 * i, 1) for i in range(21))
#: 0, 0.1, ..., 1.0. Both terms of Marconi's utility are min-max normalised over the candidates,
#: so with alpha > 1 the most FLOP-efficient candidate outlives even the most recent one however
#: old it is: stale long prefixes are never evicted. Measured (replay, fixed alpha, 29 points of
#: ShareGPT, SWE-bench and LMSys): the best alpha <= 1 beats the best alpha > 1 at every point
#: (by 0.3 to 39 points of token hit rate), and every alpha in 1.1-2.0 is below SGLang+ at 17 of
#: the 18 ShareGPT points and at all 8 SWE-bench ones (by up to 45 points), yet a short replay
#: window rates them well (it is too short to see the cache fill with stale prefixes): that is
#: how the paper's protocol lands 20 points below SGLang+.
ROBUST_GRID = PAPER_GRID[:11]

#: Each protocol's value of every ``policy.tuning`` key that the config leaves null. ``robust``
#: is the measured default: tuned Marconi within 0.5 points of SGLang+'s token hit rate at every
#: point of the Figs. 7-8 grids and Fig. 11 (ShareGPT, LMSys, SWE-bench; README "Alpha
#: tuning"). It re-tunes every 50 requests so that a choice that stopped paying is replaced
#: soon, and scores each replay on its last 50 requests only: the whole window is replayed to
#: build the cache each alpha would leave, but its early requests say how an alpha did, not what
#: its cache is worth next. Scoring the whole window let an alpha that wins a thrashing window
#: (SWE-bench at high contention) leave a cache worth less for the long requests after it: 14
#: of the 72 SWE-bench points fell more than 0.5 points below SGLang+ (worst -4.0). A ``margin``
#: (0.005 and 0.01 measured) did not lower the worst point, so it is 0.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "paper": {
        "grid": PAPER_GRID,
        "bootstrap_multiplier": 5.0,
        "objective": "flops_saved",
        "snapshot": "start",
        "score_last": 500,
        "retune_every": None,
        "first_window": None,
        "window": None,
        "margin": 0.0,
    },
    "robust": {
        "grid": ROBUST_GRID,
        "bootstrap_multiplier": 5.0,
        "objective": "token_hit_rate",
        "snapshot": "first_eviction",
        "score_last": 50,
        "retune_every": 50,
        "first_window": None,
        "window": None,
        "margin": 0.0,
    },
}


@dataclass(frozen=True)
class TuningSettings:
    """``policy.tuning``, resolved against its protocol and validated (a bad value raises
    ``ValueError`` naming the key). Build it with :meth:`resolve` (or :meth:`from_config`): the
    field defaults are the ``robust`` protocol's."""

    enabled: bool = False
    protocol: str = "robust"
    grid: tuple[float, ...] = ROBUST_GRID
    bootstrap_multiplier: float = PROTOCOLS["robust"]["bootstrap_multiplier"]
    objective: str = PROTOCOLS["robust"]["objective"]
    snapshot: str = PROTOCOLS["robust"]["snapshot"]
    score_last: int | None = PROTOCOLS["robust"]["score_last"]
    retune_every: int | None = PROTOCOLS["robust"]["retune_every"]
    first_window: int | None = PROTOCOLS["robust"]["first_window"]
    window: int | None = PROTOCOLS["robust"]["window"]
    margin: float = PROTOCOLS["robust"]["margin"]
    workers: int = 2
    #: fewer tunings than this in a run: a caveat (a WARNING and ``summary.json``'s ``caveats``)
    min_tunings: int = 1

    def __post_init__(self) -> None:
        _check_choice("protocol", self.protocol, tuple(PROTOCOLS))
        object.__setattr__(self, "grid", _checked_grid(self.grid))
        if not (_is_number(self.bootstrap_multiplier) and self.bootstrap_multiplier > 0):
            raise ValueError(
                f"policy.tuning.bootstrap_multiplier must be > 0, got {self.bootstrap_multiplier!r}"
            )
        _check_choice("objective", self.objective, OBJECTIVES)
        _check_choice("snapshot", self.snapshot, SNAPSHOTS)
        if not (_is_number(self.margin) and 0 <= self.margin < math.inf):
            raise ValueError(f"policy.tuning.margin must be a number >= 0, got {self.margin!r}")
        for key, nullable in (
            ("score_last", True),
            ("retune_every", True),
            ("first_window", True),
            ("window", True),
            ("workers", False),
        ):
            _check_count(key, getattr(self, key), nullable)
        if not (isinstance(self.min_tunings, int) and not isinstance(self.min_tunings, bool)
                and self.min_tunings >= 0):  # fmt: skip
            raise ValueError(
                f"policy.tuning.min_tunings must be an integer >= 0, got {self.min_tunings!r}"
            )

    @classmethod
    def resolve(cls, **values: Any) -> TuningSettings:
        """Settings of ``values`` (``policy.tuning`` keys); null/absent keys take the value of
        ``protocol`` (default ``robust``)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"policy.tuning: unknown key(s) {unknown}; known: {sorted(known)}")
        protocol = values.get("protocol") or "robust"
        _check_choice("protocol", protocol, tuple(PROTOCOLS))
        given = {k: v for k, v in values.items() if v is not None}
        if "grid" in given:
            given["grid"] = tuple(given["grid"])
        return cls(**(PROTOCOLS[protocol] | given | {"protocol": protocol}))

    @classmethod
    def from_config(cls, cfg: Any) -> TuningSettings | None:
        """Settings from a ``policy.tuning`` mapping (or settings); None when disabled/absent."""
        if cfg is None:
            return None
        if isinstance(cfg, TuningSettings):
            return cfg if cfg.enabled else None
        if not isinstance(cfg, Mapping):
            raise ValueError(f"policy.tuning must be a mapping, got {cfg!r}")
        settings = cls.resolve(**{str(k): v for k, v in cfg.items()})
        return settings if settings.enabled else None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"policy.tuning.{key} must be one of {allowed}, got {value!r}")


def _checked_grid(grid: Any) -> tuple[float, ...]:
    """The grid sorted and deduplicated: finite alphas >= 0, 0 among them."""
    try:
        alphas = tuple(sorted({float(a) for a in grid}))
    except (TypeError, ValueError):
        raise ValueError(f"policy.tuning.grid must be a list of alphas, got {grid!r}") from None
    if not alphas or not all(math.isfinite(a) and a >= 0 for a in alphas):
        raise ValueError(f"policy.tuning.grid must be finite alphas >= 0, got {list(grid)!r}")
    if alphas[0] != 0.0:
        raise ValueError(
            "policy.tuning.grid must contain 0 (recency only: the alpha of the bootstrap "
            f"period, always a candidate), got {list(grid)!r}"
        )
    return alphas


def _check_count(key: str, value: Any, nullable: bool) -> None:
    """``policy.tuning.KEY`` must be an integer >= 1 (or null when ``nullable``)."""
    if value is None and nullable:
        return
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return
    null = " or null" if nullable else ""
    raise ValueError(f"policy.tuning.{key} must be an integer >= 1{null}, got {value!r}")
