"""One timer per connection, armed for the nearest of a few named deadlines.

A connection has a handful of things that must happen at a time: its requests' timeouts,
a heartbeat or a ping, a read timeout, a handshake limit. Each is a named slot holding one
``(when, callback)``; a single ``loop.call_at`` handle is armed for the earliest slot and
re-armed after it fires. Moving a slot later does not touch the timer (it fires, finds the
slot not yet due and re-arms), so per-message work never reschedules anything. Nothing
polls: an idle connection costs one timer wake-up per real deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

EARLY = 0.001
"""asyncio may fire a timer up to its clock resolution early: slots due within this many
seconds count as due, so a timer never re-arms for the same instant."""


class Deadlines:
    """Named deadlines sharing one timer. Callbacks run on the loop, one at a time."""

    __slots__ = ("_armed_at", "_handle", "_loop", "_slots")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._slots: dict[str, tuple[float, Callable[[], None]]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = float("inf")

    def set(self, name: str, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` at loop time ``when`` (replacing the slot's previous deadline)."""
        self._slots[name] = (when, callback)
        if when < self._armed_at:
            self._arm(when)

    def clear(self, name: str) -> None:
        """Forget slot ``name``; the timer fires as planned and re-arms for what is left."""
        self._slots.pop(name, None)

    def when(self, name: str) -> float | None:
        slot = self._slots.get(name)
        return None if slot is None else slot[0]

    def close(self) -> None:
        """Cancel everything (connection gone)."""
        self._slots.clear()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_at = float("inf")

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed_at = float("inf")
        now = self._loop.time() + EARLY
        due = [name for name, (when, _) in self._slots.items() if when <= now]
        for name in due:
            slot = self._slots.pop(name, None)
            if slot is not None:
                slot[1]()  # may set slots again, or close
        if self._slots and self._handle is None:
            self._arm(min(when for when, _ in self._slots.values()))
