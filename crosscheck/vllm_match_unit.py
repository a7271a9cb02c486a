"""What vLLM 0.33.0's ``--prefix-match-unit`` does to a hybrid's hits, from its own cache code.

    .venv-crosscheck/bin/python -m crosscheck.vllm_match_unit

This harness shows what the setting does, in a table ``tests/test_match_unit.py`` holds simlab's
pool (``policy.prefix_match_unit``) to: the real ``KVCacheManager`` (an
attention group and a Mamba group in ``align`` mode, one 1,040-token block, retention 0) and
the real ``Scheduler._mamba_block_aligned_split`` (called with a stand-in scheduler holding its
settings) serve request A, a 3,000-token prompt and 10 output tokens. Then each request B,
sharing A's first ``s`` tokens, asks ``get_computed_blocks`` for its hit. The Mamba layers either
write the prompt's checkpoint inside a prefill chunk (``num_prefill_checkpoint_blocks=1``, as
``MambaMixer2`` declares, at any token), write it there at offsets on ``lcm(P, 64)`` (GDN with
FlashInfer's prefill, whose blocks are multiples of 64: these rows take 1,088-token blocks), or
need the chunk split there (0). It prints one Markdown row per setting
(docs/guides/engine-geometry.md).
"""

from __future__ import annotations

import math
import sys
import types

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.request import Request

BLOCK = 1040  # Nemotron-H-8B's forced block at vLLM's FP32 state
PROMPT, OUTPUTS, BUDGET = 3000, 10, 8192
SHARED = (2999, 2500, 2100)  # tokens B shares with A's prompt


GDN_BLOCK = 1088  # a multiple of FlashInfer's 64-token GDN checkpoint alignment
#: how the Mamba layers write the prompt's checkpoint: their alignment inside the chunk (None:
#: the chunk is split there instead), by P
KINDS = {
    "inside the chunk (MambaMixer2)": lambda unit: 1,
    "inside the chunk on lcm(P, 64) (GDN, FlashInfer)": lambda unit: math.lcm(unit, 64),
    "chunk split there": lambda unit: None,
}


def manager(unit: int | None, alignment: int | None, block: int) -> KVCacheManager:
    attention = FullAttentionSpec(
        block_size=block, num_kv_heads=1, head_size=8, dtype=torch.float16
    )
    mamba = MambaSpec(
        block_size=block,
        shapes=((8,),),
        dtypes=(torch.float16,),
        page_size_padded=attention.page_size_bytes,
        mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=int(alignment is not None),
        prefill_checkpoint_alignment=alignment,
    )
    config = KVCacheConfig(
        num_blocks=200,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["attn"], attention), KVCacheGroupSpec(["ssm"], mamba)],
        prefix_cache_retention_interval=0,
    )
    return KVCacheManager(
        config,
        max_model_len=16384,
        scheduler_block_size=block,
        hash_block_size=unit or block,
        enable_caching=True,
    )


def hits(unit: int | None, alignment: int | None, block: int = BLOCK) -> list[int]:
    """B's hit for each of :data:`SHARED` after A ran alone."""
    init_none_hash(sha256)
    cache = manager(unit, alignment, block)
    hashed = unit or block
    scheduler = types.SimpleNamespace(  # the fields _mamba_block_aligned_split reads
        hash_block_size=hashed,
        block_size=block,
        mamba_partial_cache_hit=hashed < block and cache.coordinator.enable_partial_hash_hits,
        use_eagle_block_drop=False,
        num_hash_lookahead_tokens=0,
        mamba_has_prefill_checkpoint_blocks=alignment is not None,
        mamba_prefill_checkpoint_alignment=alignment,
        max_num_scheduled_tokens=BUDGET,
        scheduler_config=types.SimpleNamespace(long_prefill_token_threshold=0),
        cache_config=types.SimpleNamespace(block_size=block),
        mamba_shared_prefix_checkpoint=False,
    )
    hasher = get_request_block_hasher(hashed, sha256)

    def request(rid: str, tokens: list[int], outputs: int) -> Request:
        return Request(rid, tokens, SamplingParams(max_tokens=outputs), None, block_hasher=hasher)

    a = request("A", list(range(PROMPT)), OUTPUTS)
    while True:  # A's steps, as the scheduler schedules them
        cache.new_step_starts()
        blocks, hit = None, 0
        if a.num_computed_tokens == 0:
            blocks, hit, a.shared_prefix_boundary = cache.get_computed_blocks(a)
        step = min(BUDGET, a.num_tokens - a.num_computed_tokens - hit)
        if a.num_computed_tokens + hit < a.num_prompt_tokens:
            step = Scheduler._mamba_block_aligned_split(scheduler, a, step, hit)  # type: ignore[arg-type]
        assert cache.allocate_slots(
            a, step, num_new_computed_tokens=hit, new_computed_blocks=blocks
        )
        a.num_computed_tokens += hit + step
        if a.num_computed_tokens >= a.num_tokens:
            if len(a.output_token_ids) >= OUTPUTS:
                break
            a.append_output_token_ids(99999)
    cache.free(a)
    out = []
    for shared in SHARED:
        tokens = list(range(shared)) + [10**6 + i for i in range(PROMPT + 200 - shared)]
        out.append(cache.get_computed_blocks(request(f"B{shared}", tokens, 1))[1])
    return out


def main() -> None:
    lines = [
        "| prefix_match_unit | Mamba checkpoint | block | "
        + " | ".join(f"B shares {s}" for s in SHARED)
        + " |",
        "|---|---|---|" + "---|" * len(SHARED),
    ]
    for unit, kinds, block in (
        (None, (0, 2), BLOCK),
        (16, (0, 2), BLOCK),
        (80, (0, 2), BLOCK),
        (16, (1,), GDN_BLOCK),
        (64, (1,), GDN_BLOCK),
    ):
        for k in kinds:
            where, alignment = list(KINDS.items())[k]
            row = " | ".join(map(str, hits(unit, alignment(unit or block), block)))
            lines.append(f"| {unit or 'null (the block)'} | {where} | {block} | {row} |")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
