"""vLLM 0.33.0's hybrid KV-cache pool, block by block: the replay engine's ``policy=vllm`` on a
hybrid model (``mamba_cache_mode: align``).

The prefix tree (:class:`simlab.cache.prefix.PrefixCache`) evicts a state with its block's KV, whole.
vLLM does not: every KV-cache group's blocks come from one ``BlockPool`` and go back, one block
at a time, to one LRU free queue. Replayed block for block against the real ``Scheduler``
(``crosscheck/vllm_hybrid.py``), these rules give the engine's hit on every request of the
ShareGPT case at 1, 2 and 5 GB (``tests/fixtures/crosscheck``); the tree misses 1.1-1.4% of them.

Pool (``kv_cache_planning._get_kv_cache_groups_uniform_page_size``): layers of each kind fall
into groups of ``g`` layers (``g``: the fewer kind's count, or the larger's when it is under
1.5 times that), Mamba groups first (Nemotron-H: 6 Mamba groups of 4 layers, 1 attention
group). A pool block is one page of each of a group's ``g`` layers, the page holding ``B``
tokens of one attention layer's KV (``B``: :func:`simlab.cache.engine_rules.vllm_hybrid_block_size`),
a Mamba layer's state padded to it. So a block of KV is one pool block and a state is one block
in each Mamba group. Usable blocks: ``floor(capacity / block bytes)``.

Per request, in the engine's order (one request at a time, so no other request runs):

* **Hit** (``find_longest_cache_hit``): the cached attention chain within ``L - 1`` tokens, then
  the deepest block position on it whose state every Mamba group holds. The hit blocks leave the
  free queue (``touch``).
* **Prefill**: to the junction first when the attention hit is deeper than the state hit
  (vLLM #37898; its state is the running block there), then to the prompt end, writing the
  state at ``floor((L - 1) / B)`` blocks into a checkpoint block taken with the running block.
  Each step takes its blocks from the queue head, Mamba groups first; a cached block taken
  there is evicted. Full attention blocks are cached as they are computed (a recomputed one
  duplicates the cached block); states only at the prompt checkpoint and the junction
  (``prefix_cache_retention_interval`` 0).
* **Retirement** (``remove_skipped_blocks``, at each step): a Mamba group frees every block
  before the one holding the running state, deepest first; the hit and checkpoint states go
  back to the queue's tail during the request, before its KV.
* **Decode**: crossing a block boundary takes a new running block per Mamba group (the old one
  is freed a step later) and a KV block; a full KV block is cached. The last sampled token is
  never computed.
* **Finish**: each Mamba group frees its running block, then the attention group its blocks,
  tail first. Uncached blocks go to the queue's head (reused first), cached ones to its tail.

With a ``prefix_match_unit`` below the block (``policy.prefix_match_unit``), keys come every unit
and a prompt also caches its partial tail, a hit may end there inside a block, and that block is
copied in the request's first step (:class:`simlab.engines.block_pool.run.PoolRun`); checked
request for request against the real scheduler, alone and under load (``*_pmu*`` fixtures).

A state dies with its first group block taken; its other blocks hold memory until the queue
reaches them. A request that does not fit in the whole pool is an error (vLLM would never
schedule it).

A Transformer is the same pool without Mamba groups: one group of every layer, blocks of
``policy.block_size`` tokens, a prefill cut by the token budget alone (no block-aligned split),
the hit its whole cached chain within ``L - 1``. The timed engine runs it there with
``engine.kv_pool=shared`` (:mod:`simlab.engines.timed.vllm`: vLLM's scheduler over its own pool,
checked against the real ``Scheduler`` under load, ``tests/fixtures/crosscheck_load``); the
replay keeps the prefix tree, whose per-request hits are vLLM's already.
"""

from simlab.engines.block_pool.keys import (
    REPLY_TOKEN,
    committed_tokens,
    request_keys,
    token_keys,
)
from simlab.engines.block_pool.pool import HybridPool
from simlab.engines.block_pool.queue import FreeQueue, PoolFull, PoolShape
from simlab.engines.block_pool.replay import (
    SCHEDULER_TOKENS,
    Peaks,
    pool_record,
    pool_records,
    pool_run,
    pool_shape,
    step_pool,
    too_small,
)
from simlab.engines.block_pool.run import PoolRun, internal_checkpoint

__all__ = [
    "REPLY_TOKEN",
    "SCHEDULER_TOKENS",
    "FreeQueue",
    "HybridPool",
    "Peaks",
    "PoolFull",
    "PoolRun",
    "PoolShape",
    "committed_tokens",
    "internal_checkpoint",
    "pool_record",
    "pool_records",
    "pool_run",
    "pool_shape",
    "request_keys",
    "step_pool",
    "token_keys",
    "too_small",
]
