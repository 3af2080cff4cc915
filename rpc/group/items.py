"""What the links hold: :class:`Item` (a frame waiting for one peer, or kept to resend it)
and :class:`QueueBytes` (the bytes all of a node's links hold, against ``max_queued_bytes``).

A frame counts its payload's bytes plus :data:`NAMED_SIZE` (64) per node named in its
chunk's rest. Frames of one broadcast share their payload, so the count is an upper bound
of what the queues keep alive.

The budget is shared fairly: a frame that finds it full takes room from the link holding
the most (:meth:`QueueBytes.make_room`), so peers that never read (which a forger can name
in distribution lists, as many as it likes) cannot starve links that keep up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from wire.gossip import NetID

__all__ = ["NAMED_SIZE", "Holder", "Item", "QueueBytes"]

NAMED_SIZE = 64
"""Bytes a queued frame counts for each node in its chunk's rest (6 on the wire, more held)."""


@dataclass(slots=True, eq=False)
class Item:
    """A frame to build for one peer: our payload, and the rest of its chunk."""

    tag: int
    payload: bytes
    rest: tuple[NetID, ...]
    sent_at: float = 0.0
    resent: bool = False

    @property
    def size(self) -> int:
        """Bytes this frame counts for in queues: its payload, and 64 per node in ``rest``."""
        return len(self.payload) + NAMED_SIZE * len(self.rest)


class Holder(Protocol):
    """A link, as the shared budget sees it."""

    @property
    def holds(self) -> int:
        """Bytes of this link's frames counted in the budget."""
        ...

    def shed(self, need: int) -> int:
        """Give up to about ``need`` bytes back (at least one frame if any can go);
        returns the bytes let go."""
        ...


class QueueBytes:
    """Bytes of frames all of a node's links hold (queued, or kept for resending), and their
    limit ``max_queued_bytes``. Owned by :class:`~rpc.group.linkset.Links`, which names its
    links (``holders``); each link adds and removes its own frames."""

    __slots__ = ("_holders", "held", "limit")

    def __init__(self, limit: int, holders: Callable[[], Iterable[Holder]] = tuple) -> None:
        self.limit = limit
        self.held = 0
        self._holders = holders

    def room_for(self, size: int) -> bool:
        """Room for ``size`` more bytes (with nothing held, a frame of any size fits)."""
        return not self.held or self.held + size <= self.limit

    def make_room(self, size: int, taker: Holder) -> bool:
        """Room for ``size`` more bytes for ``taker``, taken if need be from the link that
        holds the most, as long as it holds more than ``taker`` would with them (so two
        links never take turns). Every link keeps up to its fair share of the budget: a
        link that keeps up holds little, and gets room from those that do not read. Costs
        a walk of the links each time the budget is full."""
        while not self.room_for(size):
            most: Holder | None = None
            for holder in self._holders():
                if holder is not taker and (most is None or holder.holds > most.holds):
                    most = holder
            if most is None or most.holds <= taker.holds + size:
                return False
            if not most.shed(self.held + size - self.limit):
                return False
        return True
