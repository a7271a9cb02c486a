"""An independent model of the Marconi reference code's cache, for differential tests.

A plain re-statement of the authors' code's documented semantics (github
``ruipeterpan/marconi``, CC BY-NC; ``../shared/notes/marconi_reference.md`` sections 1.2 and 2;
no code of it is copied) with the choices the notes leave open made explicit. With the public
fork's bugs (the descent bug only) it equals the fork's per-request hits on every fixture in
``tests/fixtures/marconi_reference`` (``tests/test_compat.py``). It shares nothing with simlab's cache: token tuples, a dict of children keyed by
first token, Python integers for bytes and FLOPs, a full depth-first walk for every eviction.

Semantics, per request (``serve``):

* ``match_prefix(input)``: the clock ticks; the walk follows fully matched edges and stops at
  the first mismatch, or (the descent bug) enters the partly matched node and goes on with the
  rest of the input; the hit is the length of the fully matched nodes (every node holds a
  state, so the whole input may be reused). SGLang+ (``v1``) refreshes every node the walk
  enters, Marconi (``v2``) only the deepest fully matched one.
* ``insert(input + output)``: the clock ticks, then its speculative ``match_prefix`` (tick,
  refresh as above); bytes needed = one state, two if the match ends inside an edge, plus the
  KV past the match; if the tree would exceed the capacity, ``evict`` (tick) frees that
  excess as it counts bytes; then the sequence is inserted whatever the capacity: a split
  where it diverges inside an edge (the upper half is a new node with a state), a new leaf for
  the rest. ``v1``'s insertion refreshes the fully matched nodes it walks.
* ``evict_v1``: the leaves in pre-order, ``heapq``-ed by access time alone (ties: whatever
  order the heap gives), popped until enough is counted; a parent left without children is
  pushed.
* ``evict_v2``: candidates are the nodes with at most one child in depth-first pre-order;
  utility = minmax(1 / (now - last_access)) + alpha * minmax(FLOPs saved / (state + KV of the
  whole path)); the first lowest goes. A leaf is deleted; a one-child node is merged into its
  child (which takes the later access time). The bugs are flags: the MLP term subtracts the
  parent's attention FLOPs (``mlp_bug``), a deleted leaf counts the last candidate's KV
  (``miscount_bug``), and the match descends as above (``descent_bug``); ``bugs`` sets all
  three.

New nodes are numbered in creation order; a split's upper half is the new node, a merge keeps
the child's number.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(eq=False)
class RefNode:
    key: tuple[int, ...]
    parent: RefNode | None
    ts: int
    nid: int
    children: dict[int, RefNode] = field(default_factory=dict)


@dataclass(frozen=True)
class HybridShape:
    """The paper's 7B hybrid (4 Attention, 24 SSM, 28 MLP layers, d 4096, state dim 128)."""

    d: int = 4096
    n: int = 128
    attn_layers: int = 4
    ssm_layers: int = 24
    mlp_layers: int = 28
    kv_per_token: int = 4 * 2 * 4096 * 2  # 65,536 B
    state_bytes: int = 26_787_840  # all 24 SSM layers

    def attn(self, length: int) -> int:
        return 8 * length * self.d**2 + 4 * length**2 * self.d

    def mlp(self, length: int) -> int:
        return 16 * length * self.d**2

    def mamba(self, length: int) -> int:
        return 12 * length * self.d**2 + 16 * length * self.d * self.n + 10 * length * self.d


class ReferenceTree:
    """The reference's radix tree for one policy (``version`` 1: SGLang+, 2: Marconi)."""

    def __init__(
        self,
        capacity: float,
        version: int,
        alpha: float = 0.0,
        bugs: bool = True,
        shape: HybridShape | None = None,
        *,
        mlp_bug: bool | None = None,
        miscount_bug: bool | None = None,
        descent_bug: bool | None = None,
    ):
        self.capacity = capacity
        self.version = version
        self.alpha = alpha
        self.mlp_bug = bugs if mlp_bug is None else mlp_bug
        self.miscount_bug = bugs if miscount_bug is None else miscount_bug
        self.descent_bug = bugs if descent_bug is None else descent_bug
        self.shape = shape or HybridShape()
        self.ts = 0
        self._nid = 0
        self.root = RefNode((), None, 0, self._next_nid())
        self.nodes = 0
        self.tokens = 0

    def _next_nid(self) -> int:
        self._nid += 1
        return self._nid

    @property
    def size(self) -> int:
        return self.nodes * self.shape.state_bytes + self.tokens * self.shape.kv_per_token

    # ------------------------------------------------------------------ requests
    def serve(self, input_ids: Sequence[int], output_ids: Sequence[int]) -> int:
        """One request: its hit (tokens), then its input + output inserted."""
        _, hit, _ = self.match_prefix(tuple(input_ids))
        self.insert(tuple(input_ids) + tuple(output_ids))
        return hit

    def match_prefix(self, key: tuple[int, ...]) -> tuple[list[RefNode], int, int]:
        """(fully matched nodes, their length, longest match length); ticks and refreshes."""
        self.ts += 1
        node, pos, accessed, entered = self.root, 0, [], []
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            common = _common(child.key, key, pos)
            pos += common
            if common < len(child.key) and not self.descent_bug:
                break
            entered.append(child)
            if common == len(child.key):
                accessed.append(child)
            node = child
        for hit in entered if self.version == 1 else accessed[-1:]:
            hit.ts = self.ts
        return accessed, sum(len(n.key) for n in accessed), pos

    def insert(self, key: tuple[int, ...]) -> None:
        self.ts += 1
        _, reusable, prefix = self.match_prefix(key)
        states = 2 if prefix > reusable else 1
        need = states * self.shape.state_bytes + (len(key) - prefix) * self.shape.kv_per_token
        if self.size + need > self.capacity:
            self.evict(self.size + need - self.capacity)
        self._insert_helper(key)

    def _insert_helper(self, key: tuple[int, ...]) -> None:
        node, pos = self.root, 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                self._add(node, key[pos:])
                return
            common = _common(child.key, key, pos)
            if common < len(child.key):
                child = self._split(child, common)
            elif self.version == 1:
                child.ts = self.ts
            node, pos = child, pos + common

    def _add(self, parent: RefNode, key: tuple[int, ...]) -> RefNode:
        node = RefNode(key, parent, self.ts, self._next_nid())
        parent.children[key[0]] = node
        self.nodes += 1
        self.tokens += len(key)
        return node

    def _split(self, child: RefNode, at: int) -> RefNode:
        parent = child.parent
        assert parent is not None
        upper = RefNode(child.key[:at], parent, self.ts, self._next_nid())
        parent.children[child.key[0]] = upper  # keeps the child's place among its siblings
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[0]] = child
        self.nodes += 1
        return upper

    # ------------------------------------------------------------------ eviction
    def evict(self, to_remove: float) -> None:
        self.ts += 1
        if self.version == 1:
            self._evict_leaves(to_remove)
            return
        counted = 0
        while counted < to_remove:
            cands = [n for n in self._preorder() if len(n.children) <= 1]
            if not cands:
                return
            victim = self._lowest_utility(cands)
            if victim.children:
                self._merge(victim)
                counted += self.shape.state_bytes
            else:
                edge = cands[-1] if self.miscount_bug else victim
                self._delete(victim)
                counted += self.shape.state_bytes + len(edge.key) * self.shape.kv_per_token

    def _evict_leaves(self, to_remove: float) -> None:
        """``evict_v1``: the leaves in pre-order, a ``heapq`` ordered by access time alone
        (``_ByTime``), popped until enough is counted; a parent left childless is pushed."""
        heap = [_ByTime(n) for n in self._preorder() if not n.children]
        heapq.heapify(heap)
        counted = 0
        while counted < to_remove and heap:
            victim = heapq.heappop(heap).node
            parent = victim.parent
            assert parent is not None
            self._delete(victim)
            counted += self.shape.state_bytes + len(victim.key) * self.shape.kv_per_token
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, _ByTime(parent))

    def _preorder(self) -> list[RefNode]:
        out: list[RefNode] = []
        stack = list(reversed(self.root.children.values()))
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children.values()))
        return out

    def _lowest_utility(self, cands: list[RefNode]) -> RefNode:
        recency = _normalise([1.0 / (self.ts - n.ts) for n in cands])
        efficiency = _normalise([self._efficiency(n) for n in cands])
        utility = [r + self.alpha * e for r, e in zip(recency, efficiency, strict=True)]
        return cands[utility.index(min(utility))]

    def _efficiency(self, node: RefNode) -> float:
        s = self.shape
        end = _depth(node)
        own = len(node.key)
        prefix = end - own
        mamba = s.ssm_layers * s.mamba(own)
        attn = s.attn_layers * (s.attn(end) - s.attn(prefix))
        parent_term = s.attn(prefix) if self.mlp_bug else s.mlp(prefix)
        mlp = s.mlp_layers * (s.mlp(end) - parent_term)
        memory = s.state_bytes + end * s.kv_per_token
        return (mamba + attn + mlp) / memory

    def _delete(self, node: RefNode) -> None:
        assert node.parent is not None
        del node.parent.children[node.key[0]]
        self.nodes -= 1
        self.tokens -= len(node.key)

    def _merge(self, node: RefNode) -> None:
        parent = node.parent
        assert parent is not None
        (child,) = node.children.values()
        child.key = node.key + child.key
        child.ts = max(child.ts, node.ts)
        child.parent = parent
        parent.children[child.key[0]] = child
        self.nodes -= 1


class _ByTime:
    """A node compared by its access time alone (equal times: the heap's own order)."""

    def __init__(self, node: RefNode):
        self.node = node

    def __lt__(self, other: _ByTime) -> bool:
        return self.node.ts < other.node.ts


def _common(edge: tuple[int, ...], key: tuple[int, ...], pos: int) -> int:
    n = 0
    for a, b in zip(edge, key[pos:], strict=False):
        if a != b:
            break
        n += 1
    return n


def _depth(node: RefNode) -> int:
    total = 0
    while node.parent is not None:
        total += len(node.key)
        node = node.parent
    return total


def _normalise(values: list[float]) -> list[float]:
    lo, hi = min(values), max(values)
    if len(values) <= 1 or hi == lo:
        return [1.0] * len(values)
    return [(v - lo) / (hi - lo) for v in values]
