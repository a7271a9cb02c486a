"""vLLM's hybrid pool and a request's block tables in it (:mod:`simlab.engines.block_pool`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from simlab.engines.block_pool.keys import committed_tokens, request_keys, token_keys
from simlab.engines.block_pool.queue import FreeQueue, Key, PoolFull, PoolShape
from traces.format import Request


def internal_checkpoint(
    start: int, end: int, prefill_end: int, size: int, block: int | None = None
) -> int:
    """The prefill checkpoint a step computing ``start..end`` writes into a block of its own,
    at the end of ``block`` (default: the last block boundary before ``end``); 0: none. Only
    a step reaching the prefill end writes one (``is_mamba_prefill_checkpoint_valid``, the
    checkpoint alignment 1)."""
    checkpoint = ((end - 1) // size if block is None else block) * size
    valid = (
        end >= prefill_end
        and start % size == 0
        and -(-end // size) - 2 > (start - 1) // size
        and start + size <= checkpoint < end
    )
    return checkpoint if valid else 0


class HybridPool:
    """vLLM's hybrid pool (see the module docstring); :meth:`serve` runs one request alone (the
    replay engine), :meth:`open` starts one that runs among others (the timed engine)."""

    def __init__(
        self,
        shape: PoolShape,
        junction: bool = True,
        max_tokens: int = 2048,
        retention: int | None = 0,
    ) -> None:
        self.shape = shape
        self.junction = junction
        self.max_tokens = max_tokens  # tokens one step schedules (max_num_batched_tokens)
        #: ``retention`` (``prefix_cache_retention_interval``, tokens; None: dense) in blocks:
        #: 0 keeps the semantic states only, n also those on every n-th block (:meth:`PoolRun.kept`)
        self.every = 0 if retention == 0 else max(1, (retention or shape.block) // shape.block)
        self.pool = FreeQueue(shape.blocks)
        self.attn = shape.state_groups  # the attention group's id
        self.fresh: set[Key] = set()  # states cached in the scheduler step under way

    def chunk(
        self, start: int, prompt: int, junction: int, budget: int, tokens: int = 0
    ) -> tuple[int, int]:
        """The end of the prefill step from ``start`` with ``budget`` tokens and the checkpoint
        it writes inside (0: none): the budget, cut to a block boundary unless it reaches the
        prefill end (or a block is wider than a whole step), then at the first stop inside
        (``Scheduler._mamba_block_aligned_split``); the checkpoint block is taken for the step
        as it finally ends (the Mamba manager's ``_needs_internal_checkpoint``; the checkpoint
        alignment is 1). An end equal to ``start`` schedules nothing (the budget does not
        reach a block boundary).

        ``tokens``: what the prefill computes when it is not the ``prompt`` (0): a request
        resumed after a preemption recomputes its outputs too, and vLLM's prefill then ends
        one token short of them (``max(num_prompt_tokens, num_tokens - 1)``)."""
        size = self.shape.block
        tokens = tokens or prompt
        prefill_end = max(prompt, tokens - 1)
        end = min(start + budget, tokens)
        if not self.shape.state_groups:  # a Transformer: no block-aligned split
            return end, 0
        internal = internal_checkpoint(start, end, prefill_end, size, (prefill_end - 1) // size)
        if end < prefill_end:
            aligned = end // size * size
            if aligned > start or size <= self.max_tokens:
                end = aligned
        stops = (
            (start // size + 1) * size if start % size and not internal else 0,
            0 if internal else (tokens - 1) // size * size,
            junction,
        )
        end = min((s for s in stops if start < s < end), default=end)
        # the Mamba manager reserves a checkpoint block on every chunk unless retention is 0
        return end, internal_checkpoint(start, end, prefill_end if not self.every else 0, size)

    def cached_bytes(self) -> tuple[int, int]:
        """(KV, state) bytes of the cached blocks, a dead state's surviving blocks included."""
        kv = self.pool.per_group.get(self.attn, 0)
        return kv * self.shape.block_bytes, (len(self.pool.key) - kv) * self.shape.block_bytes

    def open(self, tokens: Sequence[int], prompt: int, committed: int) -> PoolRun:
        """A request's run, looked up but holding nothing yet (:meth:`PoolRun.acquire`);
        ``tokens``: prompt then output, ``committed``: tokens whose KV is computed."""
        return PoolRun(self, token_keys(tokens, self.shape.block, committed), prompt)

    def open_request(self, req: Request, committed: bool) -> PoolRun:
        """:meth:`open` for ``req`` (a token or a hash-id request, :func:`request_keys`)."""
        keys = request_keys(req, self.shape.block, committed_tokens(req, committed))
        return PoolRun(self, keys, req.input_tokens)

    def serve(self, tokens: Sequence[int], prompt: int, committed: int) -> PoolRun:
        """Run one request alone, start to finish (``tokens``, ``prompt``, ``committed``: as
        :meth:`open`'s)."""
        return self._serve(self.open(tokens, prompt, committed), prompt, committed)

    def serve_request(self, req: Request, committed: bool) -> PoolRun:
        """:meth:`serve` for ``req`` (:meth:`open_request`)."""
        run = self.open_request(req, committed)
        return self._serve(run, req.input_tokens, committed_tokens(req, committed))

    def _serve(self, run: PoolRun, prompt: int, committed: int) -> PoolRun:
        run.acquire()
        start = run.hit_tokens
        while start < prompt:
            end, checkpoint = self.chunk(start, prompt, run.junction, self.max_tokens)
            run.step(start, end, checkpoint)
            start = end
        for n in range(prompt, committed):
            run.step(n, n + 1)
        run.finish()
        return run


class PoolRun:
    """A request's block tables while it runs (Mamba groups' with ``None`` for null blocks).

    Invariants: a step takes blocks only after checking that the free queue holds them all
    (:class:`PoolFull` otherwise, with nothing taken), so a failed step can be retried once
    room is made; ``evicted`` counts the cached blocks this request's steps took."""

    def __init__(self, pool: HybridPool, keys: list[int], prompt: int, tokens: int = 0):
        self.p, self.keys, self.prompt = pool, keys, prompt
        self.tokens = tokens or prompt  # what the prefill computes (HybridPool.chunk)
        size, groups, queue = pool.shape.block, pool.shape.state_groups, pool.pool
        matched = 0
        while (
            matched < (self.tokens - 1) // size
            and queue.get((pool.attn, keys[matched])) is not None
        ):
            matched += 1
        self.matched = matched
        self.hit = next(
            (
                j
                for j in range(matched, 0, -1)
                if all(queue.get((g, keys[j - 1])) is not None for g in range(groups))
            ),
            0,
        )
        self.junction = matched * size if pool.junction and matched > self.hit else 0
        self.attn: list[int] = []
        self.tables: list[list[int | None]] = [[None] * self.hit for _ in range(groups)]
        self.retired = [0] * groups
        # the prompt's: a resumed request's outputs add no cached state (``replay_boundaries``
        # of ``num_prompt_tokens``)
        self.checkpoint = (self.prompt - 1) // size * size
        self.reachable = {self.checkpoint // size - 1}
        if self.junction:
            self.reachable.add(matched - 1)
        self.kv_cached = self.states_cached = self.evicted = 0
        self.keyed = 0  # attention blocks below this have their keys (cached or hit)
        self.idle_end = self.idle_upto = 0
        self._bound_idle()

    @property
    def hit_tokens(self) -> int:
        return self.hit * self.p.shape.block

    @property
    def matched_tokens(self) -> int:
        return self.matched * self.p.shape.block

    def _hit_blocks(self) -> list[int]:
        """The cached blocks the hit reuses: its KV chain and its state's block per group."""
        queue, attn, hit = self.p.pool, self.p.attn, self.hit
        blocks = [queue.get((attn, self.keys[i])) for i in range(hit)]
        if hit:
            blocks += [queue.get((g, self.keys[hit - 1])) for g in range(len(self.tables))]
        assert None not in blocks
        return blocks  # type: ignore[return-value]

    def first_need(self, budget: int) -> int:
        """Free-queue blocks the request's first prefill step (with ``budget`` tokens) uses:
        the hit's blocks that sit in the queue and the blocks the step takes (vLLM's
        ``allocate_slots`` check when a request is scheduled)."""
        queue = self.p.pool
        free_hit = sum(1 for block in self._hit_blocks() if not queue.refs.get(block))
        end, checkpoint = self.p.chunk(
            self.hit_tokens, self.prompt, self.junction, budget, self.tokens
        )
        return free_hit + self._takes(end, checkpoint, self.hit)

    def first_chunk(self, budget: int) -> int:
        """Tokens of its first prefill step with ``budget`` tokens left (0: it cannot be
        scheduled in this step)."""
        end, _ = self.p.chunk(self.hit_tokens, self.prompt, self.junction, budget, self.tokens)
        return end - self.hit_tokens

    def full_need(self) -> int:
        """Free-queue blocks the whole prefill needs (vLLM's admission check with
        ``scheduler_reserve_full_isl``, its default): the hit's blocks that sit in the queue,
        a KV block per block of the prefill beyond the hit and, per Mamba group, its running
        block (and its checkpoint's when the whole prefill in one step would write one)."""
        queue, size = self.p.pool, self.p.shape.block
        free_hit = sum(1 for block in self._hit_blocks() if not queue.refs.get(block))
        need = -(-self.tokens // size)
        if need <= self.hit:
            return free_hit
        prefill_end = max(self.prompt, self.tokens - 1)
        checkpoint = internal_checkpoint(self.hit_tokens, self.tokens, prefill_end, size)
        per_group = min(need - self.hit, 2 if checkpoint else 1)
        return free_hit + need - self.hit + per_group * len(self.tables)

    def hits_fresh_state(self) -> bool:
        """Whether its hit's state was cached in the scheduler step under way (vLLM defers
        such a hit to the next step: ``cached_blocks_this_step``)."""
        return bool(self.hit) and (0, self.keys[self.hit - 1]) in self.p.fresh

    def acquire(self) -> None:
        """Take the hit's blocks out of the free queue (``touch``)."""
        queue, blocks = self.p.pool, self._hit_blocks()
        for block in blocks:
            queue.touch(block)
        self.attn = blocks[: self.hit]
        for table, block in zip(self.tables, blocks[self.hit :], strict=False):
            table[self.hit - 1] = block
        self._bound_idle()

    def _takes(self, end: int, checkpoint: int, attn_blocks: int) -> int:
        """Blocks a step to ``end`` takes (writing ``checkpoint``; 0: none)."""
        need = -(-end // self.p.shape.block)
        state = sum(2 if checkpoint else 1 for t in self.tables if need > len(t) or checkpoint)
        return state + max(0, need - attn_blocks)

    def idle(self, end: int, known: int | None = None) -> bool:
        """Whether a Transformer's step to ``end`` (``known``: as :meth:`step`'s) changes
        nothing (:meth:`step` would take no block and key none): most decode steps. The
        scheduler's running pass inlines it (``VllmMemory.schedule``)."""
        upto = end if known is None or known > end else known
        return end <= self.idle_end and upto <= self.idle_upto

    def _bound_idle(self) -> None:
        """Recompute the bounds :meth:`idle` reads, after the blocks or keys changed.

        Invariant: a step to ``end`` keying the first ``upto`` tokens takes no block and keys
        none exactly when ``end <= idle_end`` (its blocks are all held: ``ceil(end / block) <=
        len(attn)``; -1 with Mamba groups, whose steps always change something) and ``upto <=
        idle_upto`` (no block beyond ``keyed`` is full: ``upto // block <= keyed``, or every
        key is used)."""
        size = self.p.shape.block
        self.idle_end = -1 if self.tables else len(self.attn) * size
        self.idle_upto = (self.keyed + 1) * size - 1 if len(self.keys) > self.keyed else sys.maxsize

    def step(
        self,
        start: int,
        end: int,
        checkpoint: int = 0,
        processed: int | None = None,
        known: int | None = None,
    ) -> None:
        """One scheduler step computing tokens ``start..end``, writing the state at
        ``checkpoint`` (0: none) into a block of its own. :class:`PoolFull`, with nothing
        taken, when the free queue is short.

        Under vLLM's async scheduling the step before may still be in flight: Mamba blocks
        are freed up to the state at ``processed`` (``remove_skipped_blocks`` counts the
        computed tokens less those in flight; default ``start``), and blocks are keyed only
        up to the ``known`` tokens (``allocate_slots`` caches up to ``request.num_tokens``: a
        token still in flight has no value yet; default ``end``)."""
        if not self.tables:
            self._step_kv(end, end if known is None else min(end, known))
            return
        self._retire(start if processed is None else processed)
        size, queue = self.p.shape.block, self.p.pool
        if queue.finite and self._takes(end, checkpoint, len(self.attn)) > len(queue.queue):
            raise PoolFull
        evicted = queue.evicted
        need = -(-end // size)
        for table in self.tables:
            if need <= len(table) and not checkpoint:
                continue
            head = checkpoint // size - 1 if checkpoint else need - 1
            table.extend([None] * (head - len(table)))
            table.extend(queue.take(2 if checkpoint else 1))
        if need > len(self.attn):
            self.attn.extend(queue.take(need - len(self.attn)))
        self.evicted += queue.evicted - evicted
        upto = end if known is None else min(end, known)
        self.key(upto)
        new_states = 0
        kept = self.kept(start, upto)
        for g, table in enumerate(self.tables):
            for i in kept:
                block = table[i] if 0 <= i < min(upto // size, len(table)) else None
                if block is not None and queue.cache(block, (g, self.keys[i])):
                    new_states += 1
                    self.p.fresh.add((g, self.keys[i]))
        self.states_cached += new_states // len(self.tables) if self.tables else 0

    def kept(self, start: int, upto: int) -> set[int]:
        """The blocks whose state a step from ``start`` keying ``upto`` tokens keeps when it
        holds one (``reachable_block_mask``): the reachable ones (the prompt checkpoint, the
        junction) and, with a retention interval of ``every`` blocks, those ending on a
        multiple of it (every block: dense)."""
        every = self.p.every
        if not every:
            return self.reachable
        first = max(0, start // self.p.shape.block - 1)
        last = upto // self.p.shape.block
        return self.reachable | {i for i in range(first, last) if (i + 1) % every == 0}

    def _step_kv(self, end: int, upto: int) -> None:
        """:meth:`step` of a Transformer (no Mamba group: nothing to retire or checkpoint):
        the KV blocks up to ``end`` taken (:class:`PoolFull`, nothing taken, when the free
        queue is short), the first ``upto`` tokens keyed."""
        attn, queue = self.attn, self.p.pool
        need = -(-end // self.p.shape.block) - len(attn)
        if need > 0:
            evicted = queue.evicted
            attn.extend(queue.take(need))
            self.evicted += queue.evicted - evicted
        self.key(upto)

    def key(self, upto: int) -> None:
        """Key the full KV blocks of the first ``upto`` tokens (those below were keyed by an
        earlier step): they are cached from now on."""
        queue = self.p.pool
        full = min(upto // self.p.shape.block, len(self.keys))
        if full > self.keyed:
            group, attn, keys = self.p.attn, self.attn, self.keys
            for i in range(self.keyed, full):
                self.kv_cached += queue.cache(attn[i], (group, keys[i]))
            self.keyed = full
        self._bound_idle()

    def _retire(self, computed: int) -> None:
        """Free every Mamba block before the one holding the state at ``computed``."""
        last = max(0, computed - 1) // self.p.shape.block
        for g, table in enumerate(self.tables):
            end = min(last, len(table))
            freed = []
            for i in range(end - 1, self.retired[g] - 1, -1):
                block = table[i]
                if block is not None:
                    freed.append(block)
                    table[i] = None
            if freed:
                self.p.pool.free(freed)
            self.retired[g] = max(self.retired[g], end)

    def finish(self) -> None:
        """Free every block (finished or preempted): each Mamba group's, then the KV, tail
        first."""
        queue = self.p.pool
        for table in self.tables:
            queue.free([b for b in reversed(table) if b is not None])
        queue.free(self.attn[::-1])
        self.attn, self.tables = [], [[] for _ in self.tables]
        self._bound_idle()
