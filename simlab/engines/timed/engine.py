"""``engine=timed``: the engine's settings and GPU, and the factory that gives each run its world
(:class:`~simlab.engines.timed.world.TimedWorld`), its memory on the prefix tree or on vLLM's
block pool (:class:`~simlab.engines.timed.vllm.VllmMemory`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import simpy

from simlab.cache.contract import EvictionPolicy, overrides
from simlab.config import ConfigError
from simlab.cost.calibration import Calibration, resolve_calibration
from simlab.cost.hardware import Hardware
from simlab.cost.measured import select
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.sources import ROOFLINE, ROOFLINE_WARN_SHARE, shares
from simlab.cost.model import CostModel
from simlab.cost.shapes import check_ep, check_tp, on_tp
from simlab.cost.terms import CostTerms
from simlab.engines import block_pool as vllm_pool
from simlab.engines.base import EngineRun
from simlab.engines.records import RequestRecord
from simlab.engines.step import RequestStep
from simlab.engines.timed import defaults, stated
from simlab.engines.timed.agents import closed_loop
from simlab.engines.timed.feeders import session_feeder
from simlab.engines.timed.load import load_verdict, steady_state
from simlab.engines.timed.pool_sizing import KvPool, aic_model, size
from simlab.engines.timed.settings import TimedSettings
from simlab.engines.timed.vllm import VllmMemory
from simlab.engines.timed.world import TimedWorld
from simlab.model import layers
from simlab.model.spec import ModelSpec
from traces.format import Request

log = logging.getLogger(__name__)

#: SGLang's ``--max-prefill-tokens``: the activations' tokens with chunked prefill off
SGLANG_MAX_PREFILL = 16384


def load_calibration(
    path: str | None, hardware: str | None = None, profiles: bool = True
) -> Calibration | None:
    """The gpu_validate calibration at ``path`` (None: default efficiencies), fitted for the
    ``hardware`` preset (another preset's file is an error naming the key and the file);
    ``profiles=False`` drops its measured op times (every op on the class model)."""
    try:
        calibration = Calibration.load(resolve_calibration(path), hardware) if path else None
    except (OSError, ValueError) as err:
        raise ValueError(f"engine.calibration: {err}") from err
    if calibration is not None and not profiles:
        return calibration.without_profiles()
    return calibration


@dataclass(frozen=True)
class TimedEngine(TimedSettings):
    """``engine=timed``: the settings plus the GPU (``hardware``, ``tp``, ``calibration``), with
    chat sessions as the feeder; :meth:`run` simulates one policy in a fresh world."""

    hardware: Any = None  # Hardware or its config mapping (``${hardware}``)
    name: str = "timed"
    tp: int = 1
    ep: int = 1  # expert parallelism: the MoE's experts split over ep of the tp GPUs
    calibration: str | None = None  # gpu_validate calibration JSON (the preset's by default)
    profiles: bool = True  # time the ops the calibration measured (its profiles) from them
    costs: Any = None  # engine.costs: the terms the roofline misses (CostTerms)
    kernels: str = "measured"  # measured kernel tables first (simlab.cost.measured), or roofline
    backend: str = "vllm"  # the engine whose measured kernels time the ops (vllm|sglang|trtllm)
    backend_version: str | None = None  # its version (None: the newest measured on the GPU)
    dtype: str | None = None  # the tables' dtype (bf16|fp8|fp4; None: the model's)
    kernel_tables: str | None = None  # gpu_validate's tables: those the package lacks
    moe_kernel: str | None = None  # the fused MoE's kernel, a substring of the tables' names
    overheads: str = "none"  # fitted: the overheads fitted on the backend's serving points
    _calibration: Calibration | None = field(default=None, init=False, repr=False)
    _terms: CostTerms = field(default_factory=CostTerms, init=False, repr=False)
    #: the settings left null that took the backend's defaults: ``{key: (value, whose)}``
    _resolved: dict[str, tuple[Any, str]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
            if self.hardware is None:
                raise ValueError("engine.hardware is missing")
            if not isinstance(self.hardware, Hardware):
                object.__setattr__(self, "hardware", Hardware.from_config(self.hardware))
            if not (isinstance(self.tp, int) and self.tp >= 1):
                raise ValueError(f"engine.tp must be an integer >= 1, got {self.tp!r}")
            if not (isinstance(self.ep, int) and self.ep >= 1 and self.tp % self.ep == 0):
                raise ValueError(
                    f"engine.ep must be an integer dividing engine.tp, got {self.ep!r}"
                )
            if not isinstance(self.profiles, bool):
                raise ValueError(f"engine.profiles must be true or false, got {self.profiles!r}")
            calibration = load_calibration(self.calibration, self.hardware.name, self.profiles)
            terms = CostTerms.from_config(self.costs)
            select.check(self.kernels, self.backend, self.backend_version, self.dtype)
            terms = self._fitted(terms)
            if self.max_running is None:  # engine.max_running=null: the backend's own cap
                hw = self.hardware
                cap = defaults.running(self.backend, hw.name, hw.mem_gb)
                object.__setattr__(self, "max_running", cap)
                self._resolved["max_running"] = (cap, f"{self.backend}'s default on {hw.name}")
            local = select.local_tables(self.kernel_tables)
            if self.hardware.system is not None and self.kernels == "measured":
                system, backend = self.hardware.system, self.backend
                select.resolve_version(system, backend, self.backend_version, local)
                select.check_moe_kernel(system, self.moe_kernel, local)
        except (TypeError, ValueError) as err:
            raise ConfigError(str(err)) from err  # the message names its key
        object.__setattr__(self, "_calibration", calibration)
        object.__setattr__(self, "_terms", terms)

    def _fitted(self, terms: CostTerms) -> CostTerms:
        """``terms`` with ``engine.overheads=fitted``'s time an iteration, and that a request
        set (:func:`.stated.fitted_overheads`), each recorded as resolved; as given with
        ``none``."""
        if self.overheads not in stated.OVERHEADS:
            choices = " | ".join(stated.OVERHEADS)
            raise ValueError(f"engine.overheads must be {choices}, got {self.overheads!r}")
        if self.overheads == "none":
            return terms
        set_s = (terms.iteration_overhead_s, self.request_overhead_s)
        iteration, request = stated.fitted_overheads(self.backend, self.kernels, set_s)
        object.__setattr__(self, "request_overhead_s", request)
        whose = f"engine.overheads=fitted: fitted on {self.backend}'s serving points"
        self._resolved["costs.iteration_overhead_s"] = (iteration, whose)
        self._resolved["request_overhead_s"] = (request, whose)
        return replace(terms, iteration_overhead_s=iteration)

    def held(self, model: ModelSpec) -> ModelSpec:
        """``model`` as the replica's ``tp`` GPUs hold it (:func:`simlab.cost.shapes.on_tp`:
        with ``tp`` above the KV heads each is copied onto ``tp / KV heads`` GPUs, as vLLM and
        SGLang do, and MLA's latent onto every GPU: a token's KV takes that much more of the
        pool); a ``tp`` the engines reject is a :class:`ConfigError` naming ``engine.tp``, an
        ``ep`` that does not split the experts (:func:`~simlab.cost.shapes.check_ep`) one
        naming ``engine.ep``."""
        try:
            held = on_tp(model, self.tp)
            check_ep(model, self.tp, self.ep)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        if held.kv_bytes_per_token == model.kv_bytes_per_token:
            return held
        why = (
            f"each GPU keeps {model.name}'s whole MLA latent"
            if model.attn_kind == "mla"
            else f"engine.tp {self.tp} exceeds {model.name}'s {model.n_kv_heads} KV heads, "
            f"each copied onto {self.tp // model.n_kv_heads} GPUs"
        )
        log.warning(
            "%s (the engines' rule): %d KV bytes a token across the replica's %d GPUs, not %d "
            "(summary.json's config.kv_replicated)",
            why,
            held.kv_bytes_per_token,
            self.tp,
            model.kv_bytes_per_token,
        )
        return held

    def overheads_caveat(self) -> str | None:
        """The caveat of a run whose engine overheads are all zero (the defaults): its
        latencies leave out the engine's CPU time and its API server (None: one is set)."""
        terms = self._terms
        if terms.iteration_overhead_s or terms.sequence_overhead_s or self.request_overhead_s:
            return None
        return (
            "engine overheads are 0 (engine.costs.iteration_overhead_s, "
            "engine.request_overhead_s): the latencies leave out the engine's CPU time and its "
            f"API server; {self.backend}'s fitted values: docs/validation/silicon.md"
        )

    def latency_error(self, cost: CostModel) -> dict[str, Any]:
        """``latency_error``: the stated error of this engine's latencies on ``cost``
        (:mod:`simlab.engines.timed.stated`)."""
        overheads = (self._terms.iteration_overhead_s, self.request_overhead_s)
        system = self.hardware.system or self.hardware.name
        model, on = cost.model, cost.kernels is not None
        return stated.stated_error(self.backend, model.name, system, overheads, on, model.is_hybrid)

    def resolved(self) -> dict[str, tuple[Any, str]]:
        """The settings left null that took ``engine.backend``'s defaults on the GPU
        (``engine.max_running=null``), and those ``engine.overheads=fitted`` set:
        ``{key: (value, whose)}``."""
        return dict(self._resolved)

    def defaults_caveat(self, keys: tuple[str, ...] | None = None) -> str | None:
        """The caveat of a run whose scheduling (``keys`` of it, where given) differs from
        ``engine.backend``'s defaults on its GPU (:mod:`simlab.engines.timed.defaults`; None:
        it agrees)."""
        hw = self.hardware
        return defaults.caveat(self, self.backend, hw.name, hw.mem_gb, keys)

    def engine_pool(self, model: ModelSpec) -> KvPool:
        """``cache.size_gb=engine``: the KV pool ``engine.backend`` allocates for ``model`` (as
        the replica holds it) on ``tp`` GPUs of ``hardware.system``, at ``memory_fraction``
        (null: the engine's own) and the model's quantization
        (:mod:`simlab.engines.timed.pool_sizing`); a :class:`ConfigError` naming
        ``cache.size_gb`` where it cannot be sized."""
        system, backend = self.hardware.system, self.backend
        if system is None:
            raise ConfigError(
                f"cache.size_gb=engine: hardware {self.hardware.name} names no system to size "
                "the pool on; set cache.size_gb in GB"
            )
        version = select.resolve_version(system, backend, self.backend_version)
        dtype = self.dtype or {1: "fp8"}.get(model.dtype_bytes, "bf16")
        weights = {"fp8": "fp8", "fp4": "nvfp4"}.get(dtype)  # None: the tables' BF16
        quant = (weights, weights, "fp8" if model.kv_dtype_bytes == 1 else None)
        budget = self.token_budget or self.max_prefill_tokens or SGLANG_MAX_PREFILL
        gpu_gib = self.hardware.mem_gb  # GiB, as aiconfigurator-core's systems count it
        where = (system, backend, version)
        pool = size(
            aic_model(model.name), model, where, self.tp, budget, quant, self.memory_fraction,
            gpu_gib,
        )  # fmt: skip
        if pool is None:
            raise ConfigError(
                f"cache.size_gb=engine: aiconfigurator-core's memory model cannot size "
                f"{model.name} on {system} with {backend} x tp {self.tp} (no config of that "
                "name, or no memory left for the KV cache); set cache.size_gb in GB"
            )
        return pool

    def check_memory(self, model: ModelSpec, cache_gb: float, reserve: bool = True) -> None:
        """``tp`` splits ``model``'s heads evenly (:func:`simlab.cost.shapes.check_tp`), and the
        pool + weights must fit the GPUs' memory (``hardware.mem_gb`` x ``tp``;
        ``engine.memory_check=false`` allows what-if studies). The pool is the cache, plus
        :meth:`running_gb` for running sequences. ``reserve``: whether a policy runs on the
        prefix tree (the plan's routes)."""
        try:
            check_tp(model, self.tp)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        running = self.running_gb(reserve)
        if not self.memory_check or not math.isfinite(cache_gb):
            return
        weights = layers.weight_bytes(model) / 1e9  # at the checkpoint's format
        have = self.hardware.mem_gb * self.tp
        if cache_gb + running + weights > have:
            pool = f"{cache_gb:g} GB of cache"
            if running:
                pool += f" + {running:g} GB for running sequences (engine.running_memory_gb)"
            raise ConfigError(
                f"cache.size_gb: {pool} + {weights:.1f} GB of {model.name} weights exceed "
                f"{have:g} GB ({self.hardware.name} x tp {self.tp}); engine.memory_check=false "
                "for a what-if study"
            )

    def running_gb(self, reserve: bool) -> float:
        """The memory running sequences take beside the cache: ``running_memory_gb`` where the
        prefix tree reserves it (``reserve``; it must be > 0) or ``kv_pool=shared`` adds it to
        the pool; none on vLLM's own block pool, whose running blocks come out of the cache."""
        if self.kv_pool == "shared":
            return self.running_memory_gb
        if not reserve:
            return 0.0
        if self.running_memory_gb <= 0:
            raise ConfigError(
                f"engine.running_memory_gb must be > 0, got {self.running_memory_gb:g}: the "
                "prefix tree keeps it for running sequences beside the cache (0 only on vLLM's "
                "block pool or with engine.kv_pool=shared)"
            )
        return self.running_memory_gb

    def cost_model(self, model: ModelSpec) -> CostModel:
        return CostModel(
            model,
            self.hardware,
            self._calibration,
            self.tp,
            self._terms,
            self.overlap,
            self.measured_kernels(model),
            self.ep,
        )

    def measured_kernels(self, model: ModelSpec) -> Kernels | None:
        """The measured kernels that time ``model`` (:func:`simlab.cost.measured.select.select`;
        None: the roofline times every op)."""
        try:
            dtype = select.model_dtype(self.dtype, model.dtype_bytes)
            select.warn_checkpoint(model, dtype)
            kv = select.kv_dtype(model.kv_dtype_bytes) if self.kernels == "measured" else "bf16"
            local = select.local_tables(self.kernel_tables)
            return select.select(
                self.hardware,
                self.kernels,
                self.backend,
                self.backend_version,
                dtype,
                local,
                kv,
                self.moe_kernel,
            )
        except ValueError as err:
            raise ConfigError(str(err)) from err

    def world(
        self,
        requests: Sequence[Request],
        step: RequestStep,
        env: simpy.Environment | None = None,
    ) -> TimedWorld:
        """A fresh world for ``step`` (in ``env``: a cluster's replicas share one): on vLLM's
        pool block by block where the step is routed there (``step.pool``: a hybrid under
        ``policy=vllm``, or a Transformer with ``kv_pool=shared``;
        :mod:`simlab.engines.timed.vllm`, the running blocks in the pool with
        ``kv_pool=shared``), else on the prefix tree."""
        cost = self.cost_model(step.cache.model)
        running = self.running_memory_gb * 1e9 if self.kv_pool == "shared" else 0.0
        shape = vllm_pool.pool_shape(step, requests, running) if step.pool else None
        if shape is not None:
            return TimedWorld(requests, step, cost, self, env, VllmMemory.factory(shape))
        return TimedWorld(requests, step, cost, self, env)

    def run(self, requests: Sequence[Request], step: RequestStep) -> EngineRun:
        if overrides(step.eviction, "prepare", EvictionPolicy):
            log.warning(
                "%s: its eviction ranks by next use in arrival order, which requests in flight "
                "change: on the timed engine it is a heuristic, not a bound",
                step.policy,
            )
        world = self.world(requests, step)
        records = world.run(session_feeder(requests, self.typing_wpm))
        closed = closed_loop(requests)
        extras = world.stats.summary(len(records)) | verdict_of(world, records, closed)
        state = steady(step.policy, records)
        caveats = over_budget(step.policy, [world]) + state.pop("caveats", [])
        extras |= world.cache_peaks() | state | ({"caveats": caveats} if caveats else {})
        extras |= time_sources(world.cost, step.policy)
        extras["latency_error"] = self.latency_error(world.cost)
        if extras["saturated"]:
            log.warning("%s: saturated (%s)", step.policy, extras["saturation"])
        if not world.preempts:
            return EngineRun(records, extras, world.stats.occupancy)
        extras |= world.pool.summary(self)
        columns: dict[str, list[Any]] = {"preemptions": world.preemption_column(records)}
        return EngineRun(records, extras, world.stats.occupancy, columns)


def verdict_of(
    world: TimedWorld, records: Sequence[RequestRecord], closed: bool = False
) -> dict[str, Any]:
    """:func:`~simlab.engines.timed.load.load_verdict` of ``world``'s run of ``records``
    (``closed``: from a closed loop of users)."""
    busy = world.stats.summary(len(records))["gpu_busy_frac"]
    return load_verdict(records, busy, len(world.pool.preempted), world.stats.stalled, closed)


def over_budget(policy: str, worlds: Sequence[TimedWorld]) -> list[str]:
    """The caveat (logged once) of requests that needed more running memory than
    ``engine.running_memory_gb`` and started alone over it (``kv_pool=separate``) on any of
    ``worlds`` (a cluster's replicas), if any."""
    needs = [need for world in worlds for need in world.stats.over_budget.values()]
    if not needs:
        return []
    caveat = (
        f"{len(needs)} requests needed more running memory than engine.running_memory_gb "
        f"({worlds[0].settings.running_memory_gb:g} GB), up to {max(needs) / 1e9:.4g} GB: "
        "each ran alone, over the budget"
    )
    log.warning("%s: %s", policy, caveat)
    return [caveat]


def time_sources(cost: CostModel, policy: str) -> dict[str, Any]:
    """``time_sources``: the share of the run's simulated GPU time per time source, with a
    warning when the roofline carries more than
    :data:`~simlab.cost.measured.sources.ROOFLINE_WARN_SHARE` of it, and ``kernels``: the
    tables' GPU, backend, version and dtype (with a ``caveat`` when the preset's bandwidth is
    not the GPU's). Measured kernels only ({} on the roofline alone)."""
    if cost.kernels is None:
        return {}
    out = shares(cost.source_seconds)
    if out[ROOFLINE] > ROOFLINE_WARN_SHARE:
        log.warning(
            "%s: %.0f%% of the simulated GPU time is on the roofline, not measured kernels "
            "(summary.json time_sources)",
            policy,
            100 * out[ROOFLINE],
        )
    k = cost.kernels.kernels
    kernels: dict[str, Any] = {"system": k.system, "backend": k.backend, "version": k.version}
    kernels |= {"dtype": k.dtype, "kv_cache_dtype": k.kv_dtype, "tables": k.used_versions()}
    kernels |= {"moe_kernel": k.moe_kernel} if k.moe_kernel else {}
    kernels |= k.lent()
    found = (
        select.caveat(cost.hw),
        select.newer_tables(k),
        select.checkpoint_caveat(cost.model, k.dtype),
    )
    lines = [line for line in found if line]
    return {
        "time_sources": out,
        "kernels": kernels | ({"caveat": "; ".join(lines)} if lines else {}),
    }


def steady(policy: str, records: Sequence[RequestRecord]) -> dict[str, Any]:
    """``steady_state`` for the summary, its caveat logged once and listed in ``caveats``."""
    state = steady_state(records)
    caveat = state.pop("caveat", None)
    if caveat is None:
        return {"steady_state": state} if state else {}
    log.warning("%s: %s", policy, caveat)
    return {"steady_state": state, "caveats": [caveat]}
