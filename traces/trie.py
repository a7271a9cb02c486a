"""The static prefix trie of a request set: :class:`BatchTrie` and its helpers.

A :class:`BatchTrie` is the compact prefix tree of a fixed list of token sequences, built from a
lexicographic sort and the longest common prefixes of sorted neighbours (array comparisons only).
It is shared by the clairvoyant bound (:mod:`policies.clairvoyant`, for the future of a trace) and
the BatchLLM planner (:mod:`simlab.engines.batchllm`, for the groups of an offline batch).

Invariants: node 0 is the root (depth 0); every node's sequences form one contiguous range
``order[lo:hi]`` of the sorted order, and they are exactly the sequences that contain the node's
path; the first ``n_term`` of that range end at the node; every sequence ends at exactly one node
(``sum(n_term) == len(seqs)``). The trie is never modified after construction.

This module imports nothing from ``simlab`` or ``policies``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

INF = float("inf")


def as_inputs(requests: Sequence[Any]) -> list[np.ndarray]:
    """Prompt token arrays of a batch: ``Request``-like objects (``input_ids``) or arrays."""
    return [np.asarray(getattr(r, "input_ids", r)) for r in requests]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays (numpy comparison)."""
    n = min(int(a.shape[0]), int(b.shape[0]))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def lexicographic_order(seqs: Sequence[np.ndarray]) -> np.ndarray:
    """Positions sorted by token sequence; a sequence sorts before those it is a prefix of.

    Fixed-width big-endian bytes compare like the token sequences (byte prefixes are token
    prefixes), so Python's C-level bytes comparison does the sort.
    """
    keys = [_big_endian(np.asarray(s)).tobytes() for s in seqs]
    return np.array(sorted(range(len(seqs)), key=keys.__getitem__), dtype=np.int64)


def _big_endian(seq: np.ndarray) -> np.ndarray:
    return seq.astype(seq.dtype.newbyteorder(">"), copy=False)


# --------------------------------------------------------------------------- static trie
class BatchTrie:
    """Compact prefix tree of a fixed list of sequences (node 0 is the root).

    Node ``x`` covers depths ``(start[x], end[x]]``; its sequences are ``order[lo[x]:hi[x]]``, of
    which the first ``n_term[x]`` end exactly at ``end[x]``. A *location* ``(x, d)`` with
    ``start[x] < d <= end[x]`` (or ``(0, 0)``) is a position in the tree.
    """

    def __init__(self, seqs: Sequence[np.ndarray]):
        self.seqs = [np.asarray(s) for s in seqs]
        self.lengths = np.array([s.shape[0] for s in self.seqs], dtype=np.int64)
        self.order = lexicographic_order(self.seqs)
        self.rank = np.empty_like(self.order)
        self.rank[self.order] = np.arange(self.order.shape[0])
        self.lcp = self._neighbour_lcp()
        self.start: list[int] = []
        self.end: list[int] = []
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.n_term: list[int] = []
        self.parent: list[int] = []
        self.children: list[dict[int, int]] = []
        self._build()
        self._sorted_ids: dict[tuple[int, int], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.end)

    def _neighbour_lcp(self) -> np.ndarray:
        lcp = np.zeros(len(self.seqs), dtype=np.int64)
        for i in range(1, len(self.seqs)):
            lcp[i] = common_prefix(self.seqs[self.order[i - 1]], self.seqs[self.order[i]])
        return lcp

    def _new(self, depth: int, lo: int) -> int:
        self.start.append(0)
        self.end.append(depth)
        self.lo.append(lo)
        self.hi.append(lo)
        self.n_term.append(0)
        self.parent.append(-1)
        self.children.append({})
        return len(self.end) - 1

    def _link(self, parent: int, child: int) -> None:
        self.start[child] = self.end[parent]
        self.parent[child] = parent
        token = int(self.seqs[self.order[self.lo[child]]][self.end[parent]])
        self.children[parent][token] = child

    def _close_above(self, depth: int, i: int, stack: list[int]) -> None:
        """Close the nodes deeper than ``depth`` (their range ends at ``i``)."""
        while self.end[stack[-1]] > depth:
            last = stack.pop()
            self.hi[last] = i
            if self.end[stack[-1]] >= depth:
                self._link(stack[-1], last)
            else:
                mid = self._new(depth, self.lo[last])
                self._link(mid, last)
                stack.append(mid)

    def _build(self) -> None:
        """Stack construction over the sorted sequences and their neighbour LCPs."""
        n = len(self.seqs)
        root = self._new(0, 0)
        stack = [root]
        for i in range(n):
            self._close_above(int(self.lcp[i]) if i else 0, i, stack)
            length = int(self.lengths[self.order[i]])
            if length > self.end[stack[-1]]:
                node = self._new(length, i)
                self.n_term[node] = 1
                stack.append(node)
            else:
                self.n_term[stack[-1]] += 1
        self._close_above(0, n, stack)
        self.hi[root] = n

    # ------------------------------------------------------------------ queries
    def edge(self, node: int) -> np.ndarray:
        """Tokens of the edge into ``node``."""
        return self.seqs[self.order[self.lo[node]]][self.start[node] : self.end[node]]

    def walk(self, node: int, depth: int, tokens: np.ndarray) -> tuple[int, int] | None:
        """Location reached from ``(node, depth)`` by following ``tokens``; None if it leaves
        the tree (no sequence of the batch continues that way)."""
        pos, n = 0, int(tokens.shape[0])
        while pos < n:
            if depth == self.end[node]:
                child = self.children[node].get(int(tokens[pos]))
                if child is None:
                    return None
                node = child
            take = min(self.end[node] - depth, n - pos)
            seq = self.seqs[self.order[self.lo[node]]]
            if take == 1:  # one token (a block id on hash-id traces): no array call
                if seq[depth] != tokens[pos]:
                    return None
            elif not np.array_equal(seq[depth : depth + take], tokens[pos : pos + take]):
                return None
            depth += take
            pos += take
        return node, depth

    def passing(self, node: int, depth: int) -> tuple[int, int]:
        """Sorted-order range of the sequences that contain the location's path *and at least
        one more token* (length > depth)."""
        lo = self.lo[node]
        if depth == self.end[node]:
            lo += self.n_term[node]
        return lo, self.hi[node]

    def next_in(self, lo: int, hi: int, t: int) -> float:
        """Smallest sequence position ``>= t`` among ``order[lo:hi]`` (inf if none)."""
        if lo >= hi:
            return INF
        ids = self._sorted_ids.get((lo, hi))
        if ids is None:
            ids = np.sort(self.order[lo:hi])
            self._sorted_ids[(lo, hi)] = ids
        i = int(np.searchsorted(ids, t))
        return float(ids[i]) if i < ids.shape[0] else INF

    def multi_level_processed(self) -> int:
        """Tokens to prefill when every shared prefix at every level is computed once."""
        return int(sum(e - s for s, e in zip(self.start, self.end, strict=True)))
