"""The radix tree's nodes and what matching and insertion return (:mod:`simlab.cache.prefix`).

A :class:`Node` holds its edge's token ids and its place in the tree; its per-node numbers
(recency, pins, bytes, FLOPs saved) live in the cache's slot-indexed arrays at ``node.slot``.
``node.short`` is the tokens its edge's last id lacks (ids of many tokens: a prompt's short last
id, :mod:`simlab.cache.keys`); it is 0 except on a leaf ending a prompt.
``node.start``/``node.end`` are the positions the edge covers, so ``node.end`` is the length of
the prefix the node represents. ``node.key`` is the edge's ids as bytes, made by the first walk
that compares the edge whole (None until then, and again after a split or merge changes the
edge): most nodes of a long chain are evicted without ever being walked.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class Node:
    """A radix-tree node; per-node numbers live in the cache's arrays at ``slot``."""

    __slots__ = (
        "children",
        "ckpt",
        "end",
        "key",
        "nid",
        "parent",
        "short",
        "slot",
        "start",
        "tokens",
    )

    def __init__(
        self,
        tokens: np.ndarray,
        parent: Node | None,
        start: int,
        end: int,
        slot: int,
        nid: int,
        ckpt: bool = False,
    ):
        """``end``: ``start + len(tokens)`` (the caller knows it)."""
        self.tokens = tokens
        self.key: bytes | None = None  # tokens.tobytes(), made when first compared
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.start = start
        self.end = end
        self.ckpt = ckpt
        self.slot = slot
        self.nid = nid
        self.short = 0  # tokens its last id lacks: a hash-id prompt's short last id (a leaf)

    def __repr__(self) -> str:
        return f"Node(nid={self.nid}, [{self.start},{self.end}), ckpt={self.ckpt})"


@dataclass(slots=True)
class Lookup:
    """Result of matching an input against the tree.

    ``matched`` is the longest cached prefix (may end inside ``partial``'s edge); ``hit`` the
    reusable prefix under the model's hit rule; ``hit_node`` the deepest node whose state is
    reused (None when ``hit == 0``); ``path`` the fully matched nodes, root excluded;
    ``split``: the lower half of the node the match split where it stopped (SGLang's
    ``_split_node``, :meth:`simlab.cache.prefix.PrefixCache.split_match`), None when it split none.
    """

    matched: int
    hit: int
    hit_node: Node | None
    path: list[Node]
    partial: Node | None
    split: Node | None = None

    @property
    def deepest(self) -> Node | None:
        """Deepest node touched by the match (the partially matched one if any)."""
        if self.partial is not None:
            return self.partial
        return self.path[-1] if self.path else None

    def branch_point(self) -> int | None:
        """Position where inserting the matched sequence would create an intermediate node."""
        if self.partial is not None:
            return self.matched
        if self.path and self.path[-1].children and not self.path[-1].ckpt:
            return self.matched
        return None


@dataclass(slots=True)
class InsertResult:
    """What an insertion admitted and what it cost."""

    kv_bytes: int = 0
    ssm_bytes: int = 0
    ckpts: int = 0
    admitted_end: int = 0
    truncated: bool = False
    evicted_bytes: int = 0
    evicted_nodes: int = 0


@dataclass(slots=True)
class InsertPlan:
    """Checkpoints and state-less node boundaries (cuts) to add on the existing path
    (``old``) and on the new tail to append (``new``)."""

    matched: int
    end: int
    old_ckpts: list[int] = field(default_factory=list)
    new_ckpts: list[int] = field(default_factory=list)
    old_cuts: list[int] = field(default_factory=list)
    new_cuts: list[int] = field(default_factory=list)
    stateless_kv: bool = False  # hybrid: KV past the last checkpoint is admitted too


class TreeShape(Protocol):
    """What planning an insertion reads of the cache."""

    hybrid: bool
    page_size: int
    kv_per_token: int
    ckpt_bytes: int


def plan_admission(
    cache: TreeShape,
    path: list[Node],
    matched: int,
    ckpts: list[int],
    end: int,
    cuts: Sequence[int] = (),
    stateless_kv: bool = False,
) -> InsertPlan:
    """Split the wanted checkpoints (``ckpts``: sorted, distinct) and cuts into those on cached
    tokens and those on the new tail (cuts past the admitted end are dropped). For a hybrid,
    KV past the last checkpoint is useless for hits and is not admitted, unless
    ``stateless_kv``."""
    plan = InsertPlan(matched=matched, end=end, stateless_kv=stateless_kv)
    if not cache.hybrid:
        if cache.page_size > 1:
            plan.end = max(matched, (end // cache.page_size) * cache.page_size)
    else:
        present = {n.end for n in path if n.ckpt}
        cached = bisect.bisect_right(ckpts, matched)
        plan.old_ckpts = [c for c in ckpts[:cached] if c not in present]
        plan.new_ckpts = list(ckpts[cached:])
        if not stateless_kv:
            plan.end = plan.new_ckpts[-1] if plan.new_ckpts else matched
    if cuts:
        bounds = {n.end for n in path}
        plan.old_cuts = sorted({c for c in cuts if 0 < c <= matched and c not in bounds})
        plan.new_cuts = sorted({c for c in cuts if matched < c < plan.end})
    return plan


def plan_bytes(cache: TreeShape, plan: InsertPlan) -> int:
    n_ckpt = len(plan.old_ckpts) + len(plan.new_ckpts)
    return max(0, plan.end - plan.matched) * cache.kv_per_token + n_ckpt * cache.ckpt_bytes


@dataclass(slots=True)
class _KVOnly:
    """A tree shape whose states cost nothing (they come from a pool of their own)."""

    hybrid: bool
    page_size: int
    kv_per_token: int
    ckpt_bytes: int = 0


def truncate(
    cache: TreeShape, plan: InsertPlan, budget: float, ssm_budget: float | None = None
) -> InsertPlan:
    """Longest prefix of the plan whose bytes fit in ``budget``; with ``ssm_budget`` (states in a
    pool of their own) the states that fit in it first, then the KV that fits in ``budget``."""
    if ssm_budget is not None:
        plan = _states_within(cache, plan, ssm_budget)
        cache = _KVOnly(cache.hybrid, cache.page_size, cache.kv_per_token)
    old = []
    for c in plan.old_ckpts:
        if budget < cache.ckpt_bytes:
            break
        budget -= cache.ckpt_bytes
        old.append(c)
    cut = InsertPlan(matched=plan.matched, end=plan.matched, old_ckpts=old)
    cut.old_cuts = plan.old_cuts
    if not cache.hybrid:
        fit = int(budget // cache.kv_per_token) if cache.kv_per_token else plan.end
        cut.end = min(plan.end, plan.matched + (fit // cache.page_size) * cache.page_size)
    else:
        cut = _fit_new_ckpts(cache, plan, cut, budget)
        if plan.stateless_kv and cut.new_ckpts == plan.new_ckpts:  # then KV while it fits
            left = budget - plan_bytes(cache, cut) + len(old) * cache.ckpt_bytes
            fit = int(left // cache.kv_per_token) if cache.kv_per_token else plan.end
            cut.end = min(plan.end, max(cut.end, plan.matched) + max(0, fit))
    cut.new_cuts = [c for c in plan.new_cuts if c < cut.end]
    return cut


def _states_within(cache: TreeShape, plan: InsertPlan, ssm_budget: float) -> InsertPlan:
    """The plan's first checkpoints that fit in ``ssm_budget`` (its KV cut after the last kept
    one, unless ``stateless_kv``)."""
    n = int(ssm_budget // cache.ckpt_bytes) if cache.ckpt_bytes else len(plan.new_ckpts)
    old = plan.old_ckpts[:n]
    new = plan.new_ckpts[: max(0, n - len(old))]
    end = plan.end
    if cache.hybrid and not plan.stateless_kv:
        end = new[-1] if new else plan.matched
    return InsertPlan(
        plan.matched,
        end,
        old,
        new,
        plan.old_cuts,
        [c for c in plan.new_cuts if c < end],
        plan.stateless_kv,
    )


def _fit_new_ckpts(
    cache: TreeShape, plan: InsertPlan, cut: InsertPlan, budget: float
) -> InsertPlan:
    """Hybrid: extend ``cut`` checkpoint by checkpoint (KV up to it plus its state) while the
    bytes fit in ``budget``."""
    prev = plan.matched
    for c in plan.new_ckpts:
        cost = (c - prev) * cache.kv_per_token + cache.ckpt_bytes
        if cost > budget:
            break
        budget -= cost
        cut.new_ckpts.append(c)
        cut.end = prev = c
    return cut
