"""vLLM's hybrid pool (:mod:`simlab.engines.block_pool`); a request's block tables in it are
:class:`simlab.engines.block_pool.run.PoolRun`."""

from __future__ import annotations

from collections.abc import Sequence

from simlab.engines.block_pool.keys import committed_tokens, request_keys, token_keys
from simlab.engines.block_pool.queue import FreeQueue, Key, PoolShape
from simlab.engines.block_pool.run import PoolRun, internal_checkpoint
from traces.format import Request


class HybridPool:
    """vLLM's hybrid pool (see the module docstring); :meth:`serve` runs one request alone (the
    replay engine), :meth:`open` starts one that runs among others (the timed engine)."""

    def __init__(
        self,
        shape: PoolShape,
        junction: bool = True,
        max_tokens: int = 2048,
        retention: int | None = 0,
        unit: int | None = None,
        alignment: int | None = 1,
    ) -> None:
        self.shape = shape
        #: ``prefix_match_unit`` (tokens; None: the block): keys every ``unit`` tokens, a
        #: block's key its last one's (:class:`PoolRun`); a divisor of the block
        self.unit = unit or shape.block
        self.scale = shape.block // self.unit
        assert self.unit * self.scale == shape.block
        #: the Mamba layers' prefill checkpoint alignment (None: written only where a step
        #: ends, :func:`internal_checkpoint`)
        self.alignment = alignment
        self.junction = junction
        self.max_tokens = max_tokens  # tokens one step schedules (max_num_batched_tokens)
        #: ``retention`` (``prefix_cache_retention_interval``, tokens; None: dense) in blocks:
        #: 0 keeps the semantic states only, n also those on every n-th block (:meth:`PoolRun.kept`)
        self.every = 0 if retention == 0 else max(1, (retention or shape.block) // shape.block)
        self.pool = FreeQueue(shape.blocks)
        self.attn = shape.state_groups  # the attention group's id
        self.fresh: set[Key] = set()  # states cached in the scheduler step under way
        #: per group (the attention group last), blocks the scheduler step's copies hold
        #: until it ends (:meth:`release`)
        self.retained: list[list[int]] = [[] for _ in range(shape.state_groups + 1)]
        self.retaining = False

    def release(self) -> None:
        """The scheduler step ends: the copies of partial blocks it made have run, so their
        sources (a hit's) or their copies (a request's own prompt tail) are freed, group by
        group, each in the order they were made (``take_kv_cache_block_copies``, then
        ``_free_cow_retained_blocks``)."""
        if self.retaining:
            self.pool.free([block for group in self.retained for block in group])
            self.retained = [[] for _ in self.retained]
            self.retaining = False

    def chunk(
        self, start: int, prompt: int, junction: int, budget: int, tokens: int = 0
    ) -> tuple[int, int]:
        """The end of the prefill step from ``start`` with ``budget`` tokens and the checkpoint
        it writes inside (0: none): the budget, cut to a block boundary unless it reaches the
        prefill end (or a block is wider than a whole step), then at the first stop inside
        (``Scheduler._mamba_block_aligned_split``: a block boundary, the prompt's last unit
        boundary when the step does not write its state inside, the junction floored to the
        block grid from ``start``); the checkpoint block is taken for the step as it finally
        ends (the Mamba manager's ``_needs_internal_checkpoint``, on the layers' checkpoint
        ``alignment``). An end equal to ``start`` schedules nothing (the budget does not reach
        a block boundary).

        ``tokens``: what the prefill computes when it is not the ``prompt`` (0): a request
        resumed after a preemption recomputes its outputs too, and vLLM's prefill then ends
        one token short of them (``max(num_prompt_tokens, num_tokens - 1)``)."""
        size, unit = self.shape.block, self.unit
        tokens = tokens or prompt
        prefill_end = max(prompt, tokens - 1)
        end = min(start + budget, tokens)
        if not self.shape.state_groups:  # a Transformer: no block-aligned split
            return end, 0
        align = self.alignment
        internal = internal_checkpoint(start, end, prefill_end, size, prefill_end, unit, align)
        if end < prefill_end:
            aligned = end // size * size
            if aligned > start or size <= self.max_tokens:
                end = aligned
        last = 0 if internal else (tokens - 1) // size * size
        tail = (prompt - 1) // unit * unit if unit < size and not internal else 0
        stops = (
            (start // size + 1) * size if start % size and not internal else 0,
            last,
            tail if last < tail < prompt else 0,
            start + (junction - start) // size * size if start < junction < end else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        # the Mamba manager reserves a checkpoint block on every chunk unless retention is 0
        prefill_end = prefill_end if not self.every else 0
        return end, internal_checkpoint(start, end, prefill_end, size, unit=unit, alignment=align)

    def cached_bytes(self) -> tuple[int, int]:
        """(KV, state) bytes of the cached blocks, a dead state's surviving blocks included."""
        kv = self.pool.per_group.get(self.attn, 0)
        return kv * self.shape.block_bytes, (len(self.pool.key) - kv) * self.shape.block_bytes

    def open(self, tokens: Sequence[int], prompt: int, committed: int) -> PoolRun:
        """A request's run, looked up but holding nothing yet (:meth:`PoolRun.acquire`);
        ``tokens``: prompt then output, ``committed``: tokens whose KV is computed."""
        return PoolRun(self, token_keys(tokens, self.unit, committed), prompt)

    def open_request(self, req: Request, committed: bool) -> PoolRun:
        """:meth:`open` for ``req`` (a token or a hash-id request, :func:`request_keys`)."""
        keys = request_keys(req, self.unit, committed_tokens(req, committed))
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
            self.release()
            start = end
        n = prompt
        while n < committed:
            run.step(n, n + 1)
            self.release()
            n = self.next_change(n)
        run.finish()
        return run

    def next_change(self, n: int) -> int:
        """The first decode step after the one computing token ``n`` of a request running
        alone that can change the pool. A decode step from ``m`` reads the block indices of
        ``m - 1`` (the state it retires to), ``m`` and ``m + 1`` (the blocks it needs, keys and
        keeps) and nothing else once its first step has made its copies; so a step whose
        three indices equal the step's before it repeats that step's work: it takes, keys,
        caches and frees nothing. Those indices move only at ``m % block`` in ``(block - 1, 0,
        1)``. The steps between are skipped (``tests/test_block_pool_decode.py`` checks the
        records equal those of stepping every token)."""
        size = self.shape.block
        r = (n + 1) % size
        return n + 1 if size < 3 or r in (0, 1, size - 1) else n + size - r
