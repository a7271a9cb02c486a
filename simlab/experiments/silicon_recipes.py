"""The server settings each measured serving point ran with: InferenceX's launch scripts.

``silicon_sample.csv``'s points are InferenceX runs (their ``silicon_data_source``). The csv
records the model, GPU, engine, version, tensor parallelism, concurrency and lengths, not the
server's flags. The flags that decide how long a request waits are in InferenceX's launch scripts
(github.com/SemiAnalysisAI/InferenceX, Apache-2.0), read here at the commit in force on the
point's measurement date:

- SGLang: ``--scheduler-recv-interval`` (new requests are pulled every N decode steps,
  ``engine.recv_interval``), ``--chunked-prefill-size`` and ``--kv-cache-dtype``;
- TensorRT-LLM: ``max_num_tokens`` (no chunked prefill: one iteration's tokens) and, for some
  shapes, ``batch_wait_timeout_iters`` / ``batch_wait_max_tokens_ratio`` (new prompts held while
  others decode, ``engine.batch_wait_iters``) and the KV cache's dtype (FP8 in every script);
- vLLM: ``max-num-batched-tokens 8192`` and ``max-num-seqs`` at least the concurrency, which
  are simlab's defaults for these points already, and ``kv-cache-dtype: fp8``.

The KV cache's dtype (``model.kv_dtype_bytes``) picks the attention tables' FP8 or BF16 rows;
the MoE backend (SGLang's ``--moe-runner-backend``, TensorRT-LLM's ``moe_config.backend``) the
MoE table's kernel (``engine.moe_kernel``, :mod:`simlab.cost.measured.moe_kernel`); the memory
fraction (SGLang's ``--mem-fraction-static``, TensorRT-LLM's ``free_gpu_memory_fraction``,
vLLM's ``--gpu-memory-utilization``) the KV pool (:mod:`simlab.experiments.silicon_memory`).

Two runs among the csv's aggregated points are of InferenceX's speculative-decoding (MTP)
configs, which the csv does not mark (:data:`SPECULATIVE_RUNS`); they are counted, not
replayed.

What each script sets is in :func:`recipe`, with the script and commit it was read from (each
validated row carries it as ``recipe``). Three settings are not applied:

- the overlapped loops: SGLang's overlap scheduler (its default; no script turns it off),
  vLLM's ``async-scheduling: true`` (every Llama script) and TensorRT-LLM's overlap scheduler
  (its PyTorch backend's default). ``engine.overlap`` models the first two, but SGLang's on a
  hybrid only with a Mamba prefix cache these servers ran without (``--disable-radix-cache``),
  and none on the prefix tree TensorRT-LLM's points run on. At zero overhead the loop changes
  nothing that shows: Llama-3.1-70B on B200 with vLLM at TP 8, concurrency 4, 1,024 / 1,024
  tokens replays at 34.5 ms TTFT and 6.85 ms TPOT either way, DeepSeek-R1 on H200 with SGLang
  at 81.8 and 11.8. It would hide the fitted per-iteration overhead behind the GPU, and that
  fit is at most 2 ms (:mod:`simlab.experiments.silicon_fit`).
- ``--max-running-requests`` (128 on Blackwell): the csv has points above it (concurrency 256
  and 512) whose TTFT shows no such queue (DeepSeek-R1 on B200 at 1,024 / 8,192 tokens and
  concurrency 256: 1.8 s, where 128 running would make half the requests wait a whole
  generation), so those points ran with another setting; each point's cap is its concurrency.
- the stream intervals (10 to 50 tokens a chunk): SGLang and TensorRT-LLM send the first token
  at once whatever the interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simlab.experiments.silicon import Point


#: the images of InferenceX's October-November 2025 workflows (``70b-tmpl.yml`` at 9596d23d7^,
#: ``dsr1-tmpl.yml`` at e06929c70): the points of that time, whose csv rows give no version
VLLM_2025 = "0.10.2"  # vllm/vllm-openai:v0.10.2
TRTLLM_2025 = "1.1.0rc2.post2"  # nvcr.io/nvidia/tensorrt-llm/release:1.1.0rc2.post2

#: TensorRT-LLM's generated MoE kernels, as FlashInfer wraps them (SGLang's
#: ``--moe-runner-backend flashinfer_trtllm``, TensorRT-LLM's ``moe_config.backend: TRTLLM``)
FLASHINFER_TRTLLM = "flashinfer_trtllm"


@dataclass(frozen=True)
class Recipe:
    """The engine settings of one point's server, and where they were read."""

    source: str  # the launch script and commit
    token_budget: int = 8192
    recv_interval: int = 1
    batch_wait_iters: int = 0
    batch_wait_tokens_ratio: float = 0.0
    kv_dtype_bytes: int = 2  # the KV cache: BF16 (the engines' auto), FP8 (1) where set
    moe_kernel: str | None = None  # the MoE backend the script names (None: the engine's own)
    #: the KV pool's share of memory: SGLang's --mem-fraction-static, TensorRT-LLM's
    #: free_gpu_memory_fraction, vLLM's --gpu-memory-utilization (None: the engine's default)
    memory_fraction: float | None = None
    #: the engine version of the image the workflow ran, for the points whose csv row gives
    #: none (None: the csv's)
    image_version: str | None = None

    def overrides(self, concurrency: int) -> list[str]:
        """The ``engine.*`` overrides the point is simulated with."""
        return [
            f"engine.token_budget={self.token_budget}",
            f"engine.max_running={concurrency}",
            f"engine.recv_interval={self.recv_interval}",
            f"engine.batch_wait_iters={self.batch_wait_iters}",
            f"engine.batch_wait_tokens_ratio={self.batch_wait_tokens_ratio}",
            f"engine.moe_kernel={self.moe_kernel or 'null'}",
        ]


def _sglang_blackwell(script: str, p: Point) -> Recipe:
    """The SGLang scripts for B200 / B300 (DeepSeek at TP 8, Qwen3.5 BF16 and FP8 on B200,
    BF16 on B300): pulls every 30 decode steps from concurrency 16 (10 below), chunks of
    32,768 tokens, ``--mem-fraction-static 0.82``; DeepSeek at TP 4: every 10 steps, chunks of
    8,192, 0.95. The FP8 models' scripts set ``--kv-cache-dtype fp8_e4m3``; the BF16 ones leave
    it at auto (BF16). Every one runs ``--moe-runner-backend flashinfer_trtllm``."""
    kv = 1 if p.precision == "fp8" else 2
    if p.model.startswith("deepseek-ai/") and p.tp == 4:
        return Recipe(script, 8192, 10, 0, 0.0, kv, FLASHINFER_TRTLLM, 0.95)
    interval = 30 if p.concurrency >= 16 else 10
    return Recipe(script, 32768, interval, 0, 0.0, kv, FLASHINFER_TRTLLM, 0.82)


#: the runs of InferenceX's speculative-decoding (MTP) configs among the csv's aggregated points,
#: which the csv does not mark: (model, GPU, engine, precision, the image's tag, the measurement
#: date). Each run's measurement time is the moment the commit that triggered it was merged,
#: and that commit changed the ``-mtp`` config alone; the image ran in no other config of the
#: model then (``.github/configs/nvidia-master.yaml``)
SPECULATIVE_RUNS = {
    # 5d517074c "dsr1 fp8 b200 trt agg mtp update" (2026-02-05 19:55 UTC):
    # dsr1-fp8-b200-trt-mtp on release:1.2.0rc6.post3; dsr1-fp8-b200-trt ran 1.2.0rc6.post2
    ("deepseek-ai/DeepSeek-R1", "b200_sxm", "trtllm", "fp8", "1.2.0rc6.post3", "2026-02-05"),
    # 35d4bb367 "Add Qwen3.5 FP8 B200 SGLang MTP config" (2026-03-20 22:08 UTC):
    # qwen3.5-fp8-b200-sglang-mtp on v0.5.9-cu130; qwen3.5-fp8-b200-sglang ran v0.5.9-cu129-amd64
    ("Qwen/Qwen3.5-397B-A17B", "b200_sxm", "sglang", "fp8", "v0.5.9-cu130", "2026-03-20"),
}


def speculative(model: str, system: str, backend: str, precision: str, source: str) -> bool:
    """Whether a csv row (its columns and ``silicon_data_source``) is a run of one of
    InferenceX's speculative-decoding configs (:data:`SPECULATIVE_RUNS`)."""
    fields = dict(part.strip().split("=", 1) for part in source.split(";") if "=" in part)
    tag = fields.get("image", "").rsplit(":", 1)[-1]
    date = fields.get("measured", "")[:10]
    return (model, system, backend, precision, tag, date) in SPECULATIVE_RUNS


def recipe(p: Point) -> Recipe:
    """The settings of ``p``'s server (by its model, GPU, engine, shape and measurement date)."""
    family = p.model.split("/")[1].lower()
    found = {"sglang": _sglang, "trtllm": _trtllm, "vllm": _vllm}[p.backend](p, family)
    return found or Recipe("none: the engine's defaults (no InferenceX script read for it)")


def _sglang(p: Point, family: str) -> Recipe | None:
    if family.startswith("deepseek"):
        if p.system == "h200_sxm":
            h200 = "benchmarks/single_node/dsr1_fp8_h200.sh@38b80a859"
            return Recipe(h200, 32768, memory_fraction=0.82)
        if p.system == "b300_sxm":
            return _sglang_blackwell("benchmarks/single_node/dsr1_fp8_b300.sh@5b302f147", p)
        return _sglang_blackwell("benchmarks/single_node/dsr1_fp8_b200.sh@38b80a859", p)
    return _qwen35(p) if family.startswith("qwen3.5") else None


def _qwen35(p: Point) -> Recipe | None:
    """Qwen3.5-397B-A17B's SGLang scripts (``--ep-size`` their csv's EP). FP8 on H200: chunks of
    16,384, 0.8 of the memory, an FP8 KV cache and SGLang's own MoE runner."""
    if p.system == "h200_sxm" and p.precision == "fp8":
        h200 = "benchmarks/single_node/qwen3.5_fp8_h200.sh@f65d6b4b1"
        return Recipe(h200, 16384, 1, 0, 0.0, 1, None, 0.8)
    if p.system == "b300_sxm" and p.precision == "fp8":
        b300 = "benchmarks/single_node/qwen3.5_fp8_b300.sh@c0f62a2ef"
        return Recipe(b300, 16384, 10, 0, 0.0, 1, FLASHINFER_TRTLLM, 0.8)
    script = {
        ("b200_sxm", "bf16"): "benchmarks/single_node/qwen3.5_bf16_b200.sh@9dc87a68c",
        ("b200_sxm", "fp8"): "benchmarks/single_node/qwen3.5_fp8_b200.sh@6a5dad463",
        ("b300_sxm", "bf16"): "benchmarks/single_node/qwen3.5_bf16_b300.sh@32274d6c1",
    }.get((p.system, p.precision))
    return None if script is None else _sglang_blackwell(script, p)


def _trtllm(p: Point, family: str) -> Recipe | None:
    """Every script sets ``kv_cache_config: dtype: fp8``. DeepSeek's ``moe_config.backend``:
    ``TRTLLM`` on B200 from 2026 (``DEEPGEMM`` at 1,024 / 8,192 tokens from concurrency 256),
    ``DEEPGEMM`` on B200 before, ``CUTLASS`` on H200; its ``free_gpu_memory_fraction``: 0.75 on
    H200, 0.8 on B200 (from 2026: 0.7 at 1,024 / 8,192 from concurrency 256, 0.75 at 8,192 /
    1,024 on TP 4). Llama's scripts leave the fraction at TensorRT-LLM's default."""
    gpu = "b200" if p.system == "b200_sxm" else "h200"
    if family.startswith("deepseek"):
        # max_num_tokens: the concurrency + ISL + 64, rounded up to 64; at least 8,192 in the
        # scripts from 2026-01-21 (InferenceX 64af5a771), not in the slurm scripts before
        tokens = (p.concurrency + p.isl + 64 + 63) // 64 * 64
        if gpu == "b200" and p.measured >= "2026-01-01":
            script = "benchmarks/dsr1_fp8_b200_trt.sh@ec7bafaae"
            tokens = max(8192, tokens)
            deepgemm = p.isl == 1024 and p.osl == 8192 and p.concurrency >= 256
            moe = "deepgemm" if deepgemm else FLASHINFER_TRTLLM  # TensorRT-LLM's own kernels
            fraction = 0.7 if deepgemm else 0.75 if p.isl == 8192 and p.tp == 4 else 0.8
            if p.isl == p.osl == 1024 and p.concurrency >= 64:  # DELAY_BATCHING=true
                # wait 40 iterations / 0.8 of the tokens; FP8 KV
                return Recipe(script, tokens, 1, 40, 0.8, 1, moe, fraction)
            return Recipe(script, tokens, 1, 0, 0.0, 1, moe, fraction)
        slurm = f"benchmarks/dsr1_fp8_{gpu}_trt_slurm.sh@17d5e204f"
        if gpu == "h200" and p.measured >= "2026-01-12":  # the same flags (2ee1e0018)
            slurm = "benchmarks/dsr1_fp8_h200_trt_slurm.sh@2ee1e0018"
        if gpu == "h200" and p.measured >= "2026-01-22":  # b0c4ed21b: one script, the floor
            slurm, tokens = "benchmarks/dsr1_fp8_h200_trt.sh@b30c3398a", max(8192, tokens)
        moe = "deepgemm" if gpu == "b200" else "cutlass"
        fraction = 0.8 if gpu == "b200" else 0.75
        return Recipe(slurm, tokens, 1, 0, 0.0, 1, moe, fraction, TRTLLM_2025)
    if family.startswith("llama-3.1-70b"):
        script = f"benchmarks/70b_fp8_{gpu}_trt_slurm.sh@9596d23d7^"
        if p.isl == p.osl == 1024 and p.tp < 8:  # wait 20 iters / 0.9; FP8 KV
            return Recipe(script, 16384, 1, 20, 0.9, 1, image_version=TRTLLM_2025)
        return Recipe(script, 16384, kv_dtype_bytes=1, image_version=TRTLLM_2025)
    return None


#: InferenceX's MiniMax-M2.5 FP8 vLLM scripts that passed ``--enable-expert-parallel`` whenever
#: ``EP_SIZE -ge 1``, so at the csv's EP 1 too (``-gt 1`` from bddbf4031 on B200; the H100
#: script always tested ``-gt 1``): GPU -> (the first, the last measurement date it was in force
#: for). Their points run with ``engine.ep`` = their tp
MINIMAX_SCRIPT_EP = {
    "h200_sxm": ("2026-03-13", "2026-05-25"),  # 5e2c705d3 .. 8014ee637
    "b200_sxm": ("2026-03-11", "2026-04-02"),  # f342df18e .. bddbf4031
}


def script_expert_parallel(model: str, system: str, measured: str) -> bool:
    """Whether a point's launch script ran its experts in parallel though the csv gives EP 1
    (:data:`MINIMAX_SCRIPT_EP`)."""
    span = MINIMAX_SCRIPT_EP.get(system) if model.startswith("MiniMaxAI/MiniMax-M2") else None
    return span is not None and span[0] <= measured[:10] <= span[1]


def _minimax(p: Point) -> Recipe | None:
    """MiniMax-M2.5 FP8's ``vllm serve``:

    - H200: vLLM's defaults at ``--gpu-memory-utilization 0.95``, the KV cache at auto (BF16);
      tensor parallel alone before 2026-03-13 (a36346339), experts in parallel from then
      (5e2c705d3 to 8014ee637^, :func:`script_expert_parallel`);
    - B200 from 2026-03-11 to 04-02 (f342df18e to bddbf4031^): the same at 0.95, experts in
      parallel, FlashInfer's and DeepGEMM's MoE off (``VLLM_USE_FLASHINFER_MOE_FP8=0``,
      ``VLLM_MOE_USE_DEEP_GEMM=0``: vLLM's Triton fused MoE);
    - B200 from 2026-04-03 (bddbf4031, 41ed82dc1) and B300 from 2026-04-17 (340d7854c,
      0c2467c15): ``--kv-cache-dtype fp8``, ``--max-num-batched-tokens`` twice the ISL, 0.90,
      experts in parallel at the csv's EP above 1;
    - H100 from 2026-03-02 (ac0d2a853 to 298d8f94c^): vLLM's defaults at 0.90, BF16 KV,
      experts in parallel at the csv's EP above 1.

    B300's nightly image of 2026-04-03 ran before any B300 script, H200's from 2026-05-26 on
    a script not read here (None)."""
    script = "benchmarks/single_node/minimaxm2.5_fp8_{}.sh@{}"
    if p.system == "h200_sxm" and p.measured < "2026-05-26":
        h200 = "a36346339" if p.measured < "2026-03-13" else "5e2c705d3..8014ee637^"
        return Recipe(script.format("h200", h200), memory_fraction=0.95)
    if p.system == "h100_sxm" and "2026-03-02" <= p.measured < "2026-05-22":
        return Recipe(script.format("h100", "ac0d2a853..298d8f94c^"), memory_fraction=0.9)
    if p.system == "b200_sxm" and "2026-03-11" <= p.measured < "2026-04-03":
        b200 = script.format("b200", "f342df18e..bddbf4031^")
        return Recipe(b200, moe_kernel="vllm_fused_moe", memory_fraction=0.95)
    commit = {"b200_sxm": ("2026-04-03", "bddbf4031", "41ed82dc1"),
              "b300_sxm": ("2026-04-17", "340d7854c", "0c2467c15")}.get(p.system)  # fmt: skip
    if commit is None or p.measured < commit[0]:
        return None
    in_force = commit[2] if p.measured >= "2026-04-21" else commit[1]  # merged that day
    gpu = p.system.split("_")[0]
    return Recipe(script.format(gpu, in_force), 2 * p.isl, kv_dtype_bytes=1, memory_fraction=0.9)


def _vllm(p: Point, family: str) -> Recipe | None:
    if family.startswith("minimax-m2"):
        return _minimax(p)
    if not family.startswith("llama-3.1-70b"):
        return None
    where = {"b200_sxm": "b200_docker", "h100_sxm": "h100_slurm", "h200_sxm": "h200_slurm"}
    # config.yaml: ``kv-cache-dtype: fp8``; ``--gpu-memory-utilization 0.9``
    script = f"benchmarks/70b_fp8_{where[p.system]}.sh@9596d23d7^"
    return Recipe(script, kv_dtype_bytes=1, memory_fraction=0.9, image_version=VLLM_2025)
