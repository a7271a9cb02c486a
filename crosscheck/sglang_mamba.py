"""SGLang's hybrid (attention + Mamba) prefix cache, driven over a ``crosscheck.export`` file.

    .venv-crosscheck/bin/python -m crosscheck.sglang_mamba --export .crosscheck/sharegpt_nemotron_h_8b.npz \
        --name sharegpt_nemotron_h_8b --size-gb inf

``UnifiedRadixCache`` with the FULL and MAMBA components and Mamba strategy ``no_buffer``
(``enable_mamba_extra_buffer=False``), built with SGLang's shipped unit-test builder
(``sglang.test.kits.unified_radix_cache.fixtures.build_fixture``): ``HybridReqToTokenPool``,
``HybridLinearKVPool``, ``TokenToKVPoolAllocator`` and the Python ``UnifiedTreeCore``, with
tiny Mamba2 state shapes (the state's size does not change which states exist) and its
``get_device()`` pointed at the CPU.

Capacities:

* ``--size-gb inf``: both pools larger than the whole trace (a KV slot per trace token, two
  Mamba slots per request).
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

import logging
import math
import sys
from unittest import mock

from crosscheck import stubs

stubs.install()

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
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

CACHE = "UnifiedRadixCache[FULL,MAMBA] no_buffer"


def build_cache(kv_capacity: int, mamba_slots: int, max_context_len: int):
    """A fresh FULL+MAMBA ``UnifiedRadixCache`` (no_buffer) from SGLang's test builder."""
    cfg = CacheConfig(
        page_size=1,
        components=(ComponentType.FULL, ComponentType.MAMBA),
        num_layers=2,
        full_attention_layer_ids=(1,),
        enable_mamba_extra_buffer=False,
        mamba_cache_size=mamba_slots,
        kv_size=kv_capacity,
        max_num_reqs=1,
        max_context_len=max_context_len,
        head_num=1,
        head_dim=1,
    )
    with mock.patch.object(fixtures, "get_device", return_value="cpu"):
        cache, _allocator, _req_to_token_pool = fixtures.build_fixture(
            cfg, tree_core_backend="python"
        )
    return cache


def capacities(size_gb: float, ratio: float, export: Export) -> tuple[int, int, float | None]:
    """``(KV tokens, Mamba slots, ssm_gb)`` for a budget of ``size_gb`` (see the module doc)."""
    if math.isinf(size_gb):
        return (
            capacity_tokens(size_gb, export.kv_bytes_per_token, export),
            2 * len(export) + 2,
            None,
        )
    ssm_gb = size_gb * ratio / (1 + ratio)
    slots = math.floor(ssm_gb * GB / export.ssm_state_bytes)
    return capacity_tokens(size_gb - ssm_gb, export.kv_bytes_per_token, export), slots, ssm_gb


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("python -m crosscheck.sglang_mamba", __doc__)
    parser.add_argument(
        "--mamba-ratio",
        type=float,
        default=0.9,
        help="finite sizes: Mamba bytes / KV bytes (SGLang's --mamba-full-memory-ratio)",
    )
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    export = Export.load(args.export)
    if export.ssm_state_bytes <= 0:
        parser.error(f"{args.export}: model {export.model} has no SSM layers")
    for size_gb in args.size_gb:
        kv_capacity, slots, ssm_gb = capacities(size_gb, args.mamba_ratio, export)
        case = {
            "case": f"{args.name}-sglang_mamba_no_buffer-{size_label(size_gb)}",
            "engine": "sglang",
            "engine_version": versions()["sglang"],
            "cache": CACHE,
            "block_size": 1,
            "size_gb": manifest_size(size_gb),
            "capacity_tokens": kv_capacity,
            "mamba_slots": slots,
        }
        if ssm_gb is not None:
            case["ssm_gb"] = ssm_gb

        def run(kv_capacity: int = kv_capacity, slots: int = slots) -> list[int]:
            cache = build_cache(kv_capacity, slots, export.max_sequence + 1)
            return SglangReplay(cache, kv_capacity, slots).run(export.requests())

        run_case(case, export, run, args.fixtures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
