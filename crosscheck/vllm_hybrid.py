"""vLLM v1's real ``Scheduler`` over a Nemotron-H hybrid (``mamba_cache_mode="align"``), driven
over a ``crosscheck.export`` one request at a time.

    .venv-crosscheck/bin/python -m crosscheck.vllm_hybrid \
        --export .crosscheck/sharegpt_nemotron_h_8b.npz --name sharegpt_nemotron_h_8b --size-gb inf

Real vLLM 0.33.0 code, in the engine core's order: a ``VllmConfig`` whose ``ModelConfig`` reads a
``config.json`` only (Nemotron-H-8B-Base's, written to a temporary directory; no weights, no
tokenizer), ``CacheConfig(enable_prefix_caching=True, mamba_cache_mode="align",
mamba_ssm_cache_dtype=...)``; the model instantiated on the meta device so its attention and
``MambaMixer2`` layers register; ``Platform.update_block_size_for_backend`` (which calls
``_align_hybrid_block_size``: 528 tokens with a BF16 state, 1,040 with vLLM's FP32 default); each
layer's ``get_kv_cache_spec``, ``get_global_kv_cache_groups``, ``get_kv_cache_configs``,
``generate_scheduler_kv_cache_config``, ``resolve_kv_cache_block_sizes``; the sync ``Scheduler``
with ``add_request`` / ``schedule`` / ``update_from_output``; requests hashed by
``get_request_block_hasher``.

Stand-ins (no GPU): the platform answers as CUDA does where the cache path asks it (hybrid KV
cache manager supported, FlashAttention backend), the device is ``cpu``, and the model runner is
faked: a step samples the request's next scripted output token once its prefill is complete.

The hit of a request is ``num_computed_tokens`` of its first scheduled step. Capacity: one block
holds a block of every layer of one KV-cache group (4 layers: the attention group, and each of
the 6 Mamba groups of 4 layers), so ``floor(size_gb·1e9 / (page · 4))`` usable blocks plus
vLLM's null block (as ``vllm_blocks.py`` sizes its pool); ``inf``
gives blocks for every token of the trace and a state per request.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
from pathlib import Path

import torch

from crosscheck import stubs

stubs.install()

from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)

from crosscheck.common import (  # noqa: E402
    GB,
    Export,
    base_parser,
    manifest_size,
    replay_each,
    run_case,
    setup_logging,
    size_label,
    versions,
)

FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"

#: nvidia/Nemotron-H-8B-Base-8K's config.json (simlab's ``configs/model/nemotron_h_8b.yaml``)
NEMOTRON_H_8B = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 4096,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_hidden_layers": 52,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "attention_head_dim": 128,
    "max_position_embeddings": 131072,
    "intermediate_size": 21504,
    "mlp_hidden_act": "relu2",
    "ssm_state_size": 128,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "n_groups": 8,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 256,
    "use_conv_bias": True,
    "mamba_hidden_act": "silu",
    "layer_norm_epsilon": 1e-5,
    "residual_in_fp32": False,
    "rescale_prenorm_residual": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


#: meta-llama/Llama-3.1-8B's config.json (simlab's ``configs/model/llama3_8b.yaml``: the same
#: layers and KV heads as Llama-3-8B; its longer context admits ShareGPT's longest sequences)
LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
#: the models a driver can run, by the KV bytes per token of the export's model
MODELS = {
    16384: ("Nemotron-H-8B", "nemotron_h_8b", NEMOTRON_H_8B),
    131072: ("Llama-3-8B", "llama3_8b", LLAMA_3_8B),
}


def patch_platform() -> None:
    """No GPU resolves ``UnspecifiedPlatform``: give the two answers CUDA gives on the cache
    path (the hybrid KV cache manager is supported; attention runs on FlashAttention)."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    platform.support_hybrid_kv_cache = classmethod(lambda cls: True)
    platform.get_attn_backend_cls = classmethod(lambda cls, *a, **k: FLASH_ATTN)


def build_config(
    model_dir: str,
    ssm_dtype: str,
    max_model_len: int,
    hybrid: bool = True,
    block: int = 16,
    match_unit: int | None = None,
    retention: int | None = 0,
) -> VllmConfig:
    """The engine's config for the model in ``model_dir``; a Transformer (``hybrid`` False)
    takes vLLM's cache config with prefix caching on and ``block``-token blocks (vLLM's
    ``--block-size``, 16 by default); a hybrid takes ``match_unit`` as vLLM's
    ``--prefix-match-unit`` (None: its default, the block) and ``retention`` as its
    ``--prefix-cache-retention-interval`` (0, its default: the semantic states; None: dense)."""
    patch_platform()
    cache: dict = (
        {
            "mamba_cache_mode": "align",
            "mamba_ssm_cache_dtype": ssm_dtype,
            "prefix_match_unit": match_unit,
            "prefix_cache_retention_interval": retention,
        }
        if hybrid
        else {"block_size": block}
    )
    return VllmConfig(
        model_config=ModelConfig(
            model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=max_model_len
        ),
        cache_config=CacheConfig(enable_prefix_caching=True, **cache),
        scheduler_config=SchedulerConfig(
            max_model_len=max_model_len, is_encoder_decoder=False, async_scheduling=False
        ),
        device_config=DeviceConfig(device="cpu"),
    )


def register_layers(config: VllmConfig) -> None:
    """The model on the meta device, so its layers register in the forward context."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.model_executor.models import ModelRegistry

    with set_current_vllm_config(config):
        if not model_parallel_is_initialized():  # once per process, for every size
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{29500 + os.getpid() % 1000}",
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
    cls, _ = ModelRegistry.resolve_model_cls(
        config.model_config.architecture, model_config=config.model_config
    )
    with set_current_vllm_config(config), torch.device("meta"):
        cls(vllm_config=config, prefix="")


def layer_specs(config: VllmConfig) -> dict:
    """``GPUModelRunner.get_kv_cache_spec`` (no KV sharing, no encoder cache)."""
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.kv_cache_interface import AttentionSpec
    from vllm.v1.worker.gpu_model_runner import customize_attention_spec

    specs = {}
    with set_current_vllm_config(config):
        for name, layer in get_layers_from_vllm_config(config, AttentionLayerBase).items():
            spec = layer.get_kv_cache_spec(config)
            if spec is None:
                continue
            if isinstance(spec, AttentionSpec):
                spec = customize_attention_spec(layer.get_attn_backend(), spec)
            specs[name] = spec
    return specs


def build_scheduler(
    config: VllmConfig, size_gb: float, blocks_for_inf: int, async_scheduling: bool = False
):
    """The scheduler over a pool of ``size_gb`` (see the module docstring), with the hash block
    size, the bytes of one block and the layers' KV-cache specs. ``async_scheduling``: vLLM's
    ``AsyncScheduler`` (its default, ``--async-scheduling``: output placeholders for the tokens
    of steps whose results are not processed yet)."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.worker.worker_base import get_current_attn_backends

    register_layers(config)
    Platform.update_block_size_for_backend.__func__(type(current_platform), config)
    specs = layer_specs(config)
    with set_current_vllm_config(config):
        backends = get_current_attn_backends(config)
        layouts = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
        resolve_kv_cache_layout(config, [layouts], list(specs.values()))
    groups = get_global_kv_cache_groups(config, [specs])
    page = max(s.page_size_bytes for s in specs.values())
    per_block = page * max(len(g.layer_names) for g in groups)  # one page of every group layer
    blocks = blocks_for_inf if math.isinf(size_gb) else math.floor(size_gb * GB / per_block)
    config.cache_config.num_gpu_blocks_override = blocks + 1  # and vLLM's null block
    configs = get_kv_cache_configs(config, [specs], [per_block * (blocks + 8)], groups)
    sched_config = generate_scheduler_kv_cache_config(configs)
    config.cache_config.num_gpu_blocks = sched_config.num_blocks
    config.cache_config.block_size = min(
        g.kv_cache_spec.block_size
        for g in sched_config.kv_cache_groups
        if g.kv_cache_spec.prefix_cacheable
    )
    config.validate_block_size()
    block, hash_block = resolve_kv_cache_block_sizes(sched_config, config)
    align = resolve_cache_hit_alignment_tokens(sched_config, config, block, hash_block)
    for c in (*configs, sched_config):
        c.hash_block_size = hash_block
        c.cache_hit_alignment_tokens = align
    config.scheduler_config.async_scheduling = async_scheduling
    scheduler = (AsyncScheduler if async_scheduling else Scheduler)(
        vllm_config=config,
        kv_cache_config=sched_config,
        structured_output_manager=StructuredOutputManager(config),
        log_stats=False,
        block_size=block,
        hash_block_size=hash_block,
    )
    return scheduler, hash_block, per_block, specs


class SchedulerReplay:
    """One request at a time through the real scheduler, the model runner faked."""

    def __init__(self, scheduler, hash_block: int, config: VllmConfig) -> None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(
            hash_block, hash_fn, config.num_hash_lookahead_tokens
        )
        self.scheduler = scheduler
        self._next_id = 0

    def _request(self, name: str, input_ids: list[int], output_ids: list[int]):
        """A request that samples exactly ``len(output_ids)`` tokens (no EOS)."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        if not output_ids:
            raise ValueError("vLLM always samples at least one output token")
        req = Request(
            request_id=name,
            prompt_token_ids=list(input_ids),
            sampling_params=SamplingParams(max_tokens=len(output_ids), ignore_eos=True),
            pooling_params=None,
            block_hasher=self.hasher,
        )
        req.eos_token_id = None
        return req

    def request(self, input_ids: list[int], output_ids: list[int]) -> int:
        """Run one request to completion; returns its hit tokens."""
        from vllm.v1.outputs import ModelRunnerOutput

        name = str(self._next_id)
        self._next_id += 1
        req = self._request(name, input_ids, output_ids)
        scheduler = self.scheduler
        scheduler.add_request(req)
        hit, sampled = None, 0
        while name in scheduler.requests:
            step = scheduler.schedule()
            if hit is None:
                (new,) = step.scheduled_new_reqs
                hit = int(new.num_computed_tokens)
            tokens = []
            if req.num_computed_tokens >= req.num_tokens:  # prefill done: a token is sampled
                tokens = [output_ids[sampled]]
                sampled += 1
            output = ModelRunnerOutput(
                req_ids=[name], req_id_to_index={name: 0}, sampled_token_ids=[tokens]
            )
            scheduler.update_from_output(step, output)
        self.check_pool()
        assert hit is not None
        return hit

    def check_pool(self) -> None:
        """No request runs: every usable block is free (cached ones are free and evictable)."""
        pool = self.scheduler.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
        assert all(b.ref_cnt == 0 for b in pool.blocks if not b.is_null)

    def run(self, requests) -> list[int]:
        """Hit tokens of every ``(input_ids, output_ids)`` in order."""
        return replay_each(self.request, requests)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("python -m crosscheck.vllm_hybrid", __doc__)
    parser.add_argument(
        "--ssm-dtype", default="bfloat16", help="vLLM's mamba_ssm_cache_dtype (simlab's BF16)"
    )
    parser.add_argument(
        "--prefix-match-unit",
        type=int,
        default=None,
        help="vLLM's --prefix-match-unit (default: the block); cases named vllm_hybrid_pmuP",
    )
    add_retention(parser)
    args = parser.parse_args(argv)
    unit = args.prefix_match_unit
    setup_logging(args.verbose)
    logging.getLogger("vllm").setLevel(logging.WARNING)
    export = Export.load(args.export)
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(NEMOTRON_H_8B))
        for size_gb in args.size_gb:
            config = build_config(
                model_dir,
                args.ssm_dtype,
                export.max_sequence + 2048,
                match_unit=unit,
                retention=args.retention_interval,
            )
            total = export.total_tokens + export.max_sequence
            scheduler, hash_block, per_block, specs = build_scheduler(
                config, size_gb, blocks_for_inf=total // 16 + 16 * len(export) + 1024
            )
            check_model(export, specs, config.cache_config.block_size)
            block = config.cache_config.block_size
            case = {
                "case": f"{args.name}-vllm_hybrid{f'_pmu{unit}' if unit else ''}"
                f"{retention_label(args.retention_interval)}-{size_label(size_gb)}",
                "engine": "vllm",
                "engine_version": versions()["vllm"],
                "cache": "Scheduler (HybridKVCacheCoordinator, mamba_cache_mode=align)",
                "block_size": block,
                "ssm_dtype": args.ssm_dtype,
                **({"prefix_match_unit": hash_block} if unit else {}),
                **retention_item(args.retention_interval),
                "size_gb": manifest_size(size_gb),
                "num_blocks": scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1,
                "block_bytes": per_block,
            }

            def run(scheduler=scheduler, hash_block=hash_block, config=config) -> list[int]:
                return SchedulerReplay(scheduler, hash_block, config).run(export.requests())

            run_case(case, export, run, args.fixtures)
    return 0


def add_retention(parser) -> None:
    parser.add_argument(
        "--retention-interval",
        type=lambda v: None if v == "none" else int(v),
        default=0,
        help="a hybrid: vLLM's --prefix-cache-retention-interval (0, its default; none: dense); "
        "cases named _rN or _rdense",
    )


def retention_label(retention: int | None) -> str:
    """The case name's part for a retention interval (none for vLLM's default, 0)."""
    if retention == 0:
        return ""
    return "_rdense" if retention is None else f"_r{retention}"


def retention_item(retention: int | None) -> dict:
    """The manifest's ``prefix_cache_retention_interval`` (absent at vLLM's default, 0)."""
    return {} if retention == 0 else {"prefix_cache_retention_interval": retention}


def check_model(export: Export, specs: dict, block: int) -> None:
    """The export's model is the one driven: its KV bytes per token are the attention layers'
    pages per token."""
    from vllm.v1.kv_cache_interface import AttentionSpec

    kv = sum(s.page_size_bytes for s in specs.values() if isinstance(s, AttentionSpec)) // block
    if kv != export.kv_bytes_per_token:
        raise SystemExit(
            f"{export.path}: kv_bytes_per_token {export.kv_bytes_per_token} is not the driven"
            f" model's {kv}"
        )


def model_of(export: Export) -> tuple[str, dict]:
    """The driven model's name and config.json for ``export`` (by its KV bytes per token):
    Nemotron-H-8B or Llama-3-8B; a one-line exit for any other."""
    found = MODELS.get(export.kv_bytes_per_token)
    if found is None:
        known = ", ".join(f"model={key}" for _, key, _ in MODELS.values())
        raise SystemExit(f"{export.path}: export with {known} (no other model is driven)")
    name, _, config = found
    return name, config


if __name__ == "__main__":
    sys.exit(main())
