"""Subscriptions: which event types a client (or a query) selects.

``?`` matches exactly one segment, ``*`` (last position only) zero or more segments.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rpc.eventer.values import MAX_TYPE_SEGMENTS, EventType


class Subscription:
    """A set of query types; :meth:`matches` tells whether an event type is in it.

    ``?`` matches exactly one segment, ``*`` (last position only) zero or more segments, so
    ``("a", "*")`` matches ``("a",)`` and ``("a", "b", "c")``; ``()`` matches only ``()``.
    The types are compiled into a trie, so a match costs two dict lookups per segment and
    trie branch followed (iteratively: no depth makes it fail). A query type of more than
    ``max_segments`` segments (default :data:`~rpc.eventer.values.MAX_TYPE_SEGMENTS`, 256)
    raises ValueError, as does a ``*`` that is not last.
    """

    __slots__ = ("_root", "matches_all", "query_types")

    def __init__(
        self, query_types: Iterable[Sequence[str]], *, max_segments: int = MAX_TYPE_SEGMENTS
    ) -> None:
        self.query_types: tuple[EventType, ...] = tuple(dict.fromkeys(map(tuple, query_types)))
        self._root: _Node = [{}, False]
        for query_type in self.query_types:
            if len(query_type) > max_segments:
                raise ValueError(
                    f"query type of {len(query_type)} segments (at most {max_segments})"
                )
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
        node = self._root
        for i, segment in enumerate(event_type):
            children = node[0]
            if "*" in children:
                return True
            child = children.get(segment)
            wildcard = children.get("?")
            if wildcard is None:
                if child is None:
                    return False
                node = child
            elif child is None:
                node = wildcard
            else:  # two ways on: follow both (and any further branching) level by level
                return _matches_any([child, wildcard], event_type, i + 1)
        return node[1] is True or "*" in node[0]

    def __repr__(self) -> str:
        return f"Subscription({list(self.query_types)!r})"


_Node = list[Any]  # [children: dict[str, _Node], is_leaf: bool]


def _matches_any(nodes: list[_Node], event_type: Sequence[str], start: int) -> bool:
    """Whether ``event_type[start:]`` matches from any of ``nodes``: the trie nodes its
    prefix reaches, level by level (never more than the trie's nodes at that depth)."""
    for index in range(start, len(event_type)):
        segment = event_type[index]
        reached = []
        for children, _ in nodes:
            if "*" in children:
                return True
            child = children.get(segment)
            if child is not None:
                reached.append(child)
            child = children.get("?")
            if child is not None:
                reached.append(child)
        if not reached:
            return False
        nodes = reached
    return any(leaf is True or "*" in children for children, leaf in nodes)


def has_wildcards(query_types: Iterable[Sequence[str]]) -> bool:
    return any("*" in t or "?" in t for t in query_types)
