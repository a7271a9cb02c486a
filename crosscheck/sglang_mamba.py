"""SGLang's hybrid (attention + Mamba) prefix cache, driven over a ``crosscheck.export`` file.

    .venv-crosscheck/bin/python -m crosscheck.sglang_mamba --export .crosscheck/sharegpt_nemotron_h_8b.npz \
        --name sharegpt_nemotron_h_8b --size-gb inf

``UnifiedRadixCache`` with the FULL and MAMBA components and Mamba strategy ``no_buffer``
(``enable_mamba_extra_buffer=False``) or, with ``--strategy extra_buffer``, ``extra_buffer``
(:class:`ExtraBufferReplay`), built with SGLang's shipped unit-test builder
(``sglang.test.kits.unified_radix_cache.fixtures.build_fixture``): ``HybridReqToTokenPool``,
``HybridLinearKVPool``, ``TokenToKVPoolAllocator`` and the Python ``UnifiedTreeCore``, with
tiny Mamba2 state shapes (the state's size does not change which states exist) and its
``get_device()`` pointed at the CPU.

Capacities:

* ``--size-gb inf``: both pools larger than the whole trace (a KV slot per trace token, two
  Mamba slots per request, three with ``extra_buffer``).
* ``--size-gb GB --mamba-ratio R``: SGLang's split of one budget (``--mamba-full-memory-ratio``,
  0.9 by default): ``ssm_gb = GB·R/(1+R)`` for Mamba states,
  ``mamba_slots = floor(ssm_gb·1e9 / ssm_state_bytes)`` and
  ``capacity_tokens = floor((GB - ssm_gb)·1e9 / kv_bytes_per_token)``, with the model's
  ``ssm_state_bytes`` and ``kv_bytes_per_token`` from the export (simlab's ``cache.ssm_gb``).

The request lifecycle is :class:`crosscheck.sglang_common.SglangReplay`; matching goes through
``Req.init_next_round_input`` (copy-on-write of the matched state), so a hit is the deepest
matched node holding a Mamba state within ``len(input) - 1``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import sys
from types import SimpleNamespace
from unittest import mock

import torch

from crosscheck import stubs

stubs.install()

from sglang.srt.managers.schedule_batch import (  # noqa: E402
    Req,
    ScheduleBatch,
    set_mamba_track_indices_from_reqs,
)
from sglang.srt.managers.scheduler_components.batch_result_processor import (  # noqa: E402
    SchedulerBatchResultProcessor,
)
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.runtime_context import mamba_track_grid  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang.test.kits.unified_radix_cache import fixtures  # noqa: E402
from sglang.test.kits.unified_radix_cache.config import CacheConfig  # noqa: E402

from crosscheck.common import (  # noqa: E402
    GB,
    Export,
    base_parser,
    capacity_tokens,
    manifest_size,
    run_case,
    setup_logging,
    size_label,
    versions,
)
from crosscheck.sglang_common import SglangReplay  # noqa: E402

log = logging.getLogger(__name__)

CACHE = "UnifiedRadixCache[FULL,MAMBA]"
#: Nemotron-H-8B's ``mamba_chunk_size`` (its config's ``chunk_size``), which SGLang's
#: ``mamba_cache_chunk_size`` takes as the extra buffer's checkpoint grid at page size 1
MAMBA_CHUNK = 256


def build_cache(
    kv_capacity: int,
    mamba_slots: int,
    max_context_len: int,
    strategy: str = "no_buffer",
    rows: int = 1,
    overlap: bool = True,
):
    """A fresh FULL+MAMBA ``UnifiedRadixCache`` from SGLang's test builder, with Mamba strategy
    ``strategy`` (``extra_buffer``: the server's ``--mamba-radix-cache-strategy``, so that
    ``get_exec().mamba`` says so too, and the model's Mamba chunk of ``MAMBA_CHUNK`` tokens) and
    ``rows`` request rows (``max_running_requests``). ``overlap``: whether the server runs the
    overlap scheduler, which sizes ``extra_buffer``'s ping-pong track buffer as the server's
    pool configurator does (``HybridReqToTokenPool(enable_overlap_schedule=...)``,
    ``get_mamba_tracking_slots``: 2 slots per request with it, 1 without); the test builder
    leaves it at its default, on."""
    extra = strategy == "extra_buffer"
    cfg = CacheConfig(
        page_size=1,
        components=(ComponentType.FULL, ComponentType.MAMBA),
        num_layers=2,
        full_attention_layer_ids=(1,),
        enable_mamba_extra_buffer=extra,
        mamba_cache_size=mamba_slots,
        kv_size=kv_capacity,
        max_num_reqs=rows,
        max_context_len=max_context_len,
        head_num=1,
        head_dim=1,
    )
    server_args = functools.partial(fixtures.ServerArgs, mamba_radix_cache_strategy=strategy)
    pool = functools.partial(fixtures.HybridReqToTokenPool, enable_overlap_schedule=overlap)
    with (
        mock.patch.object(fixtures, "get_device", return_value="cpu"),
        mock.patch.object(fixtures, "ServerArgs", server_args),
        mock.patch.object(fixtures, "HybridReqToTokenPool", pool),
    ):
        cache, _allocator, _req_to_token_pool = fixtures.build_fixture(
            cfg,
            tree_core_backend="python",
            mamba_cache_chunk_size=MAMBA_CHUNK if extra else None,
        )
    return cache


class ExtraBufferReplay(SglangReplay):
    """``extra_buffer``: the states a request donates are the ones SGLang's scheduler tracks
    into the request's two ping-pong slots, so the replay adds the scheduler's two per-request
    steps, each by calling SGLang's own method:

    * prefill: ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend`` (the tracked
      position of the extend: its last whole checkpoint-grid step, or the match's branching
      point) on a stand-in batch holding the model's chunk size, the cache and the pool;
    * each decode step: ``SchedulerBatchResultProcessor._handle_finish_state_updated_req`` on a
      stand-in processor and a one-request decode batch whose track mask is
      ``seq_len % mamba_track_grid == 0``, as ``prepare_for_decode`` sets it, with no overlap
      lookahead and no speculation. It records a tracked state and swaps the ping-pong slot, and
      on the last token releases the request (``release_kv_cache``, checkpoint on).
    """

    def __init__(self, tree_cache, kv_capacity: int, mamba_capacity: int) -> None:
        super().__init__(tree_cache, kv_capacity, mamba_capacity)
        self._extend_batch = SimpleNamespace(
            model_config=SimpleNamespace(
                hf_text_config=SimpleNamespace(mamba_chunk_size=MAMBA_CHUNK)
            ),
            tree_cache=tree_cache,
            req_to_token_pool=self.req_to_token_pool,
        )
        unused = dict.fromkeys(
            field.name for field in dataclasses.fields(SchedulerBatchResultProcessor)
        )
        self._processor = SchedulerBatchResultProcessor(
            **{
                **unused,
                "is_generation": True,
                "enable_overlap": False,
                "enable_overlap_mlx": False,
                "tree_cache": tree_cache,
                "req_to_token_pool": self.req_to_token_pool,
                "token_to_kv_pool_allocator": self.allocator,
            }
        )
        self._grid = mamba_track_grid(tree_cache.page_size)

    def prefill_prepared(self, req: Req) -> None:
        ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend(self._extend_batch, req)

    def decode_result(self, req: Req) -> None:
        seq_len = req.kv.kv_committed_len
        batch = SimpleNamespace(
            reqs=[req],
            req_to_token_pool=self.req_to_token_pool,
            req_pool_indices=torch.tensor([req.kv.req_pool_idx], dtype=torch.int64),
            spec_algorithm=SpeculativeAlgorithm.NONE,
            mamba_track_mask_cpu=[seq_len % self._grid == 0],
            mamba_track_mask_next_cpu=None,
            mamba_decode_batch_idx_cpu=[req.decode_batch_idx],
        )
        set_mamba_track_indices_from_reqs(batch)
        self._processor._handle_finish_state_updated_req(
            req, batch, GenerationBatchResult(), 0, None
        )


def capacities(
    size_gb: float, ratio: float, export: Export, strategy: str = "no_buffer"
) -> tuple[int, int, float | None]:
    """``(KV tokens, Mamba slots, ssm_gb)`` for a budget of ``size_gb`` (see the module doc)."""
    if math.isinf(size_gb):
        per_request = 2 if strategy == "no_buffer" else 3
        return (
            capacity_tokens(size_gb, export.kv_bytes_per_token, export),
            per_request * (len(export) + 1),
            None,
        )
    ssm_gb = size_gb * ratio / (1 + ratio)
    slots = math.floor(ssm_gb * GB / export.ssm_state_bytes)
    return capacity_tokens(size_gb - ssm_gb, export.kv_bytes_per_token, export), slots, ssm_gb


#: ``--strategy`` -> the replay that drives it
STRATEGIES = {"no_buffer": SglangReplay, "extra_buffer": ExtraBufferReplay}


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("python -m crosscheck.sglang_mamba", __doc__)
    parser.add_argument(
        "--mamba-ratio",
        type=float,
        default=0.9,
        help="finite sizes: Mamba bytes / KV bytes (SGLang's --mamba-full-memory-ratio)",
    )
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="no_buffer",
        help="SGLang's --mamba-radix-cache-strategy",
    )
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    export = Export.load(args.export)
    replay = STRATEGIES[args.strategy]
    if export.ssm_state_bytes <= 0:
        parser.error(f"{args.export}: model {export.model} has no SSM layers")
    for size_gb in args.size_gb:
        kv_capacity, slots, ssm_gb = capacities(size_gb, args.mamba_ratio, export, args.strategy)
        case = {
            "case": f"{args.name}-sglang_mamba_{args.strategy}-{size_label(size_gb)}",
            "engine": "sglang",
            "engine_version": versions()["sglang"],
            "cache": f"{CACHE} {args.strategy}",
            "block_size": 1,
            "size_gb": manifest_size(size_gb),
            "capacity_tokens": kv_capacity,
            "mamba_slots": slots,
        }
        if ssm_gb is not None:
            case["ssm_gb"] = ssm_gb
        if args.strategy != "no_buffer":
            case["mamba_strategy"] = args.strategy

        def run(kv_capacity: int = kv_capacity, slots: int = slots) -> list[int]:
            cache = build_cache(kv_capacity, slots, export.max_sequence + 1, args.strategy)
            return replay(cache, kv_capacity, slots).run(export.requests())

        run_case(case, export, run, args.fixtures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
