"""The Eventer client's :meth:`~rpc.eventer.client.Client.events` iterators.

The client feeds every iterator's queue in delivery order (a full one holds delivery up);
an iterator must therefore stop being fed as soon as nobody can read it, including one
that was dropped without ever being started (an async generator's ``finally`` would never
run for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from rpc.eventer.values import Event

CLOSED = object()
"""Put in the queue of an iterator that waits for events when the client closes or the
iterator is closed."""


class EventsQueue:
    """One iterator's queue of event lists, filled by the client's delivery task alone and
    bounded in lists (``max_count``, ``events_queue_size``: 1,024 by default) and in bytes as
    received (``max_bytes``, ``events_queue_bytes``: 16 MiB), sized where they are received
    (the deliveries' size of each notification). :meth:`put` waits until the list fits both
    (so delivery, then the connection, waits for the reader); one larger than ``max_bytes``
    goes into an empty queue alone."""

    __slots__ = (
        "_items",
        "_max_bytes",
        "_max_count",
        "_readable",
        "_room",
        "_unfed",
        "queued_bytes",
    )

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self._items: deque[tuple[Any, int]] = deque()
        self._max_count = max_count
        self._max_bytes = max_bytes
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._unfed = False
        self.queued_bytes = 0
        """Bytes (as received) of the lists queued."""

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def _fits(self, size: int) -> bool:
        items = self._items
        return not items or (
            len(items) < self._max_count and self.queued_bytes + size <= self._max_bytes
        )

    async def put(self, events: list[Event], size: int) -> None:
        """Queue ``events`` (``size`` bytes as received) once they fit; dropped once the
        queue is no longer fed (:meth:`unfeed`)."""
        while not self._unfed and not self._fits(size):
            self._room.clear()
            await self._room.wait()
        if not self._unfed:
            self._append(events, size)

    def _append(self, item: Any, size: int) -> None:
        self._items.append((item, size))
        self.queued_bytes += size
        self._readable.set()

    async def get(self) -> Any:
        """The next list (or :data:`CLOSED`), in the order queued."""
        while not self._items:
            self._readable.clear()
            await self._readable.wait()
        item, size = self._items.popleft()
        self.queued_bytes -= size
        self._room.set()
        return item

    def end(self) -> None:
        """Queue :data:`CLOSED` after what is queued (whatever the bounds): ends a reader."""
        self._append(CLOSED, 0)

    def unfeed(self) -> None:
        """Nobody reads it any more: drop what is queued, let a waiting :meth:`put` through
        (it then drops its list) and end a waiting reader."""
        self._unfed = True
        self._items.clear()
        self.queued_bytes = 0
        self._room.set()
        self.end()


class EventsIterator(AsyncIterator[list[Event]]):
    """One :meth:`~rpc.eventer.client.Client.events` iterator. Its queue is in
    ``iterators`` (fed by the client) from its creation, so nothing that arrives between
    the call and the first iteration is lost, until it ends, is closed (:meth:`aclose`) or
    is collected; then a delivery waiting for room in its queue is let through."""

    def __init__(
        self,
        queue: EventsQueue,
        iterators: set[EventsQueue],
        closed: asyncio.Future[None],
    ) -> None:
        self._queue = queue
        self._closed = closed
        self._ended = False
        iterators.add(queue)
        loop = asyncio.get_running_loop()
        self._release = weakref.finalize(self, _release, loop, iterators, queue)
        self._release.atexit = False

    def __aiter__(self) -> EventsIterator:
        return self

    async def __anext__(self) -> list[Event]:
        queue = self._queue
        if not self._ended:
            if not queue.empty() or not self._closed.done():
                item = await queue.get()  # no wait while events are queued
                if item is not CLOSED:
                    return item  # type: ignore[no-any-return]
            self._ended = True  # the client closed and what was queued has been taken
            self._release()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop taking events (what is queued is dropped); the iterator then ends."""
        self._ended = True
        self._release()

    @property
    def queued_bytes(self) -> int:
        """Bytes (as received) of the lists queued for this iterator and not yet taken: at
        most ``events_queue_bytes``, or one list larger than that."""
        return self._queue.queued_bytes


def _release(
    loop: asyncio.AbstractEventLoop, iterators: set[EventsQueue], queue: EventsQueue
) -> None:
    """Stop feeding ``queue``, on the client's loop (a collection may run on any thread)."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        _unfeed(iterators, queue)
    elif not loop.is_closed():
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(_unfeed, iterators, queue)


def _unfeed(iterators: set[EventsQueue], queue: EventsQueue) -> None:
    iterators.discard(queue)
    queue.unfeed()  # wakes a delivery waiting for room, ends a reader waiting for events
