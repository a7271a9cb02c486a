"""The KV cache pool an engine allocates on its GPUs (``cache.size_gb=engine``, and the silicon
points' pools, :mod:`simlab.experiments.silicon_memory`).

The pool is one GPU's KV budget times the replica's ``tp`` GPUs. One GPU's memory:

- its capacity, activations at the engine's token budget, and runtime and communication
  buffers: aiconfigurator-core's memory model (``aiconfigurator_core.sdk.memory.KVCacheEstimator``,
  NVIDIA's per-backend model) at the model's GEMM, MoE and KV cache quantization;
- its weights: the parameters of the model simlab runs (:func:`weights_per_gpu`).
  aiconfigurator's weights agree for Llama-3.1-70B at FP8 (67.7 GiB a GPU at TP 1) but count
  DeepSeek-R1 8% above its 671 billion parameters at FP8 (84.6 GiB a GPU at TP 8 against 78.3),
  which at TP 4 on a B200 is the difference between 4 and 11 GiB of KV cache.

Each engine's budget rule, at its memory fraction (:func:`default_fraction` where none is set):

- vLLM: ``gpu_memory_utilization`` (0.9) x capacity, less the weights, the profiled activations
  and the runtime and communication buffers (aiconfigurator's ``of_total``);
- SGLang: ``mem_fraction_static`` x capacity, less what is resident once the weights are
  loaded (weights and communication buffers): its activations and CUDA graphs live in the
  remaining ``1 - mem_fraction_static`` (``KVCacheConfigurator._profile_available_bytes``,
  SGLang 0.5.23; aiconfigurator also takes the activations out of it, which SGLang does not).
  Its default fraction is :func:`sglang_fraction`;
- TensorRT-LLM: ``free_gpu_memory_fraction`` (0.9) of what the weights, activations and buffers
  leave free (aiconfigurator's ``of_free``).
"""

from __future__ import annotations

import functools
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

from simlab.cost.measured import tables
from simlab.model import layers
from simlab.model.spec import ModelSpec

log = logging.getLogger(__name__)

#: each engine's fraction by default: TensorRT-LLM's ``KvCacheConfig.free_gpu_memory_fraction``
#: and vLLM's ``gpu_memory_utilization`` (SGLang's: :func:`sglang_fraction`)
DEFAULT_FRACTION = {"trtllm": 0.9, "vllm": 0.9}
GIB = 1 << 30
MIB = 1 << 20
#: SGLang's ``cuda_graph_max_bs`` by GPU memory (below this many GiB: below TP 4, from TP 4)
SGLANG_GRAPH_BS = ((20, 8, 8), (35, 24, 80), (60, 32, 160), (160, 256, 512))
SGLANG_LARGE_GRAPH_BS = 512
#: SGLang's reserve floor (MiB) on a GPU of more than 60 GiB
SGLANG_RESERVE_FLOOR_MIB = 10 * 1024


@dataclass(frozen=True)
class KvPool:
    """A replica's KV pool: its bytes (``gb``, in simlab's units: the replica's KV bytes a
    token, :func:`simlab.cost.shapes.on_tp`), what one GPU holds and why."""

    gb: float
    tokens: int  # the tokens it holds
    fraction: float  # the engine's memory fraction
    #: GiB on one GPU: capacity, weights, activations, runtime, communication buffers, kv
    per_gpu: dict[str, float]
    #: what the fraction rests on where simlab estimated the engine's own (SGLang's)
    caveat: str = ""

    def row(self) -> dict[str, object]:
        """What a run's ``summary.json`` and each validated silicon row record."""
        row: dict[str, object] = {
            "kv_pool_gb": round(self.gb, 3),
            "kv_pool_tokens": self.tokens,
            "memory_fraction": self.fraction,
            "per_gpu_gib": {k: round(v, 3) for k, v in self.per_gpu.items()},
        }
        return row | ({"caveat": self.caveat} if self.caveat else {})


def sglang_fraction(capacity_bytes: float, chunk: int, tp: int) -> float:
    """SGLang's ``mem_fraction_static`` when its launch sets none
    (``ServerArgs._handle_gpu_memory_settings``, ``python/sglang/srt/server_args.py``): the GPU's
    memory less a reserve of 512 MiB + 1.5 MiB a token of the chunk (2,048 at least) + 2 MiB a
    request of ``cuda_graph_max_bs`` (by GPU memory and TP) + 128 MiB a GPU of TP, at least
    10 GiB on a GPU above 60 GiB, rounded to three places. Not applied: its cut for multimodal
    models' image processing and its piecewise CUDA graphs' few hundred MiB."""
    mib = capacity_bytes / MIB
    gib = mib / 1024
    graph_bs = next(
        (small if tp < 4 else large for below, small, large in SGLANG_GRAPH_BS if gib < below),
        SGLANG_LARGE_GRAPH_BS,
    )
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp / 8 * 1024
    if gib > 60:
        reserved = max(reserved, SGLANG_RESERVE_FLOOR_MIB)
    return round((mib - reserved) / mib, 3)


def default_fraction(backend: str, capacity_bytes: float, chunk: int, tp: int) -> float:
    """``backend``'s memory fraction when none is set (:data:`DEFAULT_FRACTION`, SGLang's
    :func:`sglang_fraction`)."""
    if backend == "sglang":
        return sglang_fraction(capacity_bytes, chunk, tp)
    return DEFAULT_FRACTION[backend]


def size(
    model: str,
    held: ModelSpec,
    where: tuple[str, str, str | None],
    tp: int,
    token_budget: int,
    quant: tuple[str | None, str | None, str | None],
    fraction: float | None = None,
    capacity_gib: float | None = None,
) -> KvPool | None:
    """The KV pool of ``model`` (aiconfigurator-core's name, :func:`aic_model`) as the replica's
    ``tp`` GPUs hold it (``held``) on ``where`` (GPU, engine, tables version), the engine's
    activations at ``token_budget`` tokens, at ``quant`` (GEMM, MoE, KV cache) and the engine's
    memory ``fraction`` (None: :func:`default_fraction`); ``capacity_gib``: the GPU's memory
    where less than aiconfigurator-core's for ``system`` (an A100 of 40 GB on the A100-SXM's
    tables); None where aiconfigurator-core's memory model cannot build the model, or nothing
    is left for the KV cache."""
    system, backend, version = where
    aic = gpu_memory(model, system, backend, version, tp, token_budget, quant)
    if aic is None:
        return None
    weights = weights_per_gpu(held, tp)
    memory = aic | {"weights": weights}  # the replayed model's, not aiconfigurator's
    if capacity_gib is not None:
        memory["capacity"] = min(memory["capacity"], capacity_gib * GIB)
    capacity, activations = memory["capacity"], memory["activations"]
    caveat = ""
    if fraction is None:
        fraction = default_fraction(backend, capacity, token_budget, tp)
        if backend == "sglang":
            caveat = (
                f"sglang's mem_fraction_static {fraction:g} is its 0.5 releases' heuristic "
                "(ServerArgs._handle_gpu_memory_settings), without its cut for a multimodal "
                "model nor the later releases' sizing after CUDA graph capture; "
                "engine.memory_fraction sets the server's"
            )
    non_kv = weights + activations + memory["runtime"] + memory["communication"]
    if backend == "trtllm":
        kv = fraction * (capacity - non_kv)
    elif backend == "sglang":
        kv = fraction * capacity - weights - memory["communication"]
    else:
        kv = fraction * capacity - non_kv
    if kv <= 0:
        return None
    gb = tp * kv / 1e9
    per_gpu = {k: v / GIB for k, v in (memory | {"kv": kv}).items()}
    return KvPool(gb, int(gb * 1e9 // held.kv_bytes_per_token), fraction, per_gpu, caveat)


def weights_per_gpu(held: ModelSpec, tp: int) -> float:
    """One GPU's weights in bytes: the model's parameters as its ``tp`` GPUs hold them (K/V
    projections copied where the KV heads are) at the checkpoint's format, the embedding and LM
    head at BF16 at least (:func:`simlab.model.layers.weight_bytes`), split over the GPUs."""
    return layers.weight_bytes(held) / tp


def aic_model(model: str) -> str:
    """aiconfigurator-core's name of the model's config (its ``model_configs``): Meta's Llama
    3.1 checkpoints under their first name (``meta-llama/Llama-3.1-70B`` ->
    ``meta-llama/Meta-Llama-3.1-70B``; a name already in that form unchanged)."""
    return re.sub(r"(?<!Meta-)Llama-3\.1", "Meta-Llama-3.1", model).removesuffix("-Instruct")


def shipped_config(aic_name: str) -> Path | None:
    """The Hugging Face ``config.json`` aiconfigurator-core ships for the model it names
    ``aic_name`` (:func:`aic_model`; None: none shipped, and its memory model would download
    one)."""
    root = tables.systems_dir()
    if root is None:
        return None
    path = root.parent / "model_configs" / f"{aic_name.replace('/', '--')}_config.json"
    return path if path.exists() else None


@functools.lru_cache(maxsize=512)
def gpu_memory(
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

    if shipped_config(model) is None:  # never a download: no network at run time
        log.info("%s: aiconfigurator-core ships no config of it, so no memory model", model)
        return None
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
