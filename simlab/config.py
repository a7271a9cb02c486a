"""Typed views of the run configuration, validated before any work starts.

Hydra composes the YAML tree (``configs/``); these dataclasses are what the engine reads, so a
bad value (a zero cache, a negative rate) fails here with a message naming the key, before a
trace is loaded or a policy run. The engine and the plug-ins validate their own parameters when
they are instantiated (``simlab.run.plan.build_engine`` / ``policy_step``), also before any work;
:func:`simlab.run.plan.plan_run` runs every check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

GB = 1e9
ARRIVAL_MODES = ("poisson", "uniform", "trace", "timestamps", "azure")
#: within-session gap models (``arrivals.gaps``; :mod:`traces.arrival_modes`)
ARRIVAL_GAPS = ("exponential", "typing", "poisson_seconds")
#: modes whose within-session gaps follow ``arrivals.gaps`` (the others read the trace's clock)
GAP_MODES = ("poisson", "uniform", "azure")
AZURE_FILES = ("conv", "code")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


def number(key: str, value: Any) -> float:
    """``value`` if it is a real number (not a bool or a string); :class:`ConfigError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: must be a number (got {value!r})")
    return float(value)


@dataclass(frozen=True)
class CacheSettings:
    """``size_gb``: the cache's bytes. ``ssm_gb``: None, KV and SSM states share them; a number,
    SSM states get a pool of their own of that size (SGLang's Mamba slot pool) and KV the rest
    (SGLang's default ``--mamba-full-memory-ratio 0.9`` is ``ssm_gb = size_gb * 0.9 / 1.9``).
    ``host_gb`` / ``host_bw_gbps``: a host-memory tier below the GPU cache and its bandwidth
    (:mod:`simlab.cache.host_tier`); it does not count against the GPU memory check."""

    size_gb: float
    page_size: int = 1
    ssm_gb: float | None = None
    host_gb: float | None = None  # a host-memory tier (simlab.cache.host_tier); None: none
    host_bw_gbps: float | None = None  # host <-> GPU bandwidth, GB/s (inf: free loads)
    #: a block pool's fast paths (:mod:`simlab.fastpaths.blocks.replay`): an LRU's capacities from one
    #: stack-distance pass, FIFO's and Belady's on block ids; False: request by request (a
    #: ``size_gb`` list back to back)
    one_pass: bool = True
    #: replays compiled with numba, the same records: FIFO's and Belady's over block ids
    #: (:mod:`simlab.fastpaths.blocks.kernel`), judicious or fine-grained admission with Marconi's or LRU
    #: eviction on the token tree (:mod:`simlab.fastpaths.radix.kernel`); "auto" when numba is installed
    #: and the run is large enough to repay loading it, True always (numba must be installed),
    #: False never
    compiled: bool | str = "auto"

    def __post_init__(self) -> None:
        if (
            isinstance(self.size_gb, bool)
            or not isinstance(self.size_gb, int | float)
            or not self.size_gb > 0
        ):
            raise ConfigError(
                f"cache.size_gb must be a positive number of GB (or inf), got {self.size_gb!r}"
            )
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise ConfigError(f"cache.page_size must be an integer >= 1, got {self.page_size!r}")
        if self.ssm_gb is not None and not 0 < number("cache.ssm_gb", self.ssm_gb) < self.size_gb:
            raise ConfigError(
                f"cache.ssm_gb: the SSM pool must be more than 0 and less than cache.size_gb "
                f"({self.size_gb}), got {self.ssm_gb!r}"
            )
        self._check_host_tier()
        if not isinstance(self.one_pass, bool):
            raise ConfigError(f"cache.one_pass: must be true or false (got {self.one_pass!r})")
        self._check_compiled()

    def _check_compiled(self) -> None:
        """``compiled`` is auto, true or false; true needs numba installed."""
        if not (isinstance(self.compiled, bool) or self.compiled == "auto"):
            raise ConfigError(
                f"cache.compiled: must be auto, true or false (got {self.compiled!r})"
            )
        from simlab.util.numba_import import available  # finds numba without importing it

        if self.compiled is True and not available():
            raise ConfigError(
                "cache.compiled=true: numba is not installed (pip install 'simlab[fast]'), "
                "or set cache.compiled=auto"
            )

    def _check_host_tier(self) -> None:
        """``host_gb`` (> 0 GB, inf allowed) needs ``host_bw_gbps`` (> 0 GB/s, inf: free loads);
        a bandwidth without a host tier, or a host tier beside a separate SSM pool, is an error."""
        if self.host_gb is None:
            if self.host_bw_gbps is not None:
                raise ConfigError(
                    f"cache.host_bw_gbps: set ({self.host_bw_gbps!r}) without a host tier; "
                    "set cache.host_gb too, or leave both null"
                )
            return
        if not number("cache.host_gb", self.host_gb) > 0:
            raise ConfigError(
                f"cache.host_gb: must be a positive number of GB (or inf), got {self.host_gb!r}"
            )
        if self.host_bw_gbps is None:
            raise ConfigError(
                "cache.host_bw_gbps: a host tier (cache.host_gb) needs its host<->GPU bandwidth "
                "in GB/s (inf for free loads)"
            )
        if not number("cache.host_bw_gbps", self.host_bw_gbps) > 0:
            raise ConfigError(
                f"cache.host_bw_gbps: must be a positive number of GB/s (or inf), "
                f"got {self.host_bw_gbps!r}"
            )
        if self.ssm_gb is not None:
            raise ConfigError(
                "cache.host_gb: a host tier is not supported with a separate SSM pool "
                "(cache.ssm_gb); leave one of them null"
            )

    @property
    def host_bytes(self) -> float | None:
        """The host tier's bytes (None: no host tier)."""
        if self.host_gb is None:
            return None
        return math.inf if math.isinf(self.host_gb) else self.host_gb * GB

    @property
    def host_bw_bytes(self) -> float | None:
        """The host tier's bandwidth in bytes/s (None: no host tier)."""
        if self.host_bw_gbps is None:
            return None
        return math.inf if math.isinf(self.host_bw_gbps) else self.host_bw_gbps * GB

    @property
    def capacity_bytes(self) -> float:
        """All the cache's bytes (KV and states together)."""
        return math.inf if math.isinf(self.size_gb) else self.size_gb * GB

    @property
    def kv_bytes(self) -> float:
        """Bytes for KV: all of them with one shared budget, else what the SSM pool leaves."""
        if self.ssm_gb is None:
            return self.capacity_bytes
        return self.capacity_bytes - self.ssm_gb * GB

    @property
    def ssm_bytes(self) -> float | None:
        """The SSM pool's bytes (None: shared with KV)."""
        return None if self.ssm_gb is None else self.ssm_gb * GB


@dataclass(frozen=True)
class MetricSettings:
    """What counts as a request hit: at least ``request_hit_min_tokens`` reused tokens and at
    least ``request_hit_min_share`` of the input (a 3-token chat-template prefix is no hit)."""

    request_hit_min_tokens: int = 16
    request_hit_min_share: float = 0.0

    def __post_init__(self) -> None:
        tokens = self.request_hit_min_tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ConfigError(
                f"metrics.request_hit_min_tokens: must be an integer >= 1 (got {tokens!r})"
            )
        if not 0 <= number("metrics.request_hit_min_share", self.request_hit_min_share) <= 1:
            raise ConfigError(
                f"metrics.request_hit_min_share: must be in [0, 1] "
                f"(got {self.request_hit_min_share!r})"
            )

    @property
    def rule(self) -> str:
        """The rule in words, for summaries and reports."""
        rule = f">= {self.request_hit_min_tokens} tokens"
        if self.request_hit_min_share > 0:
            rule += f" and >= {self.request_hit_min_share:.0%} of the input"
        return rule


@dataclass(frozen=True)
class ArrivalSettings:
    """``arrivals.*`` (:mod:`traces.arrival_modes`). ``mode``: how sessions start (``uniform``:
    session ``i`` at ``i / session_rate``). ``gaps``: the gaps within a session for modes
    poisson, uniform and azure: ``exponential`` (mean ``think_time_mean`` s, the default),
    ``typing`` (the request's user message typed at ``typing_wpm`` words/min) or
    ``poisson_seconds`` (Poisson(``response_time``) whole seconds)."""

    mode: str = "poisson"
    session_rate: float = 1.0
    think_time_mean: float = 5.0
    azure: str = "conv"
    azure_path: str | None = None
    time_scale: float = 1.0
    gaps: str = "exponential"
    typing_wpm: float = 90.0
    response_time: float = 7.5

    def __post_init__(self) -> None:
        for key in ("session_rate", "think_time_mean", "time_scale", "typing_wpm"):
            number(f"arrivals.{key}", getattr(self, key))
        if self.azure not in AZURE_FILES:
            raise ConfigError(f"arrivals.azure: must be one of {AZURE_FILES} (got {self.azure!r})")
        if not self.time_scale > 0:
            raise ConfigError(f"arrivals.time_scale: must be > 0 (got {self.time_scale!r})")
        if self.mode not in ARRIVAL_MODES:
            raise ConfigError(f"arrivals.mode must be one of {ARRIVAL_MODES}, got {self.mode!r}")
        if not self.session_rate > 0:
            raise ConfigError(
                f"arrivals.session_rate must be > 0 sessions/s, got {self.session_rate!r}"
            )
        if not self.think_time_mean >= 0:
            raise ConfigError(
                f"arrivals.think_time_mean must be >= 0 s, got {self.think_time_mean!r}"
            )
        self._check_gaps()

    def _check_gaps(self) -> None:
        """``gaps`` known and usable with ``mode``; its parameters finite and in range."""
        if self.gaps not in ARRIVAL_GAPS:
            raise ConfigError(f"arrivals.gaps must be one of {ARRIVAL_GAPS}, got {self.gaps!r}")
        if self.gaps != "exponential" and self.mode not in GAP_MODES:
            raise ConfigError(
                f"arrivals.gaps={self.gaps} applies to arrivals.mode {'|'.join(GAP_MODES)} "
                f"only; mode {self.mode} takes its gaps from the trace"
            )
        if not 0 < self.typing_wpm < math.inf:
            raise ConfigError(
                f"arrivals.typing_wpm must be a finite number > 0 words/min, "
                f"got {self.typing_wpm!r}"
            )
        response_time = number("arrivals.response_time", self.response_time)
        if not 0 <= response_time < math.inf:
            raise ConfigError(
                f"arrivals.response_time must be a finite number >= 0 s, got {self.response_time!r}"
            )


def _section(cfg: DictConfig, key: str) -> dict[str, Any]:
    node = cfg.get(key)
    if node is None:
        raise ConfigError(f"missing config section {key!r}")
    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


def _known_keys(settings: type, key: str, section: dict[str, Any]) -> dict[str, Any]:
    """``section`` if each of its keys is a field of the ``settings`` dataclass, else a
    :class:`ConfigError` naming the first unknown key (a typo would otherwise be a TypeError)."""
    known = {f.name for f in fields(settings) if f.init}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    return section


def selected_policies(cfg: DictConfig) -> dict[str, DictConfig]:
    """``+policy=NAME`` runs that one policy; otherwise the standard set under ``compare``."""
    if cfg.get("policy") is not None:
        chosen = {str(cfg.policy.name): cfg.policy}
    else:
        chosen = {str(p.name): p for p in (cfg.get("compare") or {}).values()}
    if not chosen:
        raise ConfigError("no policy selected: use +policy=NAME or keep the `compare` set")
    for name, pcfg in chosen.items():
        for part in ("admission", "eviction"):
            if pcfg.get(part) is None or "_target_" not in pcfg[part]:
                raise ConfigError(f"policy {name!r} lacks an {part} plug-in (_target_)")
    return chosen


#: top-level switches: true or false, nothing else
SWITCHES = ("bounds.enabled", "report", "overwrite")


def check_switches(cfg: DictConfig) -> None:
    for key in SWITCHES:
        value = OmegaConf.select(cfg, key, default=False)
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false (got {value!r})")


def run_settings(cfg: DictConfig) -> RunSettings:
    """Validate the composed config and return its typed view (raises :class:`ConfigError`)."""
    seed = cfg.get("seed", 0)
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    check_switches(cfg)
    return RunSettings(
        seed=seed,
        cache=CacheSettings(**_known_keys(CacheSettings, "cache", _section(cfg, "cache"))),
        arrivals=ArrivalSettings(
            **_known_keys(ArrivalSettings, "arrivals", _section(cfg, "arrivals"))
        ),
        metrics=MetricSettings(
            **_known_keys(
                MetricSettings, "metrics", _section(cfg, "metrics") if cfg.get("metrics") else {}
            )
        ),
        cluster=ClusterSettings.from_config(cfg.get("cluster")),
    )


#: ``cluster.router`` (:mod:`simlab.engines.cluster`)
ROUTERS = (
    "round_robin",
    "least_loaded",
    "random",
    "prefix_aware",
    "hybrid_aware",
    "session_affinity",
)


@dataclass(frozen=True)
class ClusterSettings:
    """``cluster.*``, validated (each error names its key)."""

    replicas: int = 1
    router: str = "round_robin"
    load_weight: float = 1.0
    router_lag_s: float = 0.0
    seed: int | None = None
    disaggregated: bool = False
    prefill_replicas: int | None = None  # null: half the replicas (at least one)
    link_bw_gbps: float | None = None  # prefill -> decode KV transfer (GB/s; inf: free)

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise ConfigError(f"cluster.replicas: must be an integer >= 1 (got {self.replicas!r})")
        if self.replicas < 1:
            raise ConfigError(f"cluster.replicas: must be an integer >= 1 (got {self.replicas!r})")
        if self.router not in ROUTERS:
            raise ConfigError(
                f"cluster.router: must be one of {'|'.join(ROUTERS)} (got {self.router!r})"
            )
        _non_negative("cluster.load_weight", self.load_weight)
        _non_negative("cluster.router_lag_s", self.router_lag_s)
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ConfigError(
                f"cluster.seed: must be a non-negative integer or null (got {seed!r})"
            )
        self._check_disaggregation()

    def _check_disaggregation(self) -> None:
        if not isinstance(self.disaggregated, bool):
            raise ConfigError(
                f"cluster.disaggregated: must be true or false (got {self.disaggregated!r})"
            )
        if not self.disaggregated:
            for key in ("prefill_replicas", "link_bw_gbps"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"cluster.{key}: only with cluster.disaggregated=true")
            return
        if self.replicas < 2:
            raise ConfigError(
                "cluster.disaggregated: needs cluster.replicas >= 2 (prefill and decode "
                f"replicas), got {self.replicas}"
            )
        p = self.prefill_replicas
        if p is not None and (
            isinstance(p, bool) or not isinstance(p, int) or not 1 <= p < self.replicas
        ):
            raise ConfigError(
                f"cluster.prefill_replicas: must be an integer from 1 to cluster.replicas - 1 "
                f"= {self.replicas - 1} (got {p!r})"
            )
        bw = self.link_bw_gbps
        if bw is None:
            raise ConfigError(
                "cluster.link_bw_gbps: a disaggregated cluster moves each request's KV from its "
                "prefill to its decode replica; give the link bandwidth in GB/s (inf: free)"
            )
        if isinstance(bw, bool) or not isinstance(bw, int | float) or not bw > 0:
            raise ConfigError(f"cluster.link_bw_gbps: must be a number > 0 or inf (got {bw!r})")

    @property
    def n_prefill(self) -> int:
        """Prefill replicas of a disaggregated cluster (the first ones; the rest decode)."""
        return self.prefill_replicas or max(1, self.replicas // 2)

    @classmethod
    def from_config(cls, section: Any) -> ClusterSettings:
        """From the ``cluster`` mapping (None: the defaults); an unknown key is an error."""
        values = dict(section or {})
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ConfigError(f"cluster.{key}: unknown key (known: {', '.join(sorted(known))})")
        return cls(**values)


def _non_negative(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: must be a number >= 0 (got {value!r})")
    if not 0 <= value < math.inf:
        raise ConfigError(f"{key}: must be a finite number >= 0 (got {value!r})")


@dataclass(frozen=True)
class RunSettings:
    """The typed settings of a run: ``seed``, ``cache.*``, ``arrivals.*``, ``metrics.*`` and
    ``cluster.*`` (the policies, engine and trace: :class:`simlab.run.plan.RunPlan`)."""

    seed: int
    cache: CacheSettings
    arrivals: ArrivalSettings
    metrics: MetricSettings = MetricSettings()
    cluster: ClusterSettings = ClusterSettings()
