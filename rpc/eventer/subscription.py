"""Subscriptions: which event types a client (or a query) selects.

``?`` matches exactly one segment, ``*`` (last position only) zero or more segments.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rpc.eventer.values import EventType


class Subscription:
    """A set of query types; :meth:`matches` tells whether an event type is in it.

    ``?`` matches exactly one segment, ``*`` (last position only) zero or more segments, so
    ``("a", "*")`` matches ``("a",)`` and ``("a", "b", "c")``; ``()`` matches only ``()``.
    The types are compiled into a trie, so a match costs one dict lookup per segment.
    """

    __slots__ = ("_root", "matches_all", "query_types")

    def __init__(self, query_types: Iterable[Sequence[str]]) -> None:
        self.query_types: tuple[EventType, ...] = tuple(dict.fromkeys(map(tuple, query_types)))
        self._root: _Node = [{}, False]
        for query_type in self.query_types:
            node = self._root
            for i, segment in enumerate(query_type):
                if segment == "*" and i != len(query_type) - 1:
                    raise ValueError(f"'*' must be the last segment of {query_type!r}")
                child = node[0].get(segment)
                if child is None:
                    child = node[0][segment] = [{}, False]
                node = child
            node[1] = True
        self.matches_all = "*" in self._root[0]

    def matches(self, event_type: Sequence[str]) -> bool:
        return _matches(self._root, event_type, 0)

    def __repr__(self) -> str:
        return f"Subscription({list(self.query_types)!r})"


_Node = list[Any]  # [children: dict[str, _Node], is_leaf: bool]


def _matches(node: _Node, event_type: Sequence[str], index: int) -> bool:
    children = node[0]
    if "*" in children:
        return True
    if index >= len(event_type):
        return node[1] is True
    child = children.get(event_type[index])
    if child is not None and _matches(child, event_type, index + 1):
        return True
    child = children.get("?")
    return child is not None and _matches(child, event_type, index + 1)


def has_wildcards(query_types: Iterable[Sequence[str]]) -> bool:
    return any("*" in t or "?" in t for t in query_types)
