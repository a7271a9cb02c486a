"""vLLM v1's block-hashed prefix cache (``KVCacheManager``), driven over a ``crosscheck.export``.

    .venv-crosscheck/bin/python -m crosscheck.vllm_blocks --export .crosscheck/sharegpt_llama3_8b.npz \
        --name sharegpt_llama3_8b --block-size 16 32 --size-gb inf 2 5

vLLM 0.33.0's ``KVCacheManager`` with a ``KVCacheConfig`` of one ``FullAttentionSpec(block_size=B)``
group, and real ``vllm.v1.request.Request`` objects whose block hashes come from
``get_request_block_hasher(B, sha256)`` (after ``init_none_hash(sha256)``; the hash function does
not change hits). Capacity: ``floor(size_gb·1e9 / kv_bytes_per_token) // B`` usable blocks plus
vLLM's null block; no watermark, no lookahead or speculative tokens, caching on.

Per request, as the scheduler calls it one request at a time:

1. ``get_computed_blocks(req)``: the longest cached run of full blocks within
   ``num_tokens - 1``; its tokens are the hit.
2. ``allocate_slots(req, len(input) - hit, hit, blocks)``, then
   ``num_computed_tokens = len(input)`` and the request is RUNNING.
3. The first output token is appended (``append_output_token_ids``); each decode step is one
   ``allocate_slots(req, 1)`` (which caches the blocks it fills), ``num_computed_tokens += 1``,
   then the next token is appended. There are ``len(output) - 1`` steps: the last sampled token
   is never fed.
4. ``free(req)``: blocks go back tail first, cached ones stay evictable.

After every request the block pool is checked: free blocks (which include the cached, evictable
ones) equal the usable blocks, and no block is referenced.
"""

from __future__ import annotations

import sys

import torch

from crosscheck import stubs

stubs.install()

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from crosscheck.common import (  # noqa: E402
    Export,
    base_parser,
    capacity_tokens,
    manifest_size,
    replay_each,
    run_case,
    setup_logging,
    size_label,
    versions,
)


def build_manager(block_size: int, usable_blocks: int, max_model_len: int) -> KVCacheManager:
    """A ``KVCacheManager`` over one full-attention group of ``usable_blocks`` + the null block."""
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float16
    )
    config = KVCacheConfig(
        num_blocks=usable_blocks + 1,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )
    return KVCacheManager(
        config,
        max_model_len=max_model_len,
        scheduler_block_size=block_size,
        hash_block_size=block_size,
        enable_caching=True,
    )


class VllmReplay:
    """One request at a time through ``manager``, in the scheduler's call order."""

    def __init__(self, manager: KVCacheManager, block_size: int, usable_blocks: int) -> None:
        self.manager = manager
        self.usable_blocks = usable_blocks
        self.hasher = get_request_block_hasher(block_size, sha256)
        self._next_id = 0

    def request(self, input_ids: list[int], output_ids: list[int]) -> int:
        """Run one request to completion; returns its hit tokens."""
        if not output_ids:
            raise ValueError("vLLM always samples at least one output token")
        manager = self.manager
        req = Request(
            request_id=str(self._next_id),
            prompt_token_ids=list(input_ids),
            sampling_params=SamplingParams(max_tokens=len(output_ids)),
            pooling_params=None,
            block_hasher=self.hasher,
        )
        self._next_id += 1
        blocks, hit, _boundary = manager.get_computed_blocks(req)
        if manager.allocate_slots(req, len(input_ids) - hit, hit, blocks) is None:
            raise RuntimeError(f"request {req.request_id}: prompt does not fit the pool")
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = len(input_ids)
        req.append_output_token_ids(output_ids[0])
        for token in output_ids[1:]:
            if manager.allocate_slots(req, 1) is None:
                raise RuntimeError(f"request {req.request_id}: decode does not fit the pool")
            req.num_computed_tokens += 1
            req.append_output_token_ids(token)
        manager.free(req)
        self.check_pool()
        return int(hit)

    def check_pool(self) -> None:
        """No request runs: every usable block is free (cached ones are free and evictable)."""
        pool = self.manager.block_pool
        free = pool.get_num_free_blocks()
        assert free == self.usable_blocks, (free, self.usable_blocks)
        assert all(b.ref_cnt == 0 for b in pool.blocks if not b.is_null)

    def run(self, requests) -> list[int]:
        """Hit tokens of every ``(input_ids, output_ids)`` in order."""
        return replay_each(self.request, requests)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("python -m crosscheck.vllm_blocks", __doc__)
    parser.add_argument("--block-size", type=int, nargs="+", default=[16])
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    init_none_hash(sha256)
    export = Export.load(args.export)
    for block in args.block_size:
        for size_gb in args.size_gb:
            capacity = capacity_tokens(size_gb, export.kv_bytes_per_token, export)
            usable = capacity // block
            case = {
                "case": f"{args.name}-vllm_b{block}-{size_label(size_gb)}",
                "engine": "vllm",
                "engine_version": versions()["vllm"],
                "cache": "KVCacheManager",
                "block_size": block,
                "size_gb": manifest_size(size_gb),
                "capacity_tokens": capacity,
                "num_blocks": usable,
            }

            def run(block: int = block, usable: int = usable) -> list[int]:
                manager = build_manager(block, usable, export.max_sequence + block)
                return VllmReplay(manager, block, usable).run(export.requests())

            run_case(case, export, run, args.fixtures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
