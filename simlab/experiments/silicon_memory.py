"""Each measured serving point's KV cache pool, sized as its engine sizes it
(:mod:`simlab.engines.timed.pool_sizing`, at the memory fraction its launch script sets,
:attr:`Recipe.memory_fraction`, and the csv's GEMM and MoE quantization), and the rule by which
its engine admits requests against that pool.

The engines' admission against the pool (:func:`admission`):

- TensorRT-LLM's default capacity scheduler, ``GUARANTEED_NO_EVICT``: a request starts once the
  pool holds its prompt and its whole output, and nobody is evicted (``engine.kv_pool=separate``
  with ``engine.running_memory_gb`` the pool: each running request reserves its prompt and
  output);
- SGLang: its own admission (the prompt and ``new_token_ratio`` of the output left) and its
  retraction of running requests when decoding runs out of pool (``engine.kv_pool=shared``,
  ``engine.request_admission=sglang``, ``engine.preemption=sglang``: the settings
  ``simlab.crosscheck_load`` checks request by request against SGLang's scheduler);
- vLLM: its block pool (``policy=vllm`` on ``engine.kv_pool=shared``: the prompt's blocks to
  start, a block whenever decoding needs one, the newest request preempted and recomputed when
  none is left; checked against vLLM's scheduler the same way).

A request that started keeps its first token whatever happens to it later, so the engines that
admit on the prompt (vLLM, SGLang) keep TTFT short past the pool where TensorRT-LLM queues.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simlab.engines.timed.pool_sizing import KvPool, aic_model, size
from simlab.model.spec import ModelSpec

if TYPE_CHECKING:
    from simlab.experiments.silicon import Point
    from simlab.experiments.silicon_recipes import Recipe


def kv_pool(point: Point, server: Recipe, version: str | None, held: ModelSpec) -> KvPool | None:
    """``point``'s KV pool on tables ``version``, for the model as its ``tp`` GPUs hold it
    (``held``); None where aiconfigurator-core's memory model cannot build the model (the point
    then runs with memory unconstrained, and its row says so)."""
    kv_dtype = "fp8" if server.kv_dtype_bytes == 1 else None
    quant = (point.gemm_quant or None, point.moe_quant or None, kv_dtype)
    where = (point.system, point.backend, version)
    return size(
        aic_model(point.model),
        held,
        where,
        point.tp,
        server.token_budget,
        quant,
        server.memory_fraction,
    )


def admission(backend: str, pool_gb: float) -> list[str]:
    """The overrides that size the pool and admit against it the engine's way (module
    docstring)."""
    if backend == "trtllm":
        return ["+policy=fifo", f"engine.running_memory_gb={pool_gb}", "cache.size_gb=1"]
    shared = ["engine.kv_pool=shared", "engine.running_memory_gb=0", f"cache.size_gb={pool_gb}"]
    if backend == "sglang":
        sglang = ["engine.preemption=sglang", "engine.request_admission=sglang"]
        return ["+policy=fifo", *shared, *sglang, "engine.ignore_eos=true"]
    return ["+policy=vllm", *shared]
