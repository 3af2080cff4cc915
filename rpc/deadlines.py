"""One timer per connection, armed for the nearest of a few named deadlines.

A connection has a handful of things that must happen at a time: its requests' timeouts,
a heartbeat or a ping, a read timeout, a handshake limit. Each is a named slot holding one
``(when, callback)``; liveness slots are coarse (rounded up to a quarter second, so many
connections share a wake-up); a single ``loop.call_at`` handle is armed for the earliest slot and
re-armed after it fires. Moving a slot later does not touch the timer (it fires, finds the
slot not yet due and re-arms), so per-message work never reschedules anything. Where a slot
moves later on a rare event (a peer's heartbeat or Pong arrived), :meth:`Deadlines.rearm`
moves the timer too, so the wake-up it would have cost is saved. Nothing polls: an idle
connection costs one timer wake-up per real deadline.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

EARLY = 0.001
"""asyncio may fire a timer up to its clock resolution early: slots due within this many
seconds count as due, so a timer never re-arms for the same instant."""

BEAT_SPREAD = 0.1
"""A side that sends heartbeats or Pings on its own plans the next one after 100 to 110% of
the interval, at random (:func:`next_beat`): connections opened together do not stay in step,
and two peers that sent at the same moment draw apart."""
ANSWERER_SLACK = 0.2
"""A side that answered its peer's heartbeat or Ping plans its own after 120% of the interval,
later than any plan of the sender's, so the side that began keeps sending and the other only
answers: one wake-up per interval for the pair instead of one (or more) on each side."""
COARSE_TICK = 0.25
"""Coarse deadlines (liveness: heartbeats, Pings, read and handshake limits) are rounded up
to a multiple of this many seconds of loop time, so the timers of many connections share one
wake-up. Measured with 10,000 idle connections (bench_limits.py): a wake-up costs about as
much as the heartbeat it sends; sharing them took the server from 5.8% to 3.5% of a core."""
COARSE_FROM = 5.0
"""Deadlines nearer than this many seconds stay exact even when asked to be coarse (a quarter
second is then more than 5% of the wait)."""


def next_beat(now: float, interval: float) -> float:
    """When a side that sends on its own plan sends next (see ``BEAT_SPREAD``)."""
    return now + interval * random.uniform(1.0, 1.0 + BEAT_SPREAD)


class Deadlines:
    """Named deadlines sharing one timer. Callbacks run on the loop, one at a time."""

    __slots__ = ("_armed_at", "_handle", "_loop", "_slots", "wakeups")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._slots: dict[str, tuple[float, Callable[[], None]]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = float("inf")
        self.wakeups = 0
        """Times the timer fired (a connection's whole timer cost; tests read it)."""

    def set(
        self, name: str, when: float, callback: Callable[[], None], *, coarse: bool = False
    ) -> None:
        """Run ``callback`` at loop time ``when`` (replacing the slot's previous deadline);
        ``coarse``: up to ``COARSE_TICK`` later, to share wake-ups (see ``COARSE_FROM``)."""
        if coarse and when - self._loop.time() >= COARSE_FROM:
            when = -(-when // COARSE_TICK) * COARSE_TICK
        self._slots[name] = (when, callback)
        if when < self._armed_at:
            self._arm(when)

    def clear(self, name: str) -> None:
        """Forget slot ``name``; the timer fires as planned and re-arms for what is left."""
        self._slots.pop(name, None)

    def rearm(self) -> None:
        """Move the timer to the earliest slot if that is now later than the armed time.

        For rare events only (it cancels and re-arms a loop timer): per-message paths leave
        the timer alone and let it fire early once.
        """
        slots = self._slots
        if not slots:
            self.close()
            return
        earliest = min(when for when, _ in slots.values())
        if earliest > self._armed_at:
            self._arm(earliest)

    def now(self) -> float:
        """The loop time a slot's callback compares its own deadline with: ``EARLY`` ahead,
        as the timer reads it when it fires. A callback that re-checks against the bare loop
        time may find itself a little early, re-arm for the same instant and spin until the
        clock moves on (uvloop's moves in whole milliseconds: hundreds of wake-ups)."""
        return self._loop.time() + EARLY

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
        self.wakeups += 1
        self._handle = None
        self._armed_at = float("inf")
        now = self.now()
        due = [name for name, (when, _) in self._slots.items() if when <= now]
        for name in due:
            slot = self._slots.pop(name, None)
            if slot is not None:
                slot[1]()  # may set slots again, or close
        # a callback that set its slot again armed the timer for it: a slot due before that
        # one (not due now) must not wait for it
        if self._slots:
            earliest = min(when for when, _ in self._slots.values())
            if earliest < self._armed_at:
                self._arm(earliest)
