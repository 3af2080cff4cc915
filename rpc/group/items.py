"""What the links hold: :class:`Item` (a frame waiting for one peer, or kept to resend it)
and :class:`QueueBytes` (the bytes all of a node's links hold, against ``max_queued_bytes``).

A frame counts its payload's bytes plus :data:`NAMED_SIZE` (64) per node named in its
chunk's rest. Frames of one broadcast share their payload, so the count is an upper bound
of what the queues keep alive.

The budget is shared fairly: a frame that finds it full takes room from the link holding
the most that can give some back (:meth:`QueueBytes.make_room`), so peers that never read
(which a forger can name in distribution lists, as many as it likes) cannot starve links
that keep up. Its limit: a link whose writes are paused keeps the frames of its last write
(its transport holds them) until it stalls out (``write_stall_timeout``).
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heapify, heappop, heappush, heapreplace
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
    """A link, as the shared budget sees it: its bytes in the budget, and able to give room
    back."""

    counted: int
    """Bytes of its frames counted in the budget: written by :class:`QueueBytes` alone
    (starts at 0)."""

    def shed(self, need: int) -> int:
        """Give up to about ``need`` bytes back (at least one frame if any can go);
        returns the bytes let go. One that returns 0 is not asked again until it takes
        more or tells the budget it can give again (:meth:`QueueBytes.can_give`), but for
        once after each rebuild of the budget's heap."""
        ...


class QueueBytes:
    """Bytes of frames all of a node's links hold (queued, or kept for resending), per link
    (:attr:`Holder.counted`), and their limit ``max_queued_bytes``. Owned by
    :class:`~rpc.group.linkset.Links`; each link tells it when its own frames come and go
    (:meth:`take`, :meth:`release`), so it answers which link holds the most without
    asking the links.

    That answer costs O(log n) amortized (n links holding): a max-heap of holdings, kept
    only while the budget is watched, from the first time it is found full until it is at
    most half full again (while it has room, a frame costs two counts and no heap). A link
    whose holding grew is pushed again on the next question; an entry that no longer
    matches is dropped (or, for a link that holds less, moved down) when it reaches the
    top; the heap is rebuilt once it is more than twice as long as the links holding now
    (plus 64), so stale entries cost O(1) each. A link that gave nothing back when asked
    (paused, holding only its last write) loses its entry and the next holder is asked;
    it is pushed again once it takes more or calls :meth:`can_give` (and at a rebuild,
    when it may be asked once more), so it costs O(log n) once per change, not on every
    frame. Entries name links by ``id``, and the budget keeps only links holding
    something: one that lets go of everything (it ends) is not kept alive. (A later link
    may get its ``id``: an old entry is then checked against that link's holding, and if
    they match, that link does hold the most.)"""

    __slots__ = ("_changed", "_heap", "_holding", "held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._holding: dict[int, Holder] = {}  # links holding anything, by id
        # While watched: links whose holding grew since the last question (else None),
        # and the heap, (-bytes, id(link)).
        self._changed: set[Holder] | None = None
        self._heap: list[tuple[int, int]] = []

    def take(self, size: int, taker: Holder) -> bool:
        """Count ``size`` more bytes of ``taker``'s frames, if there is room for them or
        :meth:`make_room` makes it; False (nothing counted) if not. One call, as every frame
        offered to a link comes this way."""
        held = self.held
        if held and held + size > self.limit and not self.make_room(size, taker):
            return False
        if size:
            self.held += size
            before = taker.counted
            taker.counted = before + size
            if not before:
                self._holding[id(taker)] = taker
            if self._changed is not None:
                self._changed.add(taker)
        return True

    def release(self, holder: Holder, size: int) -> None:
        """``holder`` let go of ``size`` bytes of its frames."""
        if not size:
            return
        self.held -= size
        left = holder.counted - size
        holder.counted = left
        if left <= 0:  # holds nothing: forgotten, and its heap entries stale
            self._holding.pop(id(holder), None)
            if self._changed is not None:
                self._changed.discard(holder)
        if self._changed is not None and self.held <= self.limit >> 1:
            self._unwatch()

    def can_give(self, holder: Holder) -> None:
        """``holder`` may give back what it could not when asked (its writes resumed, or
        its connection dropped): the budget asks it again. O(1); nothing while it has room."""
        if self._changed is not None and holder.counted:
            self._changed.add(holder)

    def make_room(self, size: int, taker: Holder) -> bool:
        """Room for ``size`` more bytes for ``taker``, taken if need be from the links that
        hold the most, largest first, as long as one holds more than ``taker`` would with
        them (so two links never take turns). One that gives nothing back is passed over
        (see :meth:`Holder.shed`). Every link keeps up to its fair share of the budget: a
        link that keeps up holds little, and gets room from those that do not read."""
        while self.held and self.held + size > self.limit:
            most = self._most()
            if most is None or most is taker:
                return False  # no other link that can give holds more than taker
            if most.counted <= taker.counted + size:
                return False
            if not most.shed(self.held + size - self.limit):
                # It let go of nothing, so the heap's top is still its entry: drop it,
                # and ask the next (it is pushed again when it takes more or can_give).
                heappop(self._heap)
        return True

    def _most(self) -> Holder | None:
        """The link holding the most bytes (None if none holds any); watches the budget."""
        holding, heap, changed = self._holding, self._heap, self._changed
        if changed is None or len(heap) + len(changed) > 2 * len(holding) + 64:
            heap[:] = [(-h.counted, key) for key, h in holding.items()]
            heapify(heap)
            self._changed = set()
        else:
            for holder in changed:  # each holds something (dropped when it held nothing)
                heappush(heap, (-holder.counted, id(holder)))
            changed.clear()
        # Each link holding has an entry at least as high as its holding (but those passed
        # over, until pushed again): the top one that matches its link's holding is the most.
        while heap:
            minus, key = heap[0]
            link = holding.get(key)
            if link is None:
                heappop(heap)  # its link let go of everything since
                continue
            now = link.counted
            if now == -minus:
                return link
            if now < -minus:
                heapreplace(heap, (-now, key))  # holds less since
            else:
                heappop(heap)  # holds more since: pushed again above
        return None

    def _unwatch(self) -> None:
        """At most half full: nobody asks who holds the most for a while."""
        self._changed = None
        self._heap.clear()
