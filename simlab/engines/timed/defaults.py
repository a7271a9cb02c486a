"""The scheduling defaults of the engine a timed run stands for (``engine.backend``) on its GPU,
and the caveat of a run whose settings differ from them (:func:`caveat`).

simlab's own defaults (``engine.token_budget=8192``, ``batching=mixed``) are one engine's on one
GPU; ``engine.max_running=null`` (the default) takes the engine's own cap (:func:`running`). An
engine sizes its defaults by the GPU's memory, as its code reads it at start-up:

- vLLM (``EngineArgs.get_batch_defaults``, ``vllm/engine/arg_utils.py``): on a GPU of at
  least 70 GiB that is not an A100, ``max_num_batched_tokens`` 8,192 for its OpenAI server and
  16,384 for the ``LLM`` class, ``max_num_seqs`` 1,024; on the others 2,048 / 8,192 and 256.
  Prefill chunks and decodes share an iteration (``batching=mixed``).
- SGLang (``ServerArgs._handle_gpu_memory_settings``, ``python/sglang/srt/server_args.py``):
  ``--chunked-prefill-size`` 2,048 under 35 GB, 4,096 under 60 GB, 8,192 under 160 GB and
  16,384 above; its scheduler runs a prefill batch before the decodes
  (``batching=prefill_first``) unless ``--enable-mixed-chunk``. Its ``--max-running-requests``
  follows the KV pool's size (``ModelRunner``: 2,048 to 4,096, and half the pool's tokens):
  :func:`running` takes its floor, 2,048, and it is not compared.
- TensorRT-LLM (``BaseLlmArgs``, ``tensorrt_llm/llmapi/llm_args.py``): ``max_num_tokens``
  8,192 and ``max_batch_size`` 2,048 on every GPU; context and generation requests share an
  iteration.

A run whose settings differ says so once, in one line naming the keys and the engine's values,
and records it in ``summary.json`` (``config.engine_defaults``): its figures are simlab's
scheduling on that engine's kernels, not the engine as it starts by default.
"""

from __future__ import annotations

from typing import Any

#: vLLM's large defaults need this much GPU memory (GiB) and a GPU that is not an A100
VLLM_LARGE_GIB = 70
#: SGLang's ``--chunked-prefill-size`` by GPU memory: (below this many GB, tokens)
SGLANG_CHUNKS = ((35, 2048), (60, 4096), (160, 8192))
SGLANG_LARGE_CHUNK = 16384
#: TensorRT-LLM's ``max_num_tokens`` and ``max_batch_size``
TRTLLM_TOKENS, TRTLLM_BATCH = 8192, 2048
#: SGLang's request pool at least (``ModelRunner``'s ``max_num_reqs``)
SGLANG_RUNNING = 2048
#: how the caveat ends
SAID = "starts by default (docs/guides/engines.md#the-engines-own-defaults)"


def running(backend: str, gpu: str, mem_gb: float) -> int:
    """``backend``'s cap on running requests on the GPU (``engine.max_running=null``): vLLM's
    ``max_num_seqs``, TensorRT-LLM's ``max_batch_size``, and SGLang's floor of 2,048 (its
    request pool, ``min(max(pool tokens / context length x 512, 2048), 4096)``, and half the
    pool's tokens: at least 2,048 for a pool of 4,096 tokens or more; it runs out of KV first)."""
    if backend == "vllm":
        return defaults(backend, gpu, mem_gb)["max_running"][0]
    return SGLANG_RUNNING if backend == "sglang" else TRTLLM_BATCH


def defaults(backend: str, gpu: str, mem_gb: float) -> dict[str, tuple[Any, ...]]:
    """``{engine key: the values the backend's defaults give it}`` on a GPU named ``gpu`` (a
    hardware preset's name) of ``mem_gb`` of memory; several values where the engine has
    several entry points (vLLM's server and ``LLM`` class)."""
    if backend == "vllm":
        large = mem_gb >= VLLM_LARGE_GIB and "a100" not in gpu.lower()
        return {
            "token_budget": (8192, 16384) if large else (2048, 8192),
            "max_running": (1024,) if large else (256,),
            "batching": ("mixed",),
        }
    if backend == "sglang":
        chunk = next((c for below, c in SGLANG_CHUNKS if mem_gb < below), SGLANG_LARGE_CHUNK)
        return {"token_budget": (chunk,), "batching": ("prefill_first",)}
    if backend == "trtllm":
        return {
            "token_budget": (TRTLLM_TOKENS,),
            "max_running": (TRTLLM_BATCH,),
            "batching": ("mixed",),
        }
    return {}


def caveat(
    settings: Any, backend: str, gpu: str, mem_gb: float, keys: tuple[str, ...] | None = None
) -> str | None:
    """The line of a run whose ``settings`` (``engine.token_budget``, ``max_running``,
    ``batching``; only ``keys`` where given) differ from ``backend``'s defaults on the GPU
    (None: they agree)."""
    differ = []
    for key, values in defaults(backend, gpu, mem_gb).items():
        if keys is not None and key not in keys:
            continue
        have = getattr(settings, key)
        if have not in values:
            theirs = " or ".join(str(v) for v in values)
            differ.append(f"engine.{key}={have} ({backend}: {theirs})")
    if not differ:
        return None
    return (
        f"{backend}'s defaults on {gpu} differ: {', '.join(differ)}; the run schedules as "
        f"set, not as {backend} {SAID}"
    )
