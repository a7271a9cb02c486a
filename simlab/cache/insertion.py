"""Admitting a sequence into the prefix cache: plan, make room, add (simlab's rules and the
Marconi reference code's).

:func:`insert` is :meth:`simlab.cache.prefix.PrefixCache.insert` without its policy hooks: it
makes room for the running request's allocation, walks the tree, plans what to admit
(:func:`simlab.cache.nodes.plan_admission`), evicts until the plan fits (the matched path
pinned), truncates a plan that cannot fit and adds it to the tree. :func:`insert_reference`
is the Marconi reference code's insertion (``Semantics.reference_insert``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache import evictor
from simlab.cache import host_tier as tiers
from simlab.cache.match import walk
from simlab.cache.nodes import InsertPlan, InsertResult, Node, plan_admission, plan_bytes, truncate

if TYPE_CHECKING:
    from simlab.cache.contract import EvictionPolicy
    from simlab.cache.prefix import PrefixCache


def insert(
    cache: PrefixCache,
    seq: np.ndarray,
    ckpts: Sequence[int],
    end: int,
    policy: EvictionPolicy,
    cuts: Sequence[int],
    held_from: int | None,
    stateless_kv: bool,
    branch_at_insert: bool,
    short: int,
    running_states: int,
    spare: int,
) -> InsertResult:
    """simlab's admission of ``seq[:end]`` (the arguments of
    :meth:`simlab.cache.prefix.PrefixCache.insert`)."""
    n = int(seq.shape[0])
    end = min(int(end), n)
    if cache.semantics.ticks_per_operation or policy.ticks_on_insert:
        cache.now += 1.0
    result = InsertResult()
    saved = short * cache.kv_per_unit_token  # bytes a short last id does not hold
    if held_from is not None:
        _allocate(cache, seq, held_from, saved, running_states, policy, result, spare)
    path, matched, partial = walk(cache, seq[:end])
    if cache.host is not None and not _recomputed(cache, path, matched, partial, policy):
        return InsertResult(admitted_end=matched, truncated=True)  # no GPU room for it
    if cache.host is not None:
        path, matched, partial = walk(cache, seq[:end])  # a split may have changed them
    if policy.refreshes_insert_path:
        cache.touch(path if partial is None else [*path, partial])
    wanted = _wanted(ckpts, end, matched, branch_at_insert and partial is not None)
    plan = plan_admission(cache, path, matched, wanted, end, cuts, stateless_kv)
    deepest = partial if partial is not None else (path[-1] if path else None)
    cache.pin(deepest)  # the matched path is safe from the evictions below
    try:
        need, states = _room(cache, plan, n, saved, held_from, running_states, spare)
        if states and states > cache.ssm_free:
            path, partial, deepest = _pin_matched_part(cache, path, matched, partial)
            _count(result, evictor.evict_states(cache, states, policy))
        if need > cache.free_bytes:
            if cache.semantics.ticks_per_operation:
                cache.now += 1.0
            path, partial, deepest = _pin_matched_part(cache, path, matched, partial)
            _count(result, cache.evict(need, policy))
        lacking = need > cache.free_bytes or (states and states > cache.ssm_free)
        if lacking and not _fits(cache, plan, _tail_bytes(plan, n, saved)):
            split = None if cache.ssm_capacity is None else cache.ssm_free
            plan = truncate(cache, plan, cache.free_bytes, split)  # whole ids: not the tail
            result.truncated = True
        _apply(cache, plan, path, partial, seq, result, short if plan.end == n else 0)
        if wanted and cache.ssm_capacity is not None:
            _reuse_state(cache, seq, plan, wanted[-1])
    finally:
        cache.unpin(deepest)
    cache.note_peaks()
    return result


def _count(result: InsertResult, evicted: tuple[int, int]) -> None:
    """Add an eviction's (bytes freed, nodes evicted) to ``result``."""
    result.evicted_bytes += evicted[0]
    result.evicted_nodes += evicted[1]


def _room(
    cache: PrefixCache,
    plan: InsertPlan,
    n: int,
    saved: int,
    held_from: int | None,
    running_states: int,
    spare: int = 0,
) -> tuple[float, int]:
    """(bytes of the free budget, bytes of the separate SSM pool; 0 without one) that
    ``plan`` needs free, for a sequence of ``n`` ids (see :func:`insert`)."""
    need, states = plan_bytes(cache, plan) - _tail_bytes(plan, n, saved), 0
    if cache.ssm_capacity is not None:  # states come from their own pool
        states = (len(plan.old_ckpts) + len(plan.new_ckpts)) * cache.ckpt_bytes
        need -= states
        if states:  # the running request keeps its own slots
            states += running_states * cache.ckpt_bytes
    if held_from is not None:  # the running request's whole allocation must fit
        held = (n - held_from + spare) * cache.kv_per_token - saved
        need = max(need, held + need - (plan.end - plan.matched) * cache.kv_per_token)
    return need, states


def _allocate(
    cache: PrefixCache,
    seq: np.ndarray,
    held_from: int,
    saved: int,
    running_states: int,
    policy: EvictionPolicy,
    result: InsertResult,
    spare: int = 0,
) -> None:
    """The running request's allocation before its insertion: it holds every id of ``seq``
    from ``held_from`` (its hit) on, ``spare`` ids more of free room, and ``running_states``
    state slots, so the cache evicts until they fit (the slots first, as SGLang's
    ``alloc_req_slots`` precedes ``alloc_token_slots``), protecting only the prefix up to
    ``held_from``. KV matched past the hit (a hybrid's prefix without a state) is not protected
    and may go (SGLang locks the request's hit node only, vLLM holds its hit blocks only); the
    insertion then walks the tree afresh."""
    held = (int(seq.shape[0]) - held_from + spare) * cache.kv_per_token - saved
    slots = running_states * cache.ckpt_bytes
    slot = slots > 0 and slots > cache.ssm_free
    if held <= cache.free_bytes and not slot:
        return
    path, matched, partial = walk(cache, seq[:held_from])
    hit = path[-1] if path else None
    if partial is not None:  # the hit ends inside an edge: pin its matched part only
        hit = cache.split(partial, matched)
    with cache.pinned(hit):
        if slot:
            _count(result, evictor.evict_states(cache, slots, policy))
        evicted = cache.evict(held, policy)
    _count(result, evicted)


def _pin_matched_part(
    cache: PrefixCache, path: list[Node], matched: int, partial: Node | None
) -> tuple[list[Node], Node | None, Node | None]:
    """Before an admission evicts, with the walk stopped inside an edge (``partial``
    pinned): split the edge at the match, so that only the matched part stays pinned and
    the rest of the edge, off the request's path, may be evicted like any leaf (SGLang
    splits the edge when it matches, ``_split_node``). Returns the new ``(path, partial,
    deepest pinned node)``; the split is the one :func:`_apply` makes anyway."""
    deepest = partial if partial is not None else (path[-1] if path else None)
    if partial is None:
        return path, None, deepest
    cache.unpin(partial)
    upper = cache.split(partial, matched)
    cache.pin(upper)
    return [*path, upper], None, upper


def _recomputed(
    cache: PrefixCache,
    path: list[Node],
    matched: int,
    partial: Node | None,
    policy: EvictionPolicy,
) -> bool:
    """Host tier: the admitted sequence's host-resident nodes (tokens the request
    recomputed past its hit) become GPU-resident without a load, a node the walk stops
    inside split there first (HiCache's ``_insert_helper``); False if the GPU cannot hold
    them (then nothing is admitted)."""
    deepest = partial if partial is not None else (path[-1] if path else None)
    if deepest is None or not cache.on_host[deepest.slot]:
        return True  # GPU residency is closed upwards: all of the path is on the GPU
    if partial is not None:
        deepest = cache.split(partial, matched)
    return tiers.recompute_path(cache, deepest, policy)


def _wanted(ckpts: Sequence[int], end: int, matched: int, branch: bool) -> list[int]:
    """The checkpoint positions to take, sorted and distinct: ``ckpts`` within ``1..end``,
    plus ``matched`` when the sequence branches off there inside an edge and ``branch``
    asks for its state."""
    extra = branch and matched > 0
    usual = not extra and ckpts and ckpts[0] > 0 and ckpts[-1] <= end
    if usual and all(map(operator.lt, ckpts, ckpts[1:])):  # sorted, distinct: as they are
        return list(ckpts)
    wanted = {c for c in ckpts if 0 < c <= end}
    if extra:
        wanted.add(matched)
    return sorted(wanted)


def _tail_bytes(plan: InsertPlan, n: int, saved: int) -> int:
    """``saved`` when ``plan`` admits the sequence's last id (of ``n``), else 0."""
    return saved if plan.end == n > plan.matched else 0


def _fits(cache: PrefixCache, plan: InsertPlan, saved: int = 0) -> bool:
    """Whether ``plan`` fits in the free bytes (``saved``: bytes its short last id lacks)."""
    kv = plan_bytes(cache, plan) - saved
    if cache.ssm_capacity is None:
        return kv <= cache.free_bytes
    states = (len(plan.old_ckpts) + len(plan.new_ckpts)) * cache.ckpt_bytes
    return kv - states <= cache.free_bytes and states <= cache.ssm_free


def _apply(
    cache: PrefixCache,
    plan: InsertPlan,
    path: list[Node],
    partial: Node | None,
    seq: np.ndarray,
    result: InsertResult,
    short: int = 0,
) -> None:
    """Add ``plan`` to the tree (``short``: tokens the last new id lacks)."""
    along = list(path) + ([partial] if partial is not None else [])
    for c in plan.old_cuts:
        _node_ending_at(cache, along, c)
    for c in plan.old_ckpts:
        node = _node_ending_at(cache, along, c)
        _set_ckpt(cache, node, result)
    result.admitted_end = max(plan.end, plan.matched)
    if plan.end <= plan.matched:
        return
    parent = _node_ending_at(cache, along, plan.matched) if plan.matched else cache.root
    last = cache.append_chain(parent, seq, plan.matched, plan.end, plan.new_ckpts, plan.new_cuts)
    if short:
        last.short = short
        cache.refresh(last)
    kv = cache.kv_per_token * (plan.end - plan.matched) - short * cache.kv_per_unit_token
    ssm = cache.ckpt_bytes * len(plan.new_ckpts)
    cache.account(kv, ssm)
    result.kv_bytes += kv
    result.ssm_bytes += ssm
    result.ckpts += len(plan.new_ckpts)


def _reuse_state(cache: PrefixCache, seq: np.ndarray, plan: InsertPlan, tail: int) -> None:
    """A separate SSM pool: an admission whose deepest state ``tail`` is cached already
    makes that state the most recently used (SGLang's ``commit_insert_component_data``
    moves an existing Mamba value to the front of the Mamba LRU; the states above it on
    the path keep their place)."""
    if tail <= plan.matched:
        path, _matched, partial = walk(cache, seq[:tail])
        if partial is None and path and path[-1].ckpt:
            cache.state_access[path[-1].slot] = cache.stamp_states(1)


def _node_ending_at(cache: PrefixCache, along: list[Node], pos: int) -> Node:
    """The node on the matched path that ends exactly at ``pos``, splitting an edge if needed."""
    for i, node in enumerate(along):
        if node.end == pos:
            return node
        if node.start < pos < node.end:
            upper = cache.split(node, pos)
            along.insert(i, upper)
            return upper
    raise AssertionError(f"position {pos} is not on the matched path")


def _set_ckpt(cache: PrefixCache, node: Node, result: InsertResult) -> None:
    if node.ckpt:
        return
    node.ckpt = True
    cache.refresh(node)
    cache.last_access[node.slot] = cache.now
    cache.state_access[node.slot] = cache.stamp_states(1)
    cache.account(0, cache.ckpt_bytes)
    result.ssm_bytes += cache.ckpt_bytes
    result.ckpts += 1


def insert_reference(
    cache: PrefixCache,
    seq: np.ndarray,
    ckpts: Sequence[int],
    end: int,
    policy: EvictionPolicy,
    branch_at_insert: bool,
) -> InsertResult:
    """The Marconi reference code's insertion (``radix_cache_hybrid.py`` ``insert``;
    :class:`simlab.cache.contract.Semantics`): the clock ticks for the insertion and for its
    speculative match, which refreshes nodes as a match does (``policy.on_hit``); the bytes
    to free are estimated as one SSM state (two when the sequence ends or diverges inside
    an edge) plus the KV past the match (vLLM+'s: ``Semantics.block_estimate``); the eviction
    (one more tick) frees that many bytes as the policy counts them
    (:func:`simlab.cache.evictor.evict_counted`); then the sequence is inserted whole, whatever
    the capacity, by a fresh walk (``_insert_helper``) that splits the edge it diverges in."""
    end = min(int(end), int(seq.shape[0]))
    tokens = seq[:end]
    if cache.semantics.ticks_per_operation:
        cache.now += 2.0
    speculative = cache.lookup(tokens)
    policy.on_hit(cache, speculative)
    block = cache.semantics.block_estimate
    if block:  # vLLM+: the root and each whole block matched count one block each
        extra = end - block * (speculative.matched // block + 1)
        need = extra * cache.kv_per_token + (extra / block) * cache.ckpt_bytes
    else:
        states = (2 if speculative.partial is not None else 1) if cache.hybrid else 0
        need = (end - speculative.matched) * cache.kv_per_token + states * cache.ckpt_bytes
    result = InsertResult()
    if need > cache.free_bytes:
        if cache.semantics.ticks_per_operation:
            cache.now += 1.0
        pin = speculative.deepest if cache.semantics.pin_insert else None
        with cache.pinned(pin):
            freed, count = evictor.evict_counted(cache, need - cache.free_bytes, policy)
        result.evicted_bytes, result.evicted_nodes = freed, count
    path, matched, partial = walk(cache, tokens)
    if policy.refreshes_insert_path:
        cache.touch(path)
    wanted = _wanted(ckpts, end, matched, branch_at_insert and partial is not None)
    _apply(cache, plan_admission(cache, path, matched, wanted, end), path, partial, seq, result)
    cache.note_peaks()
    return result
