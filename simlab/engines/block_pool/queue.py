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
        self.key: dict[int, Key] = {}
        self.cached: dict[Key, list[int]] = {}
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
        self.key[block] = key
        self.cached.setdefault(key, []).append(block)
        self.per_group[key[0]] = self.per_group.get(key[0], 0) + 1
        return True


class PoolFull(Exception):
    """A step needs more blocks than the free queue holds (free and cached ones together)."""
