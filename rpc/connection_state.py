"""A reconnecting client's connection state and who hears of its changes.

:class:`StateReporter` holds the latest :class:`Transition` and hands each new one to the
``on_state`` callback, to every :meth:`StateReporter.transitions` iterator (at most
:data:`TRANSITIONS_QUEUE` unread each, the oldest dropped) and to the INFO log of the
``peerwire.rpc`` logger; :meth:`StateReporter.changed` lets a waiter sleep until the next
one. Owned by :class:`~rpc.reconnect.ReconnectingPeer`; freed with it. The reporter holds
its iterators weakly: one dropped (read or not) is forgotten when it is collected, one
closed or past ``closed`` at once.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("peerwire.rpc")

TRANSITIONS_QUEUE = 64
"""Transitions kept for an iterator that is not read; past it the oldest are dropped."""


class ConnectionState(enum.Enum):
    """Where a :class:`~rpc.reconnect.ReconnectingPeer` is."""

    CONNECTING = "connecting"
    """Opening the first connection."""
    OPEN = "open"
    """Connected: requests go out at once."""
    RECONNECTING = "reconnecting"
    """The connection dropped; waiting for the next round of attempts or making it."""
    CLOSED = "closed"
    """Closed for good (``close()``, the attempt limit, or no reconnecting)."""


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of :attr:`~rpc.reconnect.ReconnectingPeer.connection_state`."""

    state: ConnectionState
    url: str
    """The URL connected to (open), about to be tried (connecting, reconnecting), or the
    last one (closed)."""
    wait: float | None = None
    """Seconds before the round of attempts starts (reconnecting only)."""
    error: str | None = None
    """Why the connection dropped (naming the URL it was to: ``url`` is the next one tried)
    or the last attempt failed (None: no failure)."""
    failures: int = 0
    """Failed attempts in a row so far."""


OnState = Callable[[Transition], Any]


class StateReporter:
    """The latest transition of one client, and its listeners."""

    def __init__(self, loop: asyncio.AbstractEventLoop, url: str, on_state: OnState | None) -> None:
        self._loop = loop
        self._on_state = on_state
        self.last = Transition(ConnectionState.CONNECTING, url)
        """The latest transition (``connecting`` until the first is emitted)."""
        self._settled: asyncio.Future[None] = loop.create_future()
        self._subscribers: weakref.WeakSet[TransitionIterator] = weakref.WeakSet()
        """Iterators that still take transitions; the caller's reference keeps each."""

    def settled(self) -> asyncio.Future[None]:
        """Resolves at the next ``open`` or ``closed`` transition (shield it: it is shared
        by every waiter): what callers waiting for a connection wake for, not each round's
        ``reconnecting`` (5,000 waiters woken per round took 64% of a core)."""
        return self._settled

    def transitions(self) -> TransitionIterator:
        """Every transition from now on; ends after ``closed`` (at once if already closed).
        An iterator not read keeps the latest :data:`TRANSITIONS_QUEUE`."""
        iterator = TransitionIterator(self._subscribers)
        if self.last.state is ConnectionState.CLOSED:
            iterator.put(self.last)
        else:
            self._subscribers.add(iterator)
        return iterator

    def emit(
        self,
        state: ConnectionState,
        url: str,
        wait: float | None = None,
        error: str | None = None,
        failures: int = 0,
    ) -> None:
        """Record a transition, log it and tell every listener."""
        transition = Transition(state, url, wait, error, failures)
        self.last = transition
        _log(transition)
        if state is ConnectionState.OPEN or state is ConnectionState.CLOSED:
            settled, self._settled = self._settled, self._loop.create_future()
            settled.set_result(None)
        for iterator in list(self._subscribers):
            iterator.put(transition)
        if self._on_state is not None:
            try:
                self._on_state(transition)
            except Exception:
                log.exception("on_state callback failed")


class TransitionIterator(AsyncIterator[Transition]):
    """What :meth:`StateReporter.transitions` returns: an async iterator of the transitions
    since it was made, the latest :data:`TRANSITIONS_QUEUE` kept while it is not read. Not
    a generator, so that one never started holds nothing once dropped: the reporter keeps
    it weakly and forgets it when it is collected, closed (:meth:`aclose`) or past
    ``closed``."""

    __slots__ = ("__weakref__", "_done", "_queue", "_subscribers")

    def __init__(self, subscribers: weakref.WeakSet[TransitionIterator]) -> None:
        self._subscribers = subscribers
        self._queue: asyncio.Queue[Transition | None] = asyncio.Queue(TRANSITIONS_QUEUE)
        self._done = False

    def put(self, transition: Transition) -> None:
        """Keep ``transition`` for the reader (the oldest dropped past the bound)."""
        queue = self._queue
        if queue.full():
            queue.get_nowait()
        queue.put_nowait(transition)

    async def __anext__(self) -> Transition:
        if self._done:
            raise StopAsyncIteration
        transition = await self._queue.get()
        if transition is None or self._done:  # closed while it waited
            raise StopAsyncIteration
        if transition.state is ConnectionState.CLOSED:
            self._end()
        return transition

    async def aclose(self) -> None:
        """Stop taking transitions; a reader waiting for one ends (StopAsyncIteration)."""
        if not self._done:
            self._end()
            if self._queue.empty():
                self._queue.put_nowait(None)  # wakes a waiting reader

    def _end(self) -> None:
        self._done = True
        self._subscribers.discard(self)


def _log(transition: Transition) -> None:
    state, url, error, failures = (
        transition.state,
        transition.url,
        transition.error,
        transition.failures,
    )
    if state is ConnectionState.RECONNECTING:
        if failures == 0:  # error: the URL that was lost, and why
            log.info(
                "connection lost: %s; reconnecting to %s in %.3f s", error, url, transition.wait
            )
        else:
            log.info(
                "reconnecting to %s in %.3f s (%d failed in a row; last: %s)",
                url,
                transition.wait,
                failures,
                error,
            )
    elif state is ConnectionState.OPEN:
        if failures:
            log.info("connected to %s (after %d failed in a row)", url, failures)
        else:
            log.info("connected to %s", url)
    elif state is ConnectionState.CLOSED:
        log.info("connection to %s closed%s", url, f" ({error})" if error else "")
    else:
        log.info("connecting to %s", url)


__all__ = [
    "TRANSITIONS_QUEUE",
    "ConnectionState",
    "StateReporter",
    "Transition",
    "TransitionIterator",
]
