"""Matching an input against the radix tree: the longest cached prefix, and the hit rule.

:func:`walk` finds the longest cached prefix of a sequence (the nodes matched whole, the length,
and the node the match stops inside); :func:`lookup` applies the model's hit rule to it (a
Transformer reuses any cached prefix, rounded down to whole pages; a hybrid only a prefix that
ends at a checkpoint; at least one input id, or token, is recomputed). A match changes nothing:
recency is the caller's (:meth:`simlab.cache.tree.NodeTable.touch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache import host_tier as tiers
from simlab.cache.nodes import Lookup, Node

if TYPE_CHECKING:
    from simlab.cache.prefix import PrefixCache
    from simlab.cache.tree import NodeTable

_TOKEN_BYTES = 4  # int32 token ids


def walk(tree: NodeTable, tokens: np.ndarray) -> tuple[list[Node], int, Node | None]:
    """Longest cached prefix of ``tokens``: (fully matched nodes, length, partial node).

    Whole edges are compared as byte strings; only the edge holding the mismatch is
    compared element-wise (numpy), to find where inside it the match stops. A block pool
    (one id per edge) is matched id by id on a plain list.
    """
    if tree.block_nodes:
        found = _walk_ids(tree, tokens)
        if found is not None:
            return found
    query = tokens.tobytes()
    n = int(tokens.shape[0])
    node, pos = tree.root, 0
    path: list[Node] = []
    ids = tokens.data  # a memoryview: its items are Python ints, no numpy scalar per edge
    while pos < n:
        child = node.children.get(ids[pos])
        if child is None:
            return path, pos, None
        length = child.end - child.start
        key = child.key
        if key is None:
            key = child.key = child.tokens.tobytes()
        if pos + length <= n and query[_TOKEN_BYTES * pos : _TOKEN_BYTES * (pos + length)] == key:
            path.append(child)
            pos += length
            node = child
            continue
        span = min(length, n - pos)
        diff = np.flatnonzero(child.tokens[:span] != tokens[pos : pos + span])
        pos += int(diff[0]) if diff.size else span
        return path, pos, child
    return path, pos, None


def _walk_ids(tree: NodeTable, tokens: np.ndarray) -> tuple[list[Node], int, None] | None:
    """:func:`walk` where every edge holds one id (``block_nodes``): a child found is
    matched whole. None if the walk meets a longer edge (a merge made it; then
    :func:`walk` compares edges as usual)."""
    node = tree.root
    path: list[Node] = []
    for tok in tokens.tolist():
        child = node.children.get(tok)
        if child is None:
            break
        if child.end - child.start != 1:
            return None
        path.append(child)
        node = child
    return path, len(path), None


def walk_descending(tree: NodeTable, tokens: np.ndarray, slack: int) -> Lookup:
    """The Marconi reference code's match with its descent bug
    (``Semantics.partial_descent``): after a mismatch inside an edge the walk enters that
    node and goes on with the rest of the input; the nodes it matches whole are credited
    (``hit``: their total length up to ``len(tokens) - slack``, the deepest is ``hit_node``),
    ``matched`` counts every matched token, ``partial`` is the first node matched in part, and
    ``path`` lists every node the walk entered, in order (the reference's SGLang+ refreshes
    them)."""
    n = int(tokens.shape[0])
    node, pos = tree.root, 0
    entered: list[Node] = []
    credited: list[Node] = []
    partial: Node | None = None
    while pos < n:
        child = node.children.get(int(tokens[pos]))
        if child is None:
            break
        length = child.end - child.start
        span = min(length, n - pos)
        diff = np.flatnonzero(child.tokens[:span] != tokens[pos : pos + span])
        common = int(diff[0]) if diff.size else span
        pos += common
        entered.append(child)
        if common == length:
            credited.append(child)
        elif partial is None:
            partial = child
        node = child
    limit = n - slack
    while credited and sum(c.end - c.start for c in credited) > limit:
        credited.pop()
    hit = sum(c.end - c.start for c in credited)
    return Lookup(pos, hit, credited[-1] if credited else None, entered, partial)


def lookup(cache: PrefixCache, tokens: np.ndarray, page_size: int, gpu_only: bool) -> Lookup:
    """:meth:`simlab.cache.prefix.PrefixCache.lookup`: the match of ``tokens`` and its hit."""
    if cache.semantics.partial_descent:
        return walk_descending(cache, tokens, cache.hit_slack)
    path, matched, partial = walk(cache, tokens)
    if gpu_only and cache.host is not None:
        stop = tiers.gpu_prefix(cache, path, partial)
        if stop >= 0:
            path = [n for n in path if n.end <= stop]
            matched, partial = stop, None
    limit = int(tokens.shape[0]) - cache.hit_slack
    if cache.hybrid:
        hit_node, hit = None, 0
        for node in reversed(path):
            if node.ckpt and node.end <= limit:
                hit_node, hit = node, node.end
                break
    else:
        hit = (min(matched, limit) // page_size) * page_size
        hit_node = _node_covering(path, partial, hit)
    return Lookup(matched, hit, hit_node, path, partial)


def _node_covering(path: Sequence[Node], partial: Node | None, pos: int) -> Node | None:
    """Deepest node on the match whose edge contains position ``pos`` (None for 0)."""
    if pos <= 0:
        return None
    for node in path:
        if node.end >= pos:
            return node
    return partial
