"""The replay engine's run of a step routed to vLLM's pool (:mod:`simlab.engines.block_pool`):
the pool of a step, its records and their peaks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simlab.config import ConfigError
from simlab.engines.base import EngineRun
from simlab.engines.block_pool.pool import HybridPool, PoolRun
from simlab.engines.block_pool.queue import PoolFull, PoolShape
from simlab.engines.records import RequestRecord, request_record
from simlab.engines.step import RequestStep
from simlab.model.spec import ModelSpec
from traces.format import Request

#: the tokens a scheduler step prefills where neither the policy nor the engine sets them:
#: vLLM's ``SchedulerConfig`` default, the budget the cross-checks drove vLLM at
SCHEDULER_TOKENS = 2048


def pool_records(
    requests: Sequence[Request], model: ModelSpec, policy: str, pool: HybridPool, committed: bool
) -> EngineRun:
    """The replay engine's run of ``requests`` through vLLM's hybrid ``pool``, one at a time."""
    records = []
    peaks = Peaks()
    for req in requests:
        try:
            run = pool.serve_request(req, committed)
        except PoolFull:
            raise too_small(pool.shape, req) from None
        records.append(pool_record(req, model, policy, pool, run))
        peaks.note(records[-1])
    return EngineRun(records=records, extras=peaks.extras())


def too_small(shape: PoolShape, req: Request) -> ConfigError:
    return ConfigError(
        f"cache.size_gb: vLLM's pool of {shape.blocks} blocks cannot hold request "
        f"{req.request_id} ({req.input_tokens + req.output_len} tokens, blocks of {shape.block})"
    )


def pool_record(
    req: Request,
    model: ModelSpec,
    policy: str,
    pool: HybridPool,
    run: PoolRun,
    matched: int | None = None,
    hit: int | None = None,
) -> RequestRecord:
    """The record of ``req``'s finished ``run`` (the cache columns: the pool's now); its
    ``matched`` and ``hit`` tokens are the run's unless given (a preempted request's are
    those of its first scheduling, vLLM's ``num_cached_tokens``: a resumed one's hit may
    reach into the outputs it recomputes)."""
    shape = pool.shape
    kv_bytes, ssm_bytes = pool.cached_bytes()
    return request_record(
        policy,
        req,
        model,
        run.matched_tokens if matched is None else matched,
        run.hit_tokens if hit is None else hit,
        kv_bytes_admitted=run.kv_cached * shape.block_bytes,
        ssm_bytes_admitted=run.states_cached * shape.state_groups * shape.block_bytes,
        ckpts_admitted=run.states_cached,
        bytes_evicted=run.evicted * shape.block_bytes,
        nodes_evicted=run.evicted,
        admission_truncated=False,
        cache_kv_bytes=kv_bytes,
        cache_ssm_bytes=ssm_bytes,
    )


@dataclass
class Peaks:
    """The cached bytes' peaks over a run's records (the run's extras)."""

    kv: int = 0
    ssm: int = 0
    total: int = 0

    def note(self, record: RequestRecord) -> None:
        kv, ssm = record.cache_kv_bytes, record.cache_ssm_bytes
        self.kv, self.ssm, self.total = (
            max(self.kv, kv),
            max(self.ssm, ssm),
            max(self.total, kv + ssm),
        )

    def extras(self) -> dict[str, float]:
        return {
            "peak_kv_gb": self.kv / 1e9,
            "peak_ssm_gb": self.ssm / 1e9,
            "peak_gb": self.total / 1e9,
        }


def pool_shape(
    step: RequestStep, requests: Sequence[Request], running_bytes: float = 0.0
) -> PoolShape | None:
    """The pool of a step routed to it (``step.pool``; :mod:`simlab.run.routes` decides): blocks
    of the admission's block size (a key's ids are tokens of the trace's ids), the cache's
    capacity plus ``running_bytes`` (the timed engine's shared KV pool). None when vLLM would
    plan its attention layers in more than one group (not modelled)."""
    per_id = requests[0].block_size if requests else 1
    block = (step.admission.keys.block_size or 1) * per_id
    return PoolShape.of(step.cache.model, block, step.cache.capacity + running_bytes)


def step_pool(
    step: RequestStep, shape: PoolShape, budget: int | None = None
) -> tuple[HybridPool, bool]:
    """The pool of ``step``'s admission options (``policy=vllm``) and its ``committed`` keys;
    a step prefills the admission's ``max_num_batched_tokens``, else the engine's ``budget``
    (the timed engine's ``engine.token_budget``), else :data:`SCHEDULER_TOKENS`."""
    admission = step.admission
    tokens = getattr(admission, "max_num_batched_tokens", None) or budget or SCHEDULER_TOKENS
    unit = getattr(admission, "prefix_match_unit", None)
    alignment = getattr(admission, "checkpoint_alignment", None)
    pool = HybridPool(
        shape,
        junction=bool(getattr(admission, "junction", True)),
        max_tokens=int(tokens),
        retention=getattr(admission, "prefix_cache_retention_interval", 0),
        unit=unit,
        alignment=alignment(step.cache.model, shape.block) if alignment else 1,
    )
    return pool, admission.keys.committed


def pool_run(
    requests: Sequence[Request],
    step: RequestStep,
    shape: PoolShape,
    policy: str,
    budget: int | None = None,
) -> EngineRun:
    """:func:`pool_records` with the options of ``step``'s admission (``policy=vllm``), each
    scheduler step prefilling ``budget`` tokens (:func:`step_pool`)."""
    pool, committed = step_pool(step, shape, budget)
    return pool_records(requests, step.cache.model, policy, pool, committed)
