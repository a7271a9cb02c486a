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
tokens of one attention layer's KV (``B``: :func:`policies.production.vllm_hybrid_block_size`),
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

A state dies with its first group block taken; its other blocks hold memory until the queue
reaches them. A request that does not fit in the whole pool is an error (vLLM would never
schedule it).

A Transformer is the same pool without Mamba groups: one group of every layer, blocks of
``policy.block_size`` tokens, a prefill cut by the token budget alone (no block-aligned split),
the hit its whole cached chain within ``L - 1``. The timed engine runs it there with
``engine.kv_pool=shared`` (:mod:`simlab.engines.timed.vllm_world`: vLLM's scheduler over its own pool,
checked against the real ``Scheduler`` under load, ``tests/fixtures/crosscheck_load``); the
replay keeps the prefix tree, whose per-request hits are vLLM's already.
"""

from __future__ import annotations

import logging
import math
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from simlab.config import ConfigError
from simlab.engines.base import EngineRun
from simlab.engines.records import RequestRecord, request_record
from simlab.engines.step import RequestStep
from simlab.model.spec import ModelSpec
from traces.format import Request

log = logging.getLogger(__name__)

_Key = tuple[int, int]  # (group, block hash)
#: the policy this pool models (named, not imported: the simulator imports the contract only)
_VLLM = "policies.production.VLLM"
_BLOCK_LRU = "policies.production.BlockLRU"


@dataclass(frozen=True)
class PoolShape:
    """The pool of a hybrid under vLLM: ``block`` tokens per block, ``state_groups`` Mamba
    groups (a state is one block in each), ``block_bytes`` per pool block, ``blocks`` usable."""

    block: int
    state_groups: int
    block_bytes: int
    blocks: float  # math.inf: an infinite pool

    @classmethod
    def of(cls, model: ModelSpec, block: int, capacity_bytes: float) -> PoolShape | None:
        """The shape vLLM plans for ``model``; None when its attention layers need more than
        one group (not modelled)."""
        attn, ssm = model.n_attn_layers, model.n_ssm_layers
        size = min(attn, ssm) or attn  # a Transformer: one group of every layer
        if max(attn, ssm) < 1.5 * size:
            size = max(attn, ssm)
        if -(-attn // size) != 1:
            return None
        block_bytes = size * block * model.kv_bytes_per_token_per_layer
        blocks = capacity_bytes if math.isinf(capacity_bytes) else capacity_bytes // block_bytes
        return cls(block, -(-ssm // size), block_bytes, blocks)


class FreeQueue:
    """The pool's blocks: the LRU free queue (head: taken next), reference counts and the
    cached ones' keys. An infinite pool takes a new block every time (it never evicts)."""

    def __init__(self, blocks: float) -> None:
        self.finite = not math.isinf(blocks)
        self.queue: OrderedDict[int, None] = OrderedDict.fromkeys(
            range(int(blocks) if self.finite else 0)
        )
        self.made = len(self.queue)
        self.refs: dict[int, int] = {}
        self.key: dict[int, _Key] = {}
        self.cached: dict[_Key, list[int]] = {}
        self.per_group: dict[int, int] = {}  # group -> its cached blocks (keys)
        self.evicted = 0  # cached blocks taken (their content evicted)

    def take(self, n: int) -> list[int]:
        """``n`` blocks from the head; a cached one loses its content."""
        if n > len(self.queue) and self.finite:
            raise PoolFull
        if self.finite:
            popitem = self.queue.popitem
            out = [popitem(last=False)[0] for _ in range(n)]
        else:
            out = list(range(self.made, self.made + n))
            self.made += n
        keys, refs = self.key, self.refs
        for block in out:
            key = keys.pop(block, None)
            if key is not None:
                self.per_group[key[0]] -= 1
                owners = self.cached[key]
                owners.remove(block)
                if not owners:
                    del self.cached[key]
                self.evicted += 1
            refs[block] = 1
        return out

    def get(self, key: _Key) -> int | None:
        owners = self.cached.get(key)
        return owners[0] if owners else None

    def touch(self, block: int) -> None:
        if not self.refs.get(block):
            del self.queue[block]
        self.refs[block] = self.refs.get(block, 0) + 1

    def free(self, blocks: Sequence[int]) -> None:
        """``blocks`` in eviction order: uncached ones to the head (in this order), cached
        ones to the tail."""
        first = []
        for block in blocks:
            self.refs[block] -= 1
            if self.refs[block]:
                continue
            if block in self.key:
                self.queue[block] = None
            else:
                first.append(block)
        for block in reversed(first):
            self.queue[block] = None
            self.queue.move_to_end(block, last=False)

    def cache(self, block: int, key: _Key) -> bool:
        """Give ``block`` its content's key; False when it already has one."""
        if block in self.key:
            return False
        self.key[block] = key
        self.cached.setdefault(key, []).append(block)
        self.per_group[key[0]] = self.per_group.get(key[0], 0) + 1
        return True


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


class PoolFull(Exception):
    """A step needs more blocks than the free queue holds (free and cached ones together)."""


class HybridPool:
    """vLLM's hybrid pool (see the module docstring); :meth:`serve` runs one request alone (the
    replay engine), :meth:`open` starts one that runs among others (the timed engine)."""

    def __init__(self, shape: PoolShape, junction: bool = True, max_tokens: int = 2048) -> None:
        self.shape = shape
        self.junction = junction
        self.max_tokens = max_tokens  # tokens one step schedules (max_num_batched_tokens)
        self.pool = FreeQueue(shape.blocks)
        self.attn = shape.state_groups  # the attention group's id
        self.fresh: set[_Key] = set()  # states cached in the scheduler step under way

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
        return end, internal_checkpoint(start, end, prefill_end, size)

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
        scheduler's running pass inlines it (``PoolWorld._plan_step``)."""
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
        for g, table in enumerate(self.tables):
            for i in self.reachable:
                block = table[i] if 0 <= i < min(upto // size, len(table)) else None
                if block is not None and queue.cache(block, (g, self.keys[i])):
                    new_states += 1
                    self.p.fresh.add((g, self.keys[i]))
        self.states_cached += new_states // len(self.tables) if self.tables else 0

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


def pool_records(
    requests: Sequence[Request], model: ModelSpec, policy: str, pool: HybridPool, committed: bool
) -> EngineRun:
    """The replay engine's run of ``requests`` through vLLM's hybrid ``pool``, one at a time."""
    records = []
    peaks = Peaks()
    for req in requests:
        try:
            run = pool.serve_request(req, committed)
        except PoolFull:
            raise too_small(pool.shape, req) from None
        records.append(pool_record(req, model, policy, pool, run))
        peaks.note(records[-1])
    return EngineRun(records=records, extras=peaks.extras())


def committed_tokens(req: Request, committed: bool) -> int:
    """Tokens of ``req`` whose KV is computed: all but the last sampled one when
    ``committed`` (the engine never feeds it back)."""
    return req.input_tokens + req.output_len - (1 if committed and req.output_len else 0)


def token_keys(tokens: Sequence[int], size: int, committed: int) -> list[int]:
    """vLLM's chained block hashes of the full ``size``-token blocks of ``tokens`` within the
    first ``committed``: block ``i``'s key hashes block ``i - 1``'s with its tokens."""
    keys, chain = [], 0
    for i in range(committed // size):
        chain = hash((chain, tuple(tokens[i * size : (i + 1) * size])))
        keys.append(chain)
    return keys


#: an output token of a hash-id request: its replies are unknown (``crosscheck.export``)
REPLY_TOKEN = -1


def request_keys(req: Request, size: int, committed: int) -> list[int]:
    """:func:`token_keys` of ``req``'s first ``committed`` tokens. A hash-id request's tokens
    are its ids, each ``block_size`` times, cut at its true length, then its outputs, each
    :data:`REPLY_TOKEN` (what ``crosscheck.export --outputs trace`` gives the engines): a
    block's content is its runs ``(value, count)``, which are equal exactly where the tokens
    are (adjacent runs of one value merged), so the keys match exactly where vLLM's hashes of
    those tokens do, without spelling the tokens out."""
    if req.block_size == 1:
        return token_keys(req.full_sequence().tolist(), size, committed)
    ids, unit, prompt = req.input_ids.tolist(), req.block_size, req.input_tokens
    keys, chain = [], 0
    whole = min(committed, prompt) // size if unit == size else 0
    for value in ids[:whole]:  # a block of one id: its one run (the loop below gives it too)
        chain = hash((chain, ((value, size),)))
        keys.append(chain)
    for i in range(whole, committed // size):
        runs: list[tuple[int, int]] = []
        pos, end = i * size, (i + 1) * size
        while pos < end:
            if pos < prompt:
                value, stop = ids[pos // unit], min(end, (pos // unit + 1) * unit, prompt)
            else:
                value, stop = REPLY_TOKEN, end
            if runs and runs[-1][0] == value:
                runs[-1] = (value, runs[-1][1] + stop - pos)
            else:
                runs.append((value, stop - pos))
            pos = stop
        chain = hash((chain, tuple(runs)))
        keys.append(chain)
    return keys


def too_small(shape: PoolShape, req: Request) -> ConfigError:
    return ConfigError(
        f"cache.size_gb: vLLM's pool of {shape.blocks} blocks cannot hold request "
        f"{req.request_id} ({req.input_tokens + req.output_len} tokens, blocks of {shape.block})"
    )


def pool_record(
    req: Request,
    model: ModelSpec,
    policy: str,
    pool: HybridPool,
    run: PoolRun,
    matched: int | None = None,
    hit: int | None = None,
) -> RequestRecord:
    """The record of ``req``'s finished ``run`` (the cache columns: the pool's now); its
    ``matched`` and ``hit`` tokens are the run's unless given (a preempted request's are
    those of its first scheduling, vLLM's ``num_cached_tokens``: a resumed one's hit may
    reach into the outputs it recomputes)."""
    shape = pool.shape
    kv_bytes, ssm_bytes = pool.cached_bytes()
    return request_record(
        policy,
        req,
        model,
        run.matched_tokens if matched is None else matched,
        run.hit_tokens if hit is None else hit,
        kv_bytes_admitted=run.kv_cached * shape.block_bytes,
        ssm_bytes_admitted=run.states_cached * shape.state_groups * shape.block_bytes,
        ckpts_admitted=run.states_cached,
        bytes_evicted=run.evicted * shape.block_bytes,
        nodes_evicted=run.evicted,
        admission_truncated=False,
        cache_kv_bytes=kv_bytes,
        cache_ssm_bytes=ssm_bytes,
    )


@dataclass
class Peaks:
    """The cached bytes' peaks over a run's records (the run's extras)."""

    kv: int = 0
    ssm: int = 0
    total: int = 0

    def note(self, record: RequestRecord) -> None:
        kv, ssm = record.cache_kv_bytes, record.cache_ssm_bytes
        self.kv, self.ssm, self.total = (
            max(self.kv, kv),
            max(self.ssm, ssm),
            max(self.total, kv + ssm),
        )

    def extras(self) -> dict[str, float]:
        return {
            "peak_kv_gb": self.kv / 1e9,
            "peak_ssm_gb": self.ssm / 1e9,
            "peak_gb": self.total / 1e9,
        }


def pool_shape(
    step: RequestStep,
    requests: Sequence[Request],
    running_bytes: float = 0.0,
    transformers: bool = False,
) -> PoolShape | None:
    """The pool when ``step`` runs through :class:`HybridPool` (None: on the prefix tree): a
    hybrid under ``policy=vllm`` in ``align`` mode, or with ``transformers`` a Transformer
    under ``policy=vllm``, with ``block_pool`` on and its own eviction (``BlockLRU``), one
    shared pool, a token trace (a Transformer's, a hash-id trace too: :func:`request_keys`).
    The pool is the cache's capacity plus ``running_bytes`` (the timed engine's shared KV
    pool)."""
    cache, admission = step.cache, step.admission
    mode = getattr(admission, "mamba_cache_mode", None)
    if not (
        _qualname(admission) == _VLLM
        and (mode == "align" if cache.hybrid else transformers)
        and getattr(admission, "block_pool", False)
        and _qualname(step.eviction) == _BLOCK_LRU
        and step.eviction.ties == "oldest"
        and cache.host is None
        and cache.ssm_capacity is None
        and not step.controllers
        and ((transformers and not cache.hybrid) or all(r.block_size == 1 for r in requests))
    ):
        return None
    per_id = requests[0].block_size if requests else 1  # a key's ids are this many tokens
    return PoolShape.of(
        cache.model, (admission.keys.block_size or 1) * per_id, cache.capacity + running_bytes
    )


def _qualname(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def step_pool(step: RequestStep, shape: PoolShape) -> tuple[HybridPool, bool]:
    """The pool of ``step``'s admission options (``policy=vllm``) and its ``committed`` keys."""
    admission = step.admission
    pool = HybridPool(
        shape,
        junction=bool(getattr(admission, "junction", True)),
        max_tokens=int(getattr(admission, "max_num_batched_tokens", 2048)),
    )
    return pool, admission.keys.committed


def pool_run(
    requests: Sequence[Request], step: RequestStep, shape: PoolShape, policy: str
) -> EngineRun:
    """:func:`pool_records` with the options of ``step``'s admission (``policy=vllm``)."""
    pool, committed = step_pool(step, shape)
    return pool_records(requests, step.cache.model, policy, pool, committed)
