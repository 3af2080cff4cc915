"""A reconnecting client's connection state and who hears of its changes.

:class:`StateReporter` holds the latest :class:`Transition` and hands each new one to the
``on_state`` callback, to every :meth:`StateReporter.transitions` iterator (at most
:data:`TRANSITIONS_QUEUE` unread each, the oldest dropped) and to the INFO log of the
``peerwire.rpc`` logger; :meth:`StateReporter.changed` lets a waiter sleep until the next
one. Owned by :class:`~rpc.reconnect.ReconnectingPeer`; freed with it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
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
    """Why the connection dropped or the last attempt failed (None: no failure)."""
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
        self._changed: asyncio.Future[None] = loop.create_future()
        self._subscribers: set[asyncio.Queue[Transition]] = set()

    def changed(self) -> asyncio.Future[None]:
        """Resolves at the next transition (shield it: it is shared by every waiter)."""
        return self._changed

    def transitions(self) -> AsyncIterator[Transition]:
        """Every transition from now on; ends after ``closed`` (at once if already closed).
        An iterator not read keeps the latest :data:`TRANSITIONS_QUEUE`."""
        queue: asyncio.Queue[Transition] = asyncio.Queue(TRANSITIONS_QUEUE)
        if self.last.state is ConnectionState.CLOSED:
            queue.put_nowait(self.last)
        else:
            self._subscribers.add(queue)
        return self._iterate(queue)

    async def _iterate(self, queue: asyncio.Queue[Transition]) -> AsyncIterator[Transition]:
        try:
            while True:
                transition = await queue.get()
                yield transition
                if transition.state is ConnectionState.CLOSED:
                    return
        finally:
            self._subscribers.discard(queue)

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
        changed, self._changed = self._changed, self._loop.create_future()
        changed.set_result(None)
        for queue in self._subscribers:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(transition)
        if self._on_state is not None:
            try:
                self._on_state(transition)
            except Exception:
                log.exception("on_state callback failed")


def _log(transition: Transition) -> None:
    state, url, error, failures = (
        transition.state,
        transition.url,
        transition.error,
        transition.failures,
    )
    if state is ConnectionState.RECONNECTING:
        if failures == 0:
            log.info(
                "connection to %s lost (%s); reconnecting in %.3f s", url, error, transition.wait
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


__all__ = ["TRANSITIONS_QUEUE", "ConnectionState", "StateReporter", "Transition"]
