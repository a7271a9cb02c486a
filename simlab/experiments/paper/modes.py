"""The two semantics the plan runs under (paper mode, default semantics) and the config keys
this checkout has for them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simlab.experiments.paper.layout import CONFIGS
from simlab.experiments.paper.plan import Study


@dataclass(frozen=True)
class Mode:
    """One semantics the whole plan runs under."""

    name: str
    label: str
    compat: str | None
    protocol: str


MODES = (
    Mode("paper", "paper mode", "reference", "paper"),
    Mode("default", "default semantics", None, "robust"),
)


@dataclass(frozen=True)
class Features:
    """Which of the keys the two modes need this checkout has (``policy.compat``,
    ``policy.tuning.protocol``, ``arrivals.gaps``). Without one of the first two both modes run
    without it (``paper.md`` says so); the paper's trace construction needs the third."""

    compat: bool = True
    protocol: bool = True
    arrivals: bool = True

    def missing(self) -> list[str]:
        return [
            text
            for present, text in (
                (self.compat, "policy.compat (both modes ran simlab's semantics)"),
                (self.protocol, "policy.tuning.protocol (both modes ran the default tuner)"),
                (self.arrivals, "arrivals.gaps"),
            )
            if not present
        ]


def compose(overrides: Sequence[str]) -> Any:
    """simlab's config composed with ``overrides`` (Hydra's compose API; nothing is run)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def probe_features() -> Features:
    """What this checkout's configs support (see :class:`Features`)."""
    cfg = compose([])
    marconi = cfg.compare.marconi
    return Features(
        compat="compat" in marconi,
        protocol="protocol" in (marconi.get("tuning") or {}),
        arrivals="gaps" in cfg.arrivals,
    )


def mode_overrides(mode: Mode, study: Study, features: Features) -> list[str]:
    """The overrides that put every policy of ``study`` into ``mode`` (tuned Marconi, one
    tuner process per point: the grid search's result does not depend on it)."""
    out = [f"compare.{p}.compat={mode.compat or 'null'}" for p in study.policies]
    out = out if features.compat else []
    if "marconi" in study.policies:
        out += ["compare.marconi.tuning.enabled=true", "compare.marconi.tuning.workers=1"]
        if features.protocol:
            out.append(f"compare.marconi.tuning.protocol={mode.protocol}")
    return out
