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
from collections.abc import AsyncIterator
from typing import Any

from rpc.eventer.values import Event

CLOSED = object()
"""Put in the queue of an iterator that waits for events when the client closes or the
iterator is closed."""


class EventsIterator(AsyncIterator[list[Event]]):
    """One :meth:`~rpc.eventer.client.Client.events` iterator. Its queue is in
    ``iterators`` (fed by the client) from its creation, so nothing that arrives between
    the call and the first iteration is lost, until it ends, is closed (:meth:`aclose`) or
    is collected; then a delivery waiting for room in its queue is let through."""

    def __init__(
        self,
        queue: asyncio.Queue[Any],
        iterators: set[asyncio.Queue[Any]],
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


def _release(
    loop: asyncio.AbstractEventLoop, iterators: set[asyncio.Queue[Any]], queue: asyncio.Queue[Any]
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


def _unfeed(iterators: set[asyncio.Queue[Any]], queue: asyncio.Queue[Any]) -> None:
    iterators.discard(queue)
    while not queue.empty():  # wakes a delivery that waits for room in it
        queue.get_nowait()
    queue.put_nowait(CLOSED)  # and ends a reader waiting in it (the client no longer can)
