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

from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from itertools import count
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
    """A link, as the shared budget sees it: hashed by identity, and able to give room back."""

    def shed(self, need: int) -> int:
        """Give up to about ``need`` bytes back (at least one frame if any can go);
        returns the bytes let go."""
        ...


class QueueBytes:
    """Bytes of frames all of a node's links hold (queued, or kept for resending), per link,
    and their limit ``max_queued_bytes``. Owned by :class:`~rpc.group.linkset.Links`; each
    link tells it when its own frames come and go (:meth:`add`, :meth:`release`), so it
    answers which link holds the most without asking the links.

    That answer costs O(log n) amortized (n links holding): a max-heap of holdings, where
    a link whose holding changed is pushed again on the next question and entries that no
    longer match are dropped when they reach the top; the heap is rebuilt once it is more
    than twice as long as the links holding (plus 64), so stale entries cost O(1) each."""

    __slots__ = ("_changed", "_heap", "_holding", "_seq", "held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._holding: dict[Holder, int] = {}  # links holding anything, and their bytes
        self._changed: set[Holder] = set()  # not pushed since their holding changed
        self._heap: list[tuple[int, int, Holder]] = []  # (-bytes, tiebreak, link)
        self._seq = count()

    def holds(self, holder: Holder) -> int:
        """Bytes of ``holder``'s frames counted in the budget."""
        return self._holding.get(holder, 0)

    def add(self, holder: Holder, size: int) -> None:
        """``holder`` queued or kept ``size`` more bytes (already found room for)."""
        if not size:
            return
        self.held += size
        self._holding[holder] = self._holding.get(holder, 0) + size
        self._changed.add(holder)

    def release(self, holder: Holder, size: int) -> None:
        """``holder`` let go of ``size`` bytes of its frames."""
        if not size:
            return
        self.held -= size
        left = self._holding.get(holder, 0) - size
        if left > 0:
            self._holding[holder] = left
            self._changed.add(holder)
        else:  # holds nothing: forgotten (its heap entries are stale)
            self._holding.pop(holder, None)
            self._changed.discard(holder)

    def room_for(self, size: int) -> bool:
        """Room for ``size`` more bytes (with nothing held, a frame of any size fits)."""
        return not self.held or self.held + size <= self.limit

    def make_room(self, size: int, taker: Holder) -> bool:
        """Room for ``size`` more bytes for ``taker``, taken if need be from the link that
        holds the most, as long as it holds more than ``taker`` would with them (so two
        links never take turns). Every link keeps up to its fair share of the budget: a
        link that keeps up holds little, and gets room from those that do not read."""
        while not self.room_for(size):
            most = self._most()
            if most is None or most is taker:
                return False  # no other link holds more than taker
            if self._holding[most] <= self.holds(taker) + size:
                return False
            if not most.shed(self.held + size - self.limit):
                return False
        return True

    def _most(self) -> Holder | None:
        """The link holding the most bytes (None if none holds any)."""
        holding, heap = self._holding, self._heap
        if len(heap) + len(self._changed) > 2 * len(holding) + 64:
            heap[:] = [(-n, next(self._seq), h) for h, n in holding.items()]
            heapify(heap)
        else:
            for holder in self._changed:
                if holder in holding:
                    heappush(heap, (-holding[holder], next(self._seq), holder))
        self._changed.clear()
        while heap:
            minus, _, holder = heap[0]
            if holding.get(holder) == -minus:
                return holder
            heappop(heap)  # its holding changed since: a newer entry is in the heap
        return None
