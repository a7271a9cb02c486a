"""vLLM's pool, its shape and its free queue (:mod:`simlab.engines.block_pool`)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from simlab.model.spec import ModelSpec

Key = tuple[int, int]  # (group, block hash)


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
        self.key: dict[int, Key] = {}  # a cached block's (primary) key
        self.cached: dict[Key, list[int]] = {}
        self.per_group: dict[int, int] = {}  # group -> its cached blocks
        self.evicted = 0  # cached blocks taken (their content evicted)
        #: keyed by tokens finer than the block (``prefix_match_unit``, :meth:`cache_at`): the
        #: tokens a block's primary key covers, and a block's other keys
        self.depth: dict[int, int] = {}
        self.more: dict[int, list[Key]] = {}

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
            if block in keys:
                self._unkey(block)
                self.evicted += 1
            refs[block] = 1
        return out

    def _unkey(self, block: int) -> list[Key]:
        """Drop every key of ``block`` (cached); its keys, the primary first."""
        key = self.key.pop(block)
        self.per_group[key[0]] -= 1
        dropped = [key, *self.more.pop(block, ())] if self.more else [key]
        for k in dropped:
            owners = self.cached[k]
            owners.remove(block)
            if not owners:
                del self.cached[k]
        if self.depth:
            self.depth.pop(block, None)
        return dropped

    def _add(self, block: int, key: Key, primary: bool) -> None:
        self.cached.setdefault(key, []).append(block)
        if primary:
            self.key[block] = key
            self.per_group[key[0]] = self.per_group.get(key[0], 0) + 1
        else:
            self.more.setdefault(block, []).append(key)

    def get(self, key: Key) -> int | None:
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

    def cache(self, block: int, key: Key) -> bool:
        """Give ``block`` its content's key; False when it already has one."""
        if block in self.key:
            return False
        self._add(block, key, True)
        return True

    def cache_at(self, block: int, key: Key, depth: int, replace: bool = False) -> bool:
        """Key ``block`` by ``key``, the prefix of its first ``depth`` tokens, in a pool keyed
        finer than its blocks (vLLM's ``cache_full_blocks`` and ``cache_partial_block``): a
        block keyed at fewer tokens loses those keys (``replace``: any keys), one keyed at more
        keeps them and gains this one. True when the block was not cached before."""
        fresh = block not in self.key
        if not fresh:
            if replace or self.depth[block] < depth:
                self._unkey(block)
            elif key == self.key[block] or key in self.more.get(block, ()):
                return False
            else:
                self._add(block, key, False)
                return False
        self._add(block, key, True)
        self.depth[block] = depth
        return fresh

    def move(self, src: int, dst: int) -> None:
        """``src``'s keys, now ``dst``'s (an uncached block holding a copy of its content)."""
        depth = self.depth.get(src, 0)
        keys = self._unkey(src)
        for i, key in enumerate(keys):
            self._add(dst, key, i == 0)
        self.depth[dst] = depth


class PoolFull(Exception):
    """A step needs more blocks than the free queue holds (free and cached ones together)."""
