"""Duplicate filter: which broadcasts, named by (origin, sequence number), were seen already.

Memory is bounded: one window per origin (an int bitmap of ``window`` bits, default 4096)
for at most ``max_origins`` origins (default 4096), the least recently heard from forgotten
first. A sequence number older than its origin's window is taken for a duplicate, except
in a node's join (its first broadcast of a new life, :meth:`Dedup.first` with ``restart``):
sequence numbers start at the clock, so a node restarted with its clock set back (a
reboot before NTP steps it) would otherwise be silenced until it caught up with its past.
"""

from __future__ import annotations

from collections import OrderedDict

from wire.gossip import NetID

__all__ = ["Dedup", "Window"]


class Window:
    """Sequence numbers seen from one origin: the highest, and a bitmap of those below it."""

    __slots__ = ("bits", "hi")

    def __init__(self, seq: int) -> None:
        self.hi = seq
        self.bits = 1

    def add(self, seq: int, size: int) -> bool:
        """Record ``seq``; False if seen before or too old to tell."""
        if seq > self.hi:
            shift = seq - self.hi
            self.bits = ((self.bits << shift) | 1) & ((1 << size) - 1) if shift < size else 1
            self.hi = seq
            return True
        offset = self.hi - seq
        if offset >= size:
            return False
        bit = 1 << offset
        if self.bits & bit:
            return False
        self.bits |= bit
        return True


class Dedup:
    """Bounded duplicate filter keyed by (origin, seq)."""

    __slots__ = ("_max", "_origins", "_window")

    def __init__(self, window: int, max_origins: int) -> None:
        self._window = window
        self._max = max_origins
        self._origins: OrderedDict[NetID, Window] = OrderedDict()

    def first(self, origin: NetID, seq: int, *, restart: bool = False) -> bool:
        """Record the broadcast; True if it was not seen before. With ``restart`` (a join),
        a number older than the origin's window starts a new window there."""
        win = self._origins.get(origin)
        if win is None or (restart and win.hi - seq >= self._window):
            self._origins[origin] = Window(seq)
            self._origins.move_to_end(origin)
            if len(self._origins) > self._max:
                self._origins.popitem(last=False)
            return True
        self._origins.move_to_end(origin)
        return win.add(seq, self._window)

    def __len__(self) -> int:
        """Origins tracked (at most ``max_origins``)."""
        return len(self._origins)
