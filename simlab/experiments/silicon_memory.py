"""Each measured serving point's KV cache pool, sized as its engine sizes it, and the rule by
which its engine admits requests against that pool.

The pool is one GPU's KV budget times the point's ``tp`` GPUs. One GPU's memory:

- its capacity, activations at the server's token budget, and runtime and communication
  buffers: aiconfigurator-core's memory model
  (``aiconfigurator_core.sdk.memory.KVCacheEstimator``, NVIDIA's per-backend model) at the
  point's GEMM, MoE and KV cache quantization (the csv's ``gemm_quant_mode`` and
  ``moe_quant_mode``, the script's KV cache dtype);
- its weights: the parameters of the model simlab replays (:func:`weights_per_gpu`).
  aiconfigurator's weights agree for Llama-3.1-70B at FP8 (67.7 GiB a GPU at TP 1) but
  count DeepSeek-R1 8% above its 671 billion parameters at FP8 (84.6 GiB a GPU at TP 8 against
  78.3), which at TP 4 on a B200 is the difference between 4 and 11 GiB of KV cache.

Each engine's budget rule, with the fraction its launch script sets
(:attr:`Recipe.memory_fraction`):

- vLLM: ``gpu_memory_utilization`` x capacity, less the weights, the profiled activations and
  the runtime and communication buffers (aiconfigurator's ``of_total``);
- SGLang: ``mem_fraction_static`` x capacity, less what is resident once the weights are
  loaded (weights and communication buffers): its activations and CUDA graphs live in the
  remaining ``1 - mem_fraction_static`` (``KVCacheConfigurator._profile_available_bytes``,
  SGLang 0.5.23; aiconfigurator also takes the activations out of it, which SGLang does not);
- TensorRT-LLM: ``free_gpu_memory_fraction`` (0.9 by default) of what the weights,
  activations and buffers leave free (aiconfigurator's ``of_free``).

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

import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simlab.cost.measured import tables
from simlab.model import layers
from simlab.model.spec import ModelSpec

if TYPE_CHECKING:
    from simlab.experiments.silicon import Point
    from simlab.experiments.silicon_recipes import Recipe

log = logging.getLogger(__name__)

#: each engine's fraction when its script sets none (TensorRT-LLM's
#: ``KvCacheConfig.free_gpu_memory_fraction``, vLLM's ``gpu_memory_utilization`` of the
#: versions measured); SGLang's scripts always set ``--mem-fraction-static``
DEFAULT_FRACTION = {"trtllm": 0.9, "vllm": 0.9}
GIB = 1 << 30


@dataclass(frozen=True)
class KvPool:
    """One point's KV pool: its bytes over the replica (``gb``, in simlab's units: the replica's
    KV bytes a token, :func:`simlab.cost.shapes.on_tp`), what one GPU holds and why."""

    gb: float
    tokens: int  # the tokens it holds
    fraction: float  # the engine's memory fraction
    #: GiB on one GPU: capacity, weights, activations, runtime, communication buffers, kv
    per_gpu: dict[str, float]

    def row(self) -> dict[str, object]:
        """The record each validated row carries."""
        return {
            "kv_pool_gb": round(self.gb, 3),
            "kv_pool_tokens": self.tokens,
            "memory_fraction": self.fraction,
            "per_gpu_gib": {k: round(v, 3) for k, v in self.per_gpu.items()},
        }


def kv_pool(point: Point, server: Recipe, version: str | None, held: ModelSpec) -> KvPool | None:
    """``point``'s KV pool on tables ``version``, for the model as its ``tp`` GPUs hold it
    (``held``); None where aiconfigurator-core's memory model cannot build the model (the point
    then runs with memory unconstrained, and its row says so)."""
    kv_dtype = "fp8" if server.kv_dtype_bytes == 1 else None
    aic = _memory(
        aic_model(point.model),
        point.system,
        point.backend,
        version,
        point.tp,
        server.token_budget,
        (point.gemm_quant or None, point.moe_quant or None, kv_dtype),
    )
    if aic is None:
        return None
    fraction = server.memory_fraction or DEFAULT_FRACTION[point.backend]
    weights = weights_per_gpu(held, point.tp)
    memory = aic | {"weights": weights}  # the replayed model's, not aiconfigurator's
    capacity, activations = memory["capacity"], memory["activations"]
    non_kv = weights + activations + memory["runtime"] + memory["communication"]
    if point.backend == "trtllm":
        kv = fraction * (capacity - non_kv)
    elif point.backend == "sglang":
        kv = fraction * capacity - weights - memory["communication"]
    else:
        kv = fraction * capacity - non_kv
    if kv <= 0:
        return None
    gb = point.tp * kv / 1e9
    per_gpu = {k: v / GIB for k, v in (memory | {"kv": kv}).items()}
    return KvPool(gb, int(gb * 1e9 // held.kv_bytes_per_token), fraction, per_gpu)


def weights_per_gpu(held: ModelSpec, tp: int) -> float:
    """One GPU's weights in bytes: the model's parameters as its ``tp`` GPUs hold them (K/V
    projections copied where the KV heads are) at the checkpoint's format, the embedding and LM
    head at BF16 at least (:func:`simlab.model.layers.weight_bytes`), split over the GPUs."""
    return layers.weight_bytes(held) / tp


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


def aic_model(model: str) -> str:
    """aiconfigurator-core's name of the model's config (its ``model_configs``)."""
    return model.replace("Llama-3.1", "Meta-Llama-3.1").removesuffix("-Instruct")


@functools.lru_cache(maxsize=512)
def _memory(
    model: str,
    system: str,
    backend: str,
    version: str | None,
    tp: int,
    max_num_tokens: int,
    quant: tuple[str | None, str | None, str | None],
) -> dict[str, float] | None:
    """One GPU's memory in bytes (capacity, weights, activations at ``max_num_tokens``, runtime
    and communication buffers) at the ``(GEMM, MoE, KV cache)`` quantization, from
    aiconfigurator-core's memory model; None where it cannot build the model."""
    from aiconfigurator_core.sdk.memory import KVCacheEstimator

    gemm, moe, kv = quant
    estimator, why = None, ""
    for tried in (version, "current"):  # versions outside its maintained slots: its current
        try:
            estimator = KVCacheEstimator.from_request(
                model,
                system,
                backend,
                tried,
                max_num_tokens=max_num_tokens,
                max_batch_size=1,  # aiconfigurator: it does not enter the non-KV memory
                tp_size=tp,
                moe_tp_size=tp,
                moe_ep_size=1,
                gemm_quant_mode=gemm,
                moe_quant_mode=moe,
                kvcache_quant_mode=kv,
                systems_path=str(tables.systems_dir()),
            )
            break
        except (ValueError, KeyError, AttributeError, OSError) as err:
            why = str(err)
    if estimator is None:
        log.info("%s on %s %s: no memory model (%s)", model, system, backend, why)
        return None
    b = estimator.breakdown
    out = {
        "capacity": float(b["gpu_memory_capacity_bytes"]),
        "weights": float(b["weights_bytes"]),
        "activations": float(b["activations_bytes"]),
        "runtime": float(b["runtime_overhead_bytes"]),
        "communication": float(b["comm_overhead_bytes"]),
    }
    return out if all(math.isfinite(v) and v >= 0 for v in out.values()) else None
