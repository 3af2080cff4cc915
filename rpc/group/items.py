"""What the links hold: :class:`Item` (a frame waiting for one peer, or kept to resend it)
and :class:`QueueBytes` (the bytes all of a node's links hold, against ``max_queued_bytes``).

A frame counts its payload's bytes plus :data:`NAMED_SIZE` (64) per node named in its
chunk's rest. Frames of one broadcast share their payload, so the count is an upper bound
of what the queues keep alive.
"""

from __future__ import annotations

from dataclasses import dataclass

from wire.gossip import NetID

__all__ = ["NAMED_SIZE", "Item", "QueueBytes"]

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


class QueueBytes:
    """Bytes of frames all of a node's links hold (queued, or kept for resending), and their
    limit ``max_queued_bytes``. Owned by :class:`~rpc.group.links.Links`; each link adds and
    removes its own frames."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def room_for(self, size: int) -> bool:
        """Room for ``size`` more bytes (with nothing held, a frame of any size fits)."""
        return not self.held or self.held + size <= self.limit
