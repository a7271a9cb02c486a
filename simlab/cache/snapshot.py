"""Cache snapshots: a :class:`~simlab.cache.prefix.PrefixCache` as plain, picklable data and back.

A :class:`CacheImage` holds the cache's attributes with every per-slot array copied and each tree
node flattened to a row whose parent/children are slot numbers. Packing is iterative (no
recursion, so no depth limit, unlike ``copy.deepcopy`` or ``pickle`` of a deep tree) and shares
the token arrays, which the cache never writes in place. Pins are cleared by default: a replay
from a snapshot has nothing in flight. ``unpack(pack(c))`` equals ``c`` node for node.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from simlab.cache.host_tier import HostTier
from simlab.cache.nodes import Node
from simlab.cache.prefix import PrefixCache

_NODE_REFS = ("parent", "children")


@dataclass
class CacheImage:
    """A :class:`PrefixCache` as plain, picklable data (see the module docstring)."""

    attrs: dict[str, Any]
    nodes: list[dict[str, Any] | None]  # per slot: Node slot values, parent/children as slots
    root: int

    @property
    def next_nid(self) -> int:
        """The id the cache's next node gets."""
        return int(self.attrs["_next_nid"])


def _copy_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, HostTier):  # its counters and heap: every copy keeps its own
        return replace(value, heap=list(value.heap))
    if isinstance(value, list | dict | set):
        return type(value)(value)
    return value


def pack(cache: PrefixCache, clear_pins: bool = True) -> CacheImage:
    """Freeze ``cache`` (O(nodes); token arrays shared, per-slot arrays copied)."""
    attrs: dict[str, Any] = {}
    for key, value in cache.fields().items():
        if isinstance(value, Node):
            raise TypeError(f"PrefixCache.{key} holds a node; teach pack() about it")
        attrs[key] = _copy_value(value)
    if clear_pins:
        attrs["pins"] = np.zeros_like(attrs["pins"])
    rows = [None if node is None else _node_row(node) for node in cache.slot_nodes()]
    return CacheImage(attrs, rows, cache.root.slot)


def _node_row(node: Node) -> dict[str, Any]:
    """A node as plain data: its fields, with parent and children as slot numbers."""
    row = {name: getattr(node, name) for name in Node.__slots__ if name not in _NODE_REFS}
    row["parent"] = None if node.parent is None else node.parent.slot
    row["children"] = {tok: child.slot for tok, child in node.children.items()}
    return row


def unpack(image: CacheImage) -> PrefixCache:
    """A live cache equal to the packed one; the image stays reusable."""
    nodes: list[Node | None] = []
    for row in image.nodes:
        if row is None:
            nodes.append(None)
            continue
        node = object.__new__(Node)
        for name, value in row.items():
            if name not in _NODE_REFS:
                setattr(node, name, value)
        nodes.append(node)
    live = cast("list[Node]", nodes)  # rows of live nodes refer to live slots only
    for maybe, row in zip(nodes, image.nodes, strict=True):
        if maybe is None or row is None:
            continue
        parent = row["parent"]
        maybe.parent = None if parent is None else live[parent]
        maybe.children = {tok: live[slot] for tok, slot in row["children"].items()}
    fields = {key: _copy_value(value) for key, value in image.attrs.items()}
    return PrefixCache.restore(fields, nodes, image.root)
