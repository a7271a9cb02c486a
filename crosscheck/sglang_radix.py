"""SGLang's attention-only prefix caches, driven over a ``crosscheck.export`` file.

    .venv-crosscheck/bin/python -m crosscheck.sglang_radix --export .crosscheck/sharegpt_llama3_8b.npz \
        --name sharegpt_llama3_8b --cache radix unified --size-gb inf 2 5 [--page-size 16]

* ``radix``: ``RadixCache`` (``radix_cache.py``).
* ``unified``: ``UnifiedRadixCache`` with the FULL component, what 0.5.23's default factory
  (``registry.create_unified_radix_cache``) builds, on the Python ``UnifiedTreeCore``. With
  ``--rust-check`` the same case is also run on the Rust ``RustUnifiedTreeCore`` (when it loads)
  and the hits must agree request for request.

Pools: SGLang's ``TokenToKVPoolAllocator`` (``--page-size`` 1, the default) or
``PagedTokenToKVPoolAllocator`` (page > 1) over a one-layer ``MHATokenToKVPool`` and a
``ReqToTokenPool`` on the CPU; the KV capacity is ``floor(size_gb·1e9 / kv_bytes_per_token)``
tokens, rounded down to whole pages as SGLang sizes its pool
(``ModelRunner``: ``max_total_num_tokens // page_size * page_size``). The request lifecycle is
:class:`crosscheck.sglang_common.SglangReplay`.
"""

from __future__ import annotations

import logging
import sys

import torch

from crosscheck import stubs

stubs.install()

from sglang.srt.mem_cache.allocator import (  # noqa: E402
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

from crosscheck.common import (  # noqa: E402
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

CACHES = {"radix": "RadixCache", "unified": "UnifiedRadixCache[FULL]"}


def cache_params(
    capacity: int, max_context_len: int, rows: int = 1, page_size: int = 1
) -> CacheInitParams:
    """SGLang's pools on the CPU for a radix cache: ``capacity`` KV slots (a one-layer,
    one-head ``MHATokenToKVPool`` under a ``TokenToKVPoolAllocator``, or its paged allocator
    when ``page_size`` > 1) and ``rows`` request rows (``ReqToTokenPool``); LRU eviction."""
    req_to_token_pool = ReqToTokenPool(
        size=rows, max_context_len=max_context_len, device="cpu", enable_memory_saver=False
    )
    kv_pool = MHATokenToKVPool(
        size=capacity,
        page_size=page_size,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    if page_size == 1:
        allocator = TokenToKVPoolAllocator(
            size=capacity, dtype=torch.bfloat16, device="cpu", kvcache=kv_pool, need_sort=False
        )
    else:
        allocator = PagedTokenToKVPoolAllocator(
            size=capacity,
            page_size=page_size,
            dtype=torch.bfloat16,
            device="cpu",
            kvcache=kv_pool,
            need_sort=False,
        )
    return CacheInitParams(
        disable=False,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        eviction_policy="lru",
    )


def build_cache(
    kind: str, capacity: int, max_context_len: int, core: str = "python", page_size: int = 1
):
    """A fresh ``RadixCache`` or ``UnifiedRadixCache[FULL]`` over CPU pools of ``capacity``
    KV slots in pages of ``page_size`` (one request row)."""
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page_size))
    params = cache_params(capacity, max_context_len, page_size=page_size)
    if kind == "radix":
        return RadixCache(params)
    params.tree_components = (ComponentType.FULL,)
    params.tree_core_backend = core
    cache = UnifiedRadixCache(params=params)
    if cache._tree_core_backend != core:
        raise RuntimeError(f"asked for the {core} TreeCore, got {cache._tree_core_backend}")
    return cache


def replay(
    kind: str, export: Export, capacity: int, core: str = "python", page_size: int = 1
) -> list[int]:
    """Hit tokens of every request of ``export`` through a fresh cache."""
    cache = build_cache(kind, capacity, export.max_sequence + page_size, core, page_size)
    return SglangReplay(cache, capacity).run(export.requests())


def paged_capacity(tokens: int, page_size: int) -> int:
    """The KV pool SGLang sizes from ``tokens``: whole pages only."""
    return tokens // page_size * page_size


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("python -m crosscheck.sglang_radix", __doc__)
    parser.add_argument("--cache", nargs="+", choices=sorted(CACHES), default=["radix"])
    parser.add_argument(
        "--rust-check", action="store_true", help="unified: also run the Rust TreeCore and compare"
    )
    parser.add_argument("--page-size", type=int, default=1, help="SGLang's --page-size")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    export = Export.load(args.export)
    kv_bytes = export.kv_bytes_per_token
    page = args.page_size
    for kind in args.cache:
        for size_gb in args.size_gb:
            capacity = paged_capacity(capacity_tokens(size_gb, kv_bytes, export), page)
            paged = f"_p{page}" if page > 1 else ""
            case = {
                "case": f"{args.name}-sglang_{kind}{paged}-{size_label(size_gb)}",
                "engine": "sglang",
                "engine_version": versions()["sglang"],
                "cache": CACHES[kind],
                "block_size": page,
                "size_gb": manifest_size(size_gb),
                "capacity_tokens": capacity,
            }

            def run(kind: str = kind, capacity: int = capacity) -> list[int]:
                return replay(kind, export, capacity, page_size=page)

            hits = run_case(case, export, run, args.fixtures)
            if kind == "unified" and args.rust_check:
                rust = replay(kind, export, capacity, core="rust", page_size=page)
                same = sum(a == b for a, b in zip(hits, rust, strict=True))
                print(f"  rust TreeCore: {same}/{len(hits)} requests agree with Python")  # noqa: T201
                if same != len(hits):
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
