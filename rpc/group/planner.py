"""The distribution tree: who sends a broadcast to whom, as the Chatter library plans it.

A node holding a list of ``m`` nodes still to reach shuffles it and cuts it into chunks of
``ceil(m/2)``, then half of what is left, and so on down to one node. It sends the message
directly to the first node of each chunk, handing it the rest of the chunk as its
distribution list; that node splits its list the same way but in the order received, not
shuffled again: the origin's shuffle makes the tree as random, and frames the origin sends
down the same chunks then take the same paths to the end (its join, then its broadcast).
A node therefore sends at most ``bit_length(m) = ceil(log2(m + 1))`` messages, and the
tree is as deep, so in a group of ``n`` nodes no node sends more than ``ceil(log2 n)``
and everyone receives exactly once.

If a chunk's first node cannot be reached, :func:`skip_head` hands the chunk to its next
node instead, so one dead node never cuts off the rest of its chunk.

Sans-I/O: no sockets or clocks; randomness comes from an injectable :class:`random.Random`
so tests replay exact trees.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Chunk", "Planner", "fanout_bound", "skip_head", "split"]

T = TypeVar("T", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Chunk(Generic[T]):
    """One direct send: ``head`` gets the message and forwards it to ``rest``."""

    head: T
    rest: tuple[T, ...]


def fanout_bound(n: int) -> int:
    """Most direct sends any node of an ``n``-node group makes: ``ceil(log2 n)``."""
    if n < 1:
        raise ValueError("a group has at least one node")
    return math.ceil(math.log2(n)) if n > 1 else 0


def split(targets: Sequence[T]) -> list[Chunk[T]]:
    """Cut ``targets`` (in the given order) into chunks of ceil(m/2), ceil(rest/2), ..., 1."""
    chunks: list[Chunk[T]] = []
    start = 0
    end = len(targets)
    while start < end:
        size = (end - start + 1) // 2
        chunks.append(Chunk(targets[start], tuple(targets[start + 1 : start + size])))
        start += size
    return chunks


def skip_head(chunk: Chunk[T]) -> Chunk[T] | None:
    """The chunk without its unreachable head: its next node takes over (None if empty)."""
    if not chunk.rest:
        return None
    return Chunk(chunk.rest[0], chunk.rest[1:])


class Planner(Generic[T]):
    """Plans one node's direct sends; ``rng`` decides the shuffle (seed it in tests)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng if rng is not None else random.Random()

    def plan(
        self, targets: Sequence[T], *, exclude: T | None = None, shuffle: bool = True
    ) -> list[Chunk[T]]:
        """Chunks for ``targets``: duplicates and ``exclude`` (ourselves) dropped, shuffled
        unless ``shuffle`` is False (a forwarder's list, which its origin shuffled)."""
        seen: set[T] = set()
        unique: list[T] = []
        for target in targets:
            if target != exclude and target not in seen:
                seen.add(target)
                unique.append(target)
        if shuffle:
            self.rng.shuffle(unique)
        return split(unique)
