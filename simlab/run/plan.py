"""``plan_run(cfg) -> RunPlan``: the one place that reads the composed config.

It runs every check before any work (the YAML only picks) and returns what a run needs, typed:
the run settings (:mod:`simlab.config`), the model, each selected policy
(:class:`simlab.run.policy.PolicySpec`), the bound, the engine, the trace
(:class:`simlab.run.trace.TraceSpec`), the output directory and the config to save. Nothing past
it receives a ``DictConfig``; a bad value raises :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from simlab.config import ClusterSettings, ConfigError, RunSettings, run_settings, selected_policies
from simlab.engines.base import Engine, MemoryChecked, Overheads
from simlab.engines.replay import ReplayEngine
from simlab.engines.step import RequestStep
from simlab.engines.timed.pool_sizing import KvPool
from simlab.engines.tuning.settings import TuningSettings
from simlab.model.spec import ModelSpec
from simlab.run.checks import check_capacity, check_loader_options, check_writable
from simlab.run.compat import semantics_for, with_compat
from simlab.run.policy import PolicySpec, policy_step
from simlab.run.routes import on_pool
from simlab.run.trace import TraceSpec

log = logging.getLogger(__name__)

#: ``cache.size_gb=engine``: the KV pool the modelled engine allocates on its GPUs
ENGINE_POOL = "engine"


@dataclass(frozen=True)
class RunPlan:
    """A composed config, validated: everything a run needs, before it loads anything.
    ``model``: as the engine's GPUs hold it (:meth:`MemoryChecked.held`: with ``engine.tp``
    above the KV heads, each is copied, and a token's KV grows with the copies);
    ``bounds``: ``bounds.enabled``; ``clairvoyant``: the bound's policy (None: none);
    ``config``: the resolved config as run, saved in ``summary.json``; ``breakdown``:
    ``reuse_breakdown`` (:mod:`simlab.run.breakdown`)."""

    settings: RunSettings
    model: ModelSpec
    policies: dict[str, PolicySpec]
    engine: Engine
    trace: TraceSpec
    out_dir: Path | None = None
    overwrite: bool = False
    bounds: bool = False
    clairvoyant: PolicySpec | None = None
    config: dict[str, Any] = field(default_factory=dict)
    breakdown: bool = True


def plan_run(cfg: DictConfig) -> RunPlan:
    """Every check of the composed config, in one place and before any work: the typed run
    settings, the model, the trace loader's options, each selected policy's plug-ins and
    controllers, the bound, the engine and the output directory. Raises :class:`ConfigError`
    naming the key."""
    sized = engine_sized(cfg)
    if sized:
        cfg = on_shared_pool(cfg)
    elif cfg.get("engine") is not None and cfg.engine.get("memory_fraction") is not None:
        raise ConfigError("engine.memory_fraction is read only with cache.size_gb=engine")
    settings = run_settings(cfg)
    policies = {name: policy_spec(name, pcfg) for name, pcfg in selected_policies(cfg).items()}
    try:
        configured = ModelSpec.from_config(cfg.model)
    except ValueError as err:
        raise ConfigError(f"model: {err}") from err
    engine = build_engine(cfg)
    # the caches size with the model as the engine's GPUs hold it (replicated KV heads)
    model = engine.held(configured) if isinstance(engine, MemoryChecked) else configured
    pool = engine_pool(engine, model, cfg) if sized else None
    if pool is not None:
        settings = replace(settings, cache=replace(settings.cache, size_gb=pool.gb))
    block_size = int(cfg.trace.get("block_size") or 1)
    check_capacity(settings, model, block_size)
    check_loader_options(cfg.trace)
    steps = [policy_step(spec, model, settings) for spec in policies.values()]
    for step in steps:
        why = step.admission.pool_only(model.is_hybrid)
        if why is not None and not on_pool(step, engine, block_size):
            raise ConfigError(why)
    warn_caveats(steps, model)
    clairvoyant = bound_policy(cfg, model, settings)
    if isinstance(engine, MemoryChecked):
        tree = not all(on_pool(step, engine, block_size) for step in steps)
        engine.check_memory(model, settings.cache.size_gb, reserve=tree)
    out_dir = output_dir(cfg)
    check_writable(out_dir)
    config = saved_config(cfg)
    pooled = any(on_pool(step, engine, block_size) for step in steps)
    record_engine(config, engine, pool, pooled)
    if configured.source:  # model=hf: what its config.json resolved to, in summary.json
        config["model_resolved"] = configured.config_fields()
    if model.kv_bytes_per_token != configured.kv_bytes_per_token:  # engine.tp copies the KV
        copies = ("mla_kv_copies", model.mla_kv_copies) if model.attn_kind == "mla" else None
        config["kv_replicated"] = dict([copies or ("kv_heads", model.n_kv_heads)])
        config["kv_replicated"]["kv_bytes_per_token"] = model.kv_bytes_per_token
    return RunPlan(
        settings,
        model,
        policies,
        engine,
        trace_spec(cfg),
        out_dir,
        overwrite=bool(cfg.get("overwrite", False)),
        bounds=bounds_enabled(cfg),
        clairvoyant=clairvoyant,
        config=config,
        breakdown=breakdown_enabled(cfg),
    )


def engine_sized(cfg: DictConfig) -> bool:
    """Whether ``cache.size_gb`` is ``engine``: the KV pool the modelled engine allocates."""
    cache = cfg.get("cache")
    return cache is not None and cache.get("size_gb") == ENGINE_POOL


def on_shared_pool(cfg: DictConfig) -> DictConfig:
    """``cfg`` for ``cache.size_gb=engine``: one pool that running requests and the prefix
    cache share (``engine.kv_pool=shared``, ``engine.running_memory_gb=0``), as the engines
    keep it; its size is the engine's (:meth:`MemoryChecked.engine_pool`), set once the engine
    is built (1 GB until then)."""
    engine = cfg.get("engine")
    if engine is None or "kv_pool" not in engine:
        raise ConfigError("cache.size_gb=engine: the engine's pool needs engine=timed")
    cfg = cfg.copy()
    for key, value in (("kv_pool", "shared"), ("running_memory_gb", 0)):
        if cfg.engine[key] != value:
            log.info("cache.size_gb=engine: engine.%s=%s (was %s)", key, value, cfg.engine[key])
            cfg.engine[key] = value
    cfg.cache.size_gb = 1.0
    return cfg


def record_engine(
    config: dict[str, Any], engine: Engine, pool: KvPool | None, pooled: bool = False
) -> None:
    """What ``summary.json`` keeps of the engine beside its config (the caveats go on the
    report too): the pool ``cache.size_gb=engine`` sized, the settings left null that took the
    engine's defaults (the replay engine's budget where a step runs on vLLM's pool,
    ``pooled``), and the caveats of zero overheads and of other scheduling."""
    if pool is not None:
        config["cache"]["size_gb"] = pool.gb
        config["engine_pool"] = pool.row()
    if isinstance(engine, ReplayEngine) and pooled:
        record_resolved(config, engine.resolved())
    if not isinstance(engine, Overheads):
        return
    record_resolved(config, engine.resolved())  # null, or engine.overheads=fitted
    for key, line in (
        ("engine_overheads", engine.overheads_caveat()),
        ("engine_defaults", engine.defaults_caveat()),
    ):
        if line:
            log.warning("%s", line)
            config[key] = line


def record_resolved(config: dict[str, Any], resolved: dict[str, tuple[Any, str]]) -> None:
    """Each engine setting ``{key: (value, whose)}`` took (a dotted key nests), logged, in the
    saved config, and whose value it is in ``config.engine_resolved``."""
    for key, (value, whose) in resolved.items():
        log.info("engine.%s: %s, %s", key, whose, value)
        *parents, leaf = key.split(".")
        node = config["engine"]
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
        config.setdefault("engine_resolved", {})[key] = whose


def engine_pool(engine: Engine, model: ModelSpec, cfg: DictConfig) -> KvPool:
    """``cache.size_gb=engine``: the pool the engine sizes for ``model`` (as its GPUs hold it),
    logged once."""
    if not isinstance(engine, MemoryChecked):
        raise ConfigError("cache.size_gb=engine: the engine's pool needs engine=timed")
    pool = engine.engine_pool(model)
    log.info(
        "cache.size_gb=engine: %s's KV pool on %s GPU(s), %.2f GB (%s tokens; memory fraction "
        "%g), shared by running requests and the prefix cache",
        cfg.engine.backend, cfg.engine.tp, pool.gb, f"{pool.tokens:,}", pool.fraction,
    )  # fmt: skip
    if pool.caveat:
        log.warning("cache.size_gb=engine: %s (summary.json's engine_pool)", pool.caveat)
    return pool


def policy_spec(name: str, pcfg: Mapping[str, Any]) -> PolicySpec:
    """A policy's config (``policy`` or a ``compare`` entry), resolved to plain values and
    checked: its ``compat`` preset, ``semantics`` and ``tuning`` (:class:`ConfigError` naming
    the policy; its plug-ins are checked when :func:`policy_step` builds them)."""
    if isinstance(pcfg, DictConfig):
        pcfg = cast(dict[str, Any], OmegaConf.to_container(pcfg, resolve=True))
    try:
        config = with_compat(pcfg)
        semantics = semantics_for(config)
        tuning = TuningSettings.from_config(config.get("tuning"))
    except ValueError as err:
        raise ConfigError(f"policy {name!r}: {err}") from err
    return PolicySpec(
        name,
        dict(config["admission"]),
        dict(config["eviction"]),
        semantics,
        tuning,
        config.get("block_size"),
    )


def warn_caveats(steps: list[RequestStep], model: ModelSpec) -> None:
    """One warning line per setting that disables reuse (``summary.json``'s ``caveats``), and
    one per engine default that changes the model's state bytes or splits its memory
    (``engine_defaults``)."""
    for step in steps:
        for caveat in [*step.admission.caveats(step.cache.hybrid), *step.notes]:
            log.warning("%s: %s", step.policy, caveat)
        if step.state_pool is not None and step.state_pool.warning:
            log.warning("%s: %s", step.policy, step.state_pool.warning)
        engine = step.cache.model
        if engine.ssm_state_bytes != model.ssm_state_bytes:
            log.warning(
                "%s: the engine keeps %s's SSM state at %d bytes a value (the model config says"
                " %d): %s bytes a state, not %s (summary.json's engine_defaults; the policy's"
                " SSM dtype setting overrides it)",
                step.policy,
                model.name,
                engine.ssm_state_dtype_bytes,
                model.ssm_state_dtype_bytes,
                f"{engine.ssm_state_bytes:,}",
                f"{model.ssm_state_bytes:,}",
            )


def bounds_enabled(cfg: DictConfig) -> bool:
    return bool(cfg.get("bounds") and cfg.bounds.get("enabled"))


def breakdown_enabled(cfg: DictConfig) -> bool:
    """``reuse_breakdown``: true or false (default true; :class:`ConfigError` otherwise)."""
    value = cfg.get("reuse_breakdown", True)
    if not isinstance(value, bool):
        raise ConfigError(f"reuse_breakdown: must be true or false (got {value!r})")
    return value


def bound_policy(cfg: DictConfig, model: ModelSpec, settings: RunSettings) -> PolicySpec | None:
    """The clairvoyant bound's policy (None without bounds or one), which builds like any
    policy and is a bound for the model: a block-keyed bound (``clairvoyant_blocks``, the
    block-trie Belady) keeps an SSM state after every block of a hybrid, so it fills the cache
    with states and reports far below what real policies reach (0.069 against marconi's 0.379
    on the default run)."""
    if not bounds_enabled(cfg):
        return None
    pcfg = cfg.bounds.get("clairvoyant")
    if pcfg is None:
        return None
    spec = policy_spec("clairvoyant", pcfg)
    step = policy_step(spec, model, settings)
    if model.is_hybrid and step.admission.keys.block_size is not None:
        raise ConfigError(
            f"bounds.clairvoyant: {pcfg.get('name')!r} is a bound for Transformers only "
            f"({model.name} is a hybrid); use policy@bounds.clairvoyant=clairvoyant"
        )
    return spec


def build_engine(cfg: DictConfig) -> Engine:
    """Instantiate the configured engine (``engine._target_``; :class:`ConfigError` if invalid),
    behind ``cluster.replicas`` replicas when there are several (:mod:`simlab.engines.cluster`)."""
    if cfg.get("engine") is None or "_target_" not in cfg.engine:
        raise ConfigError("engine must name an engine class (_target_), e.g. engine=timed")
    cluster = ClusterSettings.from_config(cfg.get("cluster"))
    try:
        engine: Engine = instantiate(cfg.engine, _convert_="all")
    except InstantiationException as err:
        if isinstance(err.__cause__, ConfigError):  # the engine named the key itself
            raise err.__cause__ from err
        raise ConfigError(f"engine: {err.__cause__ or err}") from err
    if cluster.replicas == 1:
        return engine
    # SimPy and the timed engine: replicas only
    from simlab.engines.cluster.engine import with_cluster

    return with_cluster(engine, cluster, cfg.get("seed", 0))


def trace_spec(cfg: DictConfig) -> TraceSpec:
    """The ``trace`` section (its loader and options, resolved) and ``data_dir``."""
    options: dict[str, Any] = OmegaConf.to_container(cfg.trace, resolve=True)  # type: ignore[assignment]
    target = str(options.pop("_target_"))
    return TraceSpec(target, options, cfg.get("data_dir"))


def saved_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as run: with ``+policy=NAME`` the unused ``compare`` set is dropped."""
    config: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    if config.get("policy") is not None:
        config.pop("compare", None)
    return config


def output_dir(cfg: DictConfig) -> Path | None:
    if cfg.get("output_dir"):
        return Path(cfg.output_dir)
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return None
