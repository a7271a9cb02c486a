"""A request's block tables in vLLM's hybrid pool (:mod:`simlab.engines.block_pool`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from simlab.engines.block_pool.queue import PoolFull

if TYPE_CHECKING:
    from simlab.engines.block_pool.pool import HybridPool


def internal_checkpoint(
    start: int,
    end: int,
    prefill_end: int,
    size: int,
    last: int | None = None,
    unit: int | None = None,
    alignment: int | None = 1,
) -> int:
    """The prefill checkpoint a step computing ``start..end`` writes into a block of its own,
    at the last boundary of ``unit`` tokens (default: the block of ``size``; vLLM's
    ``prefix_match_unit``) below ``last`` (default: ``end``); 0: none. Only a step reaching
    the prefill end writes one (``is_mamba_prefill_checkpoint_valid``), into the block before
    the step's last, at a multiple of the layers' checkpoint ``alignment`` from ``start``
    (None: their kernels write none)."""
    if alignment is None:
        return 0
    unit = unit or size
    checkpoint = ((end if last is None else last) - 1) // unit * unit
    valid = (
        end >= prefill_end
        and start % unit == 0
        and -(-end // size) - 2 > (start - 1) // size
        and start + unit <= checkpoint < end
        and (checkpoint - start) % alignment == 0
    )
    return checkpoint if valid else 0


class PoolRun:
    """A request's block tables while it runs (Mamba groups' with ``None`` for null blocks).

    Positions are tokens. ``keys`` has one key per ``unit`` tokens (the pool's
    ``prefix_match_unit``): the key at a boundary is the prefix up to it, and a block's key is
    its last boundary's. With a unit below the block (vLLM's partial hash hits), a prompt also
    caches its last unit boundary below its end, ``tail``: its attention block gets that
    boundary's key, and its state too (written inside the prefill step, or else the running
    block's, copied to a block of its own by the next step); a hit may end there, inside a
    block, whose attention block and state the request then copies (CoW) in its first step.

    Invariants: a step takes blocks only after checking that the free queue holds them all
    (:class:`PoolFull` otherwise, with nothing taken), so a failed step can be retried once
    room is made; ``evicted`` counts the cached blocks this request's steps took."""

    def __init__(self, pool: HybridPool, keys: list[int], prompt: int, tokens: int = 0):
        self.p, self.keys, self.prompt = pool, keys, prompt
        self.tokens = tokens or prompt  # what the prefill computes (HybridPool.chunk)
        size, unit, scale = pool.shape.block, pool.unit, pool.scale
        groups, queue, attn = pool.shape.state_groups, pool.pool, pool.attn
        limit = self.tokens - 1
        # the attention hit (``FullAttentionManager.find_longest_cache_hit``): whole blocks,
        # then, finer keys, the first block short of whole probed at its unit boundaries
        full = 0
        while full < limit // size and queue.get((attn, keys[(full + 1) * scale - 1])) is not None:
            full += 1
        matched, self.tail_block = full * size, -1
        if scale > 1:
            first = full * scale
            for j in range(min(first + scale - 1, limit // unit, len(keys)) - 1, first - 1, -1):
                block = queue.get((attn, keys[j]))
                if block is not None:
                    matched, self.tail_block = (j + 1) * unit, block
                    break
        self.full, self.matched = full, matched
        # the deepest boundary within it whose state every Mamba group holds
        self.hit = unit * next(
            (
                j + 1
                for j in range(matched // unit - 1, -1, -1)
                if all(queue.get((g, keys[j])) is not None for g in range(groups))
            ),
            0,
        )
        self.junction = matched if pool.junction and matched > self.hit else 0
        self.attn: list[int] = []
        self.tables: list[list[int | None]] = [[None] * -(-self.hit // size) for _ in range(groups)]
        self.retired = [0] * groups
        # the prompt's: a resumed request's outputs add no cached state (``replay_boundaries``
        # of ``num_prompt_tokens``)
        self.checkpoint = (self.prompt - 1) // size * size
        self.reachable = {self.checkpoint // size - 1}
        if self.junction:
            self.reachable.add(matched // size - 1)
        tail = (self.prompt - 1) // unit * unit
        self.tail = tail if tail % size else 0  # the prompt's partial tail (finer keys only)
        self.copy = self.hit % size != 0  # its first step copies the hit's partial blocks
        self.moving = False  # its next step copies its partial-tail state to a block of its own
        self.kv_cached = self.states_cached = self.evicted = 0
        self.keyed = 0  # attention blocks below this have their keys (cached or hit)
        #: what the last plain step read (:meth:`step`; None: the last step was not plain)
        self.last_reads: tuple[int | bool, ...] | None = None
        self.idle_end = self.idle_upto = 0
        self._bound_idle()

    @property
    def hit_tokens(self) -> int:
        return self.hit

    @property
    def matched_tokens(self) -> int:
        return self.matched

    def _key(self, end: int) -> int:
        """The key of the prefix of ``end`` tokens (a unit boundary)."""
        return self.keys[end // self.p.unit - 1]

    def _hit_blocks(self) -> list[int]:
        """The cached blocks the hit reuses: its KV chain (the block it ends in included) and
        its state's block per group."""
        queue, attn, hit, size = self.p.pool, self.p.attn, self.hit, self.p.shape.block
        n = -(-hit // size)
        blocks = [queue.get((attn, self._key((i + 1) * size))) for i in range(min(n, self.full))]
        if n > self.full:
            blocks.append(self.tail_block)
        if hit:
            blocks += [queue.get((g, self._key(hit))) for g in range(len(self.tables))]
        assert None not in blocks and -1 not in blocks
        return blocks  # type: ignore[return-value]

    def first_need(self, budget: int) -> int:
        """Free-queue blocks the request's first prefill step (with ``budget`` tokens) uses:
        the hit's blocks that sit in the queue and the blocks the step takes (vLLM's
        ``allocate_slots`` check when a request is scheduled)."""
        queue = self.p.pool
        free_hit = sum(1 for block in self._hit_blocks() if not queue.refs.get(block))
        end, checkpoint = self.p.chunk(self.hit, self.prompt, self.junction, budget, self.tokens)
        return free_hit + self._takes(end, checkpoint, -(-self.hit // self.p.shape.block))

    def first_chunk(self, budget: int) -> int:
        """Tokens of its first prefill step with ``budget`` tokens left (0: it cannot be
        scheduled in this step)."""
        end, _ = self.p.chunk(self.hit, self.prompt, self.junction, budget, self.tokens)
        return end - self.hit

    def full_need(self) -> int:
        """Free-queue blocks the whole prefill needs (vLLM's admission check with
        ``scheduler_reserve_full_isl``, its default): the hit's blocks that sit in the queue,
        a KV block per block of the prefill beyond the hit and, per Mamba group, its running
        block (and its checkpoint's when the whole prefill in one step would write one), and
        the copies of a hit ending inside a block."""
        queue, size = self.p.pool, self.p.shape.block
        free_hit = sum(1 for block in self._hit_blocks() if not queue.refs.get(block))
        grow = max(0, -(-self.tokens // size) - -(-self.hit // size))
        copy = int(self.copy)
        if not grow and not copy:
            return free_hit
        prefill_end = max(self.prompt, self.tokens - 1)
        checkpoint = internal_checkpoint(
            self.hit, self.tokens, prefill_end, size, unit=self.p.unit, alignment=self.p.alignment
        )
        per_group = min(grow + copy, (2 if checkpoint else 1) + copy)
        return free_hit + grow + copy + per_group * len(self.tables)

    def hits_fresh_state(self) -> bool:
        """Whether its hit's state was cached in the scheduler step under way (vLLM defers
        such a hit to the next step: ``cached_blocks_this_step``)."""
        return bool(self.hit) and (0, self._key(self.hit)) in self.p.fresh

    def acquire(self) -> None:
        """Take the hit's blocks out of the free queue (``touch``)."""
        queue, blocks = self.p.pool, self._hit_blocks()
        for block in blocks:
            queue.touch(block)
        n = -(-self.hit // self.p.shape.block)
        self.attn = blocks[:n]
        for table, block in zip(self.tables, blocks[n:], strict=False):
            table[n - 1] = block
        self._bound_idle()

    def _takes(self, end: int, checkpoint: int, attn_blocks: int) -> int:
        """Blocks a step to ``end`` takes (writing ``checkpoint``; 0: none)."""
        need = -(-end // self.p.shape.block)
        copies = int(self.copy or self.moving)
        state = sum(
            (2 if checkpoint else 1) * (need > len(t) or bool(checkpoint)) + copies
            for t in self.tables
        )
        return state + max(0, need - attn_blocks) + int(self.copy)

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
        more = len(self.keys) // self.p.scale > self.keyed
        self.idle_upto = (self.keyed + 1) * size - 1 if more else sys.maxsize

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
        token still in flight has no value yet; default ``end``).

        A hybrid's plain step (no checkpoint, no copy) that reads the same blocks as the plain
        step before it changes nothing, and returns at once: most decode steps
        (``tests/test_block_pool_decode.py`` checks the timed engine's records against stepping
        in full)."""
        upto = end if known is None else min(end, known)
        if not self.tables:
            self._step_kv(end, upto)
            return
        processed = start if processed is None else processed
        size, queue = self.p.shape.block, self.p.pool
        plain = not checkpoint and not self.copy and not self.moving
        # what such a step reads: the blocks of the state it retires to, of its end, of the
        # tokens it keys and of its start, and where they stand to the prompt's tail
        reads = (
            (max(0, processed - 1) // size, -(-end // size), upto // size, start // size)
            + ((upto >= self.tail, upto == self.tail) if self.tail else ())
            if plain
            else None
        )
        if reads is not None and reads == self.last_reads:
            return  # the step before read the same: it took, keyed and freed all there is
        self._retire(processed)
        if queue.finite and self._takes(end, checkpoint, len(self.attn)) > len(queue.queue):
            raise PoolFull
        evicted = queue.evicted
        need = -(-end // size)
        copies = int(self.copy or self.moving)
        for g, table in enumerate(self.tables):
            grow = need > len(table) or bool(checkpoint)
            n = (2 if checkpoint else 1) * grow + copies
            if not n:
                continue
            if grow:
                head = checkpoint // size - 1 if checkpoint else need - 1
                table.extend([None] * (head - len(table)))
            taken = queue.take(n)
            if copies:
                self._copy_state(g, table, taken.pop(0))
            table.extend(taken)
        if self.copy:  # the attention block the hit ends in (``_apply_cow``)
            i = self.hit // size
            self.p.retained[self.p.attn].append(self.attn[i])
            self.p.retaining = True
            self.attn[i] = queue.take(1)[0]
        if need > len(self.attn):
            self.attn.extend(queue.take(need - len(self.attn)))
        self.copy = self.moving = False
        self.evicted += queue.evicted - evicted
        self.key(upto)
        self.states_cached += self._cache_states(start, upto, checkpoint)
        self.last_reads = reads

    def _copy_state(self, g: int, table: list[int | None], copy: int) -> None:
        """Group ``g``'s copy of a partial block's state, into the block ``copy``: the hit's
        (the request runs on the copy, the source is freed when the scheduler step ends) or
        its own prompt tail's (it keeps running on its block, the cached state moves to the
        copy, freed then: ``MambaManager.allocate_new_blocks``)."""
        queue, size = self.p.pool, self.p.shape.block
        self.p.retaining = True
        if self.copy:
            i = self.hit // size
            source = table[i]
            assert source is not None
            self.p.retained[g].append(source)
            table[i] = copy
            return
        source = table[self.tail // size]
        assert source is not None
        queue.move(source, copy)
        self.p.retained[g].append(copy)
        self.p.fresh.add((g, self._key(self.tail)))

    def _cache_states(self, start: int, upto: int, checkpoint: int) -> int:
        """Cache the step's states the pool keeps (:meth:`kept`; a checkpoint written off
        the block grid under the key of its own boundary, if it is the prompt's or the
        junction's) and, finer keys, the running state at the prompt's partial tail; the
        states newly cached (one per Mamba group each)."""
        queue, size, keys = self.p.pool, self.p.shape.block, self.keys
        new_states, fine = 0, self.p.scale > 1
        off_grid = checkpoint // size - 1 if checkpoint % size else -1
        kept = self.kept(start, upto)
        for g, table in enumerate(self.tables):
            for i in kept:
                block = table[i] if 0 <= i < min(upto // size, len(table)) else None
                if block is None:
                    continue
                if i == off_grid:  # ``MambaManager._cache_partial_tail_block``'s re-key
                    if checkpoint not in (self.prompt_checkpoint, self.junction):
                        continue
                    key = (g, self._key(checkpoint))
                    cached = queue.cache_at(block, key, checkpoint, replace=True)
                elif fine:
                    key = (g, self._key((i + 1) * size))
                    cached = queue.cache_at(block, key, (i + 1) * size)
                else:
                    key = (g, keys[i])
                    cached = queue.cache(block, key)
                if cached:
                    new_states += 1
                    self.p.fresh.add(key)
        tail = self.tail
        if tail and upto == tail and not checkpoint:  # the running state at the tail
            for g, table in enumerate(self.tables):
                block = table[tail // size] if tail // size < len(table) else None
                key = (g, self._key(tail))
                if block is not None and queue.cache_at(block, key, tail):
                    new_states += 1
                    self.p.fresh.add(key)
                    self.moving = True
        return new_states // len(self.tables)

    @property
    def prompt_checkpoint(self) -> int:
        """The prompt's last unit boundary below its end, where its state is kept."""
        return (self.prompt - 1) // self.p.unit * self.p.unit

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
        earlier step): they are cached from now on; finer keys, the block the prompt's tail
        ends in under the tail's key too, once computed (``_cache_partial_tail_block``)."""
        queue, size, scale = self.p.pool, self.p.shape.block, self.p.scale
        full = min(upto // size, len(self.keys) // scale)
        group, attn, keys = self.p.attn, self.attn, self.keys
        if full > self.keyed:
            if scale == 1:
                for i in range(self.keyed, full):
                    self.kv_cached += queue.cache(attn[i], (group, keys[i]))
            else:
                for i in range(self.keyed, full):
                    end = (i + 1) * size
                    self.kv_cached += queue.cache_at(attn[i], (group, self._key(end)), end)
            self.keyed = full
        tail = self.tail
        if tail and upto >= tail and tail // size < len(attn):
            self.kv_cached += queue.cache_at(attn[tail // size], (group, self._key(tail)), tail)
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
