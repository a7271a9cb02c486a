"""A minimal radix tree over int32 id sequences, for ideal-reuse statistics (no bytes, no eviction).

It answers one question fast: how long is the longest prefix of a query that is also a prefix of
some inserted sequence? Edges hold numpy slices of the inserted arrays (views, no copies) and are
compared as byte strings; only the edge holding a mismatch is compared element-wise. Work per
query or insertion is O(length) memory compares plus O(depth) Python steps, so tens of millions
of tokens take seconds.

Invariants: children of a node start with distinct ids; every non-root edge is non-empty; the set
of prefixes represented equals the set of prefixes of the inserted sequences.
"""

from __future__ import annotations

import numpy as np

from traces.format import TOKEN_DTYPE

_ID_BYTES = np.dtype(TOKEN_DTYPE).itemsize


class _Node:
    __slots__ = ("children", "key", "tokens")

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens = tokens
        self.key = tokens.tobytes()
        self.children: dict[int, _Node] = {}


class RadixTree:
    """Prefix set of inserted sequences; see the module docstring."""

    def __init__(self) -> None:
        self.root = _Node(np.zeros(0, dtype=TOKEN_DTYPE))
        self.nodes = 0

    def match(self, seq: np.ndarray) -> int:
        """Length of the longest prefix of ``seq`` that prefixes an inserted sequence."""
        return self._walk(np.ascontiguousarray(seq, dtype=TOKEN_DTYPE))[0]

    def insert(self, seq: np.ndarray) -> int:
        """Insert ``seq``; returns its match length *before* the insertion."""
        seq = np.ascontiguousarray(seq, dtype=TOKEN_DTYPE)
        matched, node, child, offset = self._walk(seq)
        if matched == len(seq):
            return matched
        if child is not None:  # the match stops inside child's edge: split it at offset
            node = self._split(node, child, offset)
        leaf = _Node(seq[matched:])
        node.children[int(seq[matched])] = leaf
        self.nodes += 1
        return matched

    def _walk(self, seq: np.ndarray) -> tuple[int, _Node, _Node | None, int]:
        """``(matched, node, child, offset)``: the match ends at ``node``'s end, or ``offset``
        ids into ``child``'s edge (``child`` is None when it ends exactly at ``node``)."""
        query = seq.tobytes()
        n = len(seq)
        node, pos = self.root, 0
        while pos < n:
            child = node.children.get(int(seq[pos]))
            if child is None:
                return pos, node, None, 0
            length = len(child.tokens)
            end = pos + length
            if end <= n and query[_ID_BYTES * pos : _ID_BYTES * end] == child.key:
                node, pos = child, end
                continue
            span = min(length, n - pos)
            diff = np.flatnonzero(child.tokens[:span] != seq[pos : pos + span])
            offset = int(diff[0]) if diff.size else span
            return pos + offset, node, child, offset
        return pos, node, None, 0

    def _split(self, parent: _Node, child: _Node, offset: int) -> _Node:
        """Put a new node holding ``child``'s first ``offset`` ids between parent and child."""
        upper = _Node(child.tokens[:offset])
        parent.children[int(child.tokens[0])] = upper
        child.tokens = child.tokens[offset:]
        child.key = child.tokens.tobytes()
        upper.children[int(child.tokens[0])] = child
        self.nodes += 1
        return upper
