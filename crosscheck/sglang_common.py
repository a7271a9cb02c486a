"""SGLang's scheduler call sequence for one request at a time, over SGLang's own cache and pools.

Every request is a real ``sglang.srt.managers.schedule_batch.Req`` and goes through the functions
the scheduler calls (SGLang 0.5.23):

1. ``Req.init_next_round_input(tree_cache)``: ``match_kv_cache`` with the key capped at
   ``len(input) - 1`` (``_compute_max_prefix_len``; for Mamba also the copy-on-write of the
   matched state). The hit is ``req.prefix_len``.
2. ``req.lock = tree_cache.lock(req.last_node)`` (``PrefillAdder._commit_prefill_admission``).
3. ``alloc_req_slots`` (request row, and the Mamba slot, evicting Mamba states if short), then
   ``alloc_token_slots(tree_cache, len(input) - prefix)``: ``evict_to_free_tokens`` evicts the
   shortfall (``evict_for_alloc``) before ``allocator.alloc``. With pages (``page_size`` > 1)
   ``alloc_for_extend`` calls ``alloc_paged_token_slots_extend`` instead, whose eviction asks
   for one page more than the new tokens. The prefix and the new slots are written into the
   request's row; ``kv_allocated_len = kv_committed_len = len(input)``.
4. The first output token is appended. Unless that finishes the request,
   ``checkpoint_kv_cache`` publishes the prompt (``tree_cache.checkpoint(req, up_to=len(input))``).
5. Each decode step feeds the previous token: ``alloc_token_slots(tree_cache, 1)`` at the
   request's committed length (with pages ``alloc_paged_token_slots_decode``, as
   ``alloc_for_decode_default`` calls it: eviction asks for a whole page at every step, a new
   page is taken when the token starts one), ``kv_committed_len += 1``, then the next output
   token is appended.
   There are ``len(output) - 1`` steps: the last sampled token is never fed.
6. When ``len(output_ids)`` reaches ``max_new_tokens`` the request finishes by length (what
   ``Req.update_finish_state`` sets) and ``release_kv_cache(req, tree_cache, checkpoint=True)``
   publishes ``input + output - 1`` tokens, frees the row and unlocks.

After every request the pools are checked: free KV slots plus the tree's tokens equal the
capacity (and, with Mamba, free Mamba slots plus the tree's states equal the Mamba pool).
"""

from __future__ import annotations

from array import array
from typing import Any

import torch

from crosscheck import stubs

stubs.install()

from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req  # noqa: E402
from sglang.srt.mem_cache.allocation import (  # noqa: E402
    alloc_paged_token_slots_decode,
    alloc_paged_token_slots_extend,
    alloc_req_slots,
    alloc_token_slots,
)
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from crosscheck.common import replay_each  # noqa: E402


class SglangReplay:
    """Replays requests through ``tree_cache`` with SGLang's scheduler functions.

    ``kv_capacity``: the KV pool's slots; ``mamba_capacity``: the Mamba pool's slots (None for a
    cache without Mamba)."""

    def __init__(
        self,
        tree_cache: Any,
        kv_capacity: int,
        mamba_capacity: int | None = None,
    ) -> None:
        self.tree_cache = tree_cache
        self.allocator = tree_cache.token_to_kv_pool_allocator
        self.req_to_token_pool = tree_cache.req_to_token_pool
        self.kv_capacity = kv_capacity
        self.mamba_capacity = mamba_capacity
        self._next_rid = 0

    def request(self, input_ids: list[int], output_ids: list[int]) -> int:
        """Run one request to completion; returns its hit tokens."""
        if not output_ids:
            raise ValueError("SGLang always samples at least one output token")
        tree = self.tree_cache
        req = Req(
            rid=str(self._next_rid),
            origin_input_text="",
            origin_input_ids=array("q", input_ids),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=len(output_ids)),
        )
        self._next_rid += 1

        # 1-2. match (limit len-1) and lock, as the prefill adder does
        req.init_next_round_input(tree)
        hit = int(req.prefix_len)
        req.extend_end = len(input_ids)
        req.lock = tree.lock(req.last_node)

        # 3. request row (and Mamba slot), then the prompt's new KV slots
        alloc_req_slots(self.req_to_token_pool, [req], tree)
        row = req.kv.req_pool_idx
        prefix = tree.prefix_device_indices(req)
        out = self._alloc_extend(prefix, hit, len(input_ids))
        self.req_to_token_pool.write((row, slice(0, hit)), prefix.to(torch.int32))
        self.req_to_token_pool.write((row, slice(hit, len(input_ids))), out.to(torch.int32))
        req.kv.kv_allocated_len = req.kv.kv_committed_len = len(input_ids)

        # 4. first sampled token; publish the prompt, or all of it if that finished the request
        self.prefill_prepared(req)
        self._sample(req, output_ids[0])
        if req.finished():
            release_kv_cache(req, tree, checkpoint=True)
        else:
            checkpoint_kv_cache(req, tree)

        # 5. decode: feed each sampled token but the last; 6. the last finishes it by length
        for token in output_ids[1:]:
            pos = req.kv.kv_committed_len
            slot = self._alloc_decode(row, pos)
            self.req_to_token_pool.write((row, slice(pos, pos + 1)), slot.to(torch.int32))
            req.kv.kv_allocated_len += 1
            req.kv.kv_committed_len += 1
            req.decode_batch_idx += 1
            self._sample(req, token)
            self.decode_result(req)
        assert req.finished()
        self.check_pools()
        return hit

    def _alloc_extend(self, prefix: torch.Tensor, hit: int, length: int) -> torch.Tensor:
        """KV slots for the prompt past its ``hit``, as ``alloc_for_extend`` takes them."""
        if self.allocator.page_size == 1:
            return alloc_token_slots(self.tree_cache, length - hit)
        last_loc = prefix[-1:].to(torch.int64) if hit else torch.full((1,), -1)
        prefix_lens = torch.tensor([hit], dtype=torch.int64)
        seq_lens = torch.tensor([length], dtype=torch.int64)
        return alloc_paged_token_slots_extend(
            tree_cache=self.tree_cache,
            prefix_lens=prefix_lens,
            prefix_lens_cpu=prefix_lens,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens,
            last_loc=last_loc,
            extend_num_tokens=length - hit,
        )

    def _alloc_decode(self, row: int, pos: int) -> torch.Tensor:
        """The KV slot of the token fed at ``pos``, as ``alloc_for_decode_default`` takes it."""
        if self.allocator.page_size == 1:
            return alloc_token_slots(self.tree_cache, 1)
        last_loc = self.req_to_token_pool.req_to_token[row, pos - 1 : pos].to(torch.int64)
        seq_lens = torch.tensor([pos + 1], dtype=torch.int64)
        return alloc_paged_token_slots_decode(
            tree_cache=self.tree_cache, seq_lens=seq_lens, seq_lens_cpu=seq_lens, last_loc=last_loc
        )

    def prefill_prepared(self, req: Req) -> None:
        """What ``ScheduleBatch.prepare_for_extend`` does per request beyond allocation: nothing
        for these caches (a subclass tracks Mamba states)."""

    def decode_result(self, req: Req) -> None:
        """A decode step's result for ``req``, after its token is sampled: on finishing by
        length, ``release_kv_cache(req, tree, checkpoint=True)`` publishes
        ``input + output - 1`` tokens, frees the row and unlocks."""
        if req.finished():
            release_kv_cache(req, self.tree_cache, checkpoint=True)

    @staticmethod
    def _sample(req: Req, token: int) -> None:
        """Append a sampled token and finish by length as ``update_finish_state`` does."""
        req.output_ids.append(token)
        if len(req.output_ids) >= req.sampling_params.max_new_tokens:
            req.finished_reason = FINISH_LENGTH(length=req.sampling_params.max_new_tokens)
            req.finished_len = req.sampling_params.max_new_tokens

    def check_pools(self) -> None:
        """No request runs: every KV slot is free or in the tree (and every Mamba slot)."""
        tree = self.tree_cache
        cached = tree.evictable_size() + tree.protected_size()
        free = self.allocator.available_size()
        assert tree.protected_size() == 0, tree.protected_size()
        assert free + cached == self.kv_capacity, (free, cached, self.kv_capacity)
        if self.mamba_capacity is not None:
            mamba_free = self.req_to_token_pool.mamba_allocator.available_size()
            mamba_cached = tree.mamba_evictable_size() + tree.mamba_protected_size()
            assert mamba_free + mamba_cached == self.mamba_capacity, (
                mamba_free,
                mamba_cached,
                self.mamba_capacity,
            )

    def run(self, requests) -> list[int]:
        """Hit tokens of every ``(input_ids, output_ids)`` in order."""
        return replay_each(self.request, requests)
