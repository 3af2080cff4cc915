"""The buffer between a blocking stream's pump on the loop and its reading threads.

:class:`rpc.blocking.BlockingStream` owns one :class:`Buffer` and one :func:`pump_results` task:
the pump takes the stream's results on the loop as they come and puts them here; reading
threads take them. Bounded in results and in bytes (:func:`result_size`), past which the
pump waits for a reader to make room.
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import threading
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any

END: Any = object()
"""What a buffer's take() returns once the stream ended."""


def result_size(item: Any) -> int:
    """The bytes a buffered result counts for: a string's or bytes' length, else the
    length of its :mod:`marshal` encoding, compact and about its encoded size (a string
    inside: its UTF-8 length and 5; a number 5 or 9; an object shared, once), made in C in
    a fifth or less of the time ``json.loads`` took to decode it (the copy is dropped at
    once). For a value marshal does not take (a subclass, such as a named tuple, or deeper
    than 2,000 levels) an estimate by walking it: a string's or bytes-like's length, 8 for
    any other value and 8 more an item of a list, tuple, set or dict."""
    cls = item.__class__
    if cls is bytes or cls is str:
        return len(item)
    with contextlib.suppress(ValueError):
        return len(marshal.dumps(item))
    total = 0
    stack = [item]
    while stack:
        value = stack.pop()
        if isinstance(value, str | bytes | bytearray):
            total += len(value)
        elif isinstance(value, dict):
            total += 8 + 16 * len(value)
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple | set | frozenset):
            total += 8 + 8 * len(value)
            stack.extend(value)
        elif isinstance(value, memoryview):
            total += value.nbytes
        else:
            total += 8
    return total


class Buffer:
    """Results on their way from the loop to the reading threads, then how the stream ended
    (StopIteration, or the error). ``limit`` results and ``byte_limit`` bytes of them
    (:func:`result_size`; the result that passes it included) at most: the pump then waits
    (:meth:`room`) until a reader's take makes room under both, which for the count is
    every take, so that the connection's stall limit counts from the readers' last take.
    ``bytes``: the bytes of the results held. The mutex is held for a few steps
    only; a reader with nothing to take waits on ``_bell``, a raw lock, unlocked when there
    may be something: its ``acquire()`` is one C call, so an interrupt (KeyboardInterrupt)
    cannot leave a lock half taken, as one in ``Condition.wait``'s Python code can.
    ``waiting``: readers waiting now."""

    def __init__(self, limit: int, byte_limit: int) -> None:
        self.limit = limit
        self.byte_limit = byte_limit
        self.waiting = 0
        self.bytes = 0
        self._items: deque[tuple[Any, int]] = deque()
        self._finished = False
        self._error: BaseException | None = None
        self._mutex = threading.Lock()
        self._bell = threading.Lock()
        self._room: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        """The pump's wait for room, and its loop (see :meth:`room`)."""
        self.pump_waits = threading.Event()
        """Set while the pump waits for room: another thread (a test) waits on it instead of
        polling. Only the pump sets and clears it, on the loop and only when it waits (not a
        reading thread: an interrupt there could leave the Event's lock held)."""

    def put(self, item: Any, size: int) -> bool:
        """Add a result of ``size`` bytes (on the loop); False once finished (closed)."""
        with self._mutex:
            if self._finished:
                return False
            self._items.append((item, size))
            self.bytes += size
            self._ring()
            return True

    def _has_room(self) -> bool:
        return len(self._items) < self.limit and self.bytes < self.byte_limit

    def room(self) -> asyncio.Future[None] | None:
        """On the loop, after a put: None while there is room; at either limit, a future
        that resolves once a reader's take made room, or the buffer finished."""
        with self._mutex:
            if self._finished or self._has_room():
                return None
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._room = (loop, waiter)
            return waiter

    def _make_room(self) -> None:
        """Under the mutex: wake the pump's wait for room (from a reading thread)."""
        room, self._room = self._room, None
        if room is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed (interpreter exit)
                room[0].call_soon_threadsafe(settle, room[1])

    def finish(self, error: BaseException | None = None, *, drop: bool = False) -> None:
        """The stream ends after the results held (``drop``: at once); the first end wins."""
        with self._mutex:
            if drop:
                self._items.clear()
                self.bytes = 0
            if not self._finished:
                self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        self._finished = True
        self._error = error
        self._ring()
        self._make_room()

    def _ring(self) -> None:
        if self._bell.locked():
            self._bell.release()

    def take(self) -> Any:
        """The next result, or ``END``; raises the error the stream ended with (once)."""
        while True:
            with self._mutex:
                if self._items:
                    item, size = self._items.popleft()
                    self.bytes -= size
                    if self._items or self._finished:
                        self._ring()  # for another reader
                    if self._room is not None and self._has_room():  # one more may come
                        self._make_room()
                    return item
                if self._finished:
                    self._ring()  # for another reader
                    error, self._error = self._error, None
                    if error is not None:
                        raise error
                    return END
                self._bell.acquire(blocking=False)  # nothing to take: quiet until a put
                self.waiting += 1
            try:
                self._bell.acquire()
            finally:
                with self._mutex:
                    self.waiting -= 1


def settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def pump_results(
    results: AsyncGenerator[Any, None], buffer: Buffer, first: asyncio.Future[None]
) -> None:
    """Move the results into ``buffer`` as they come (the core's queue of the stream stays
    short: this task waits on it from the start); at either of the buffer's limits, wait
    until a reader's take makes room. Until they end, the buffer is finished (closed) or this task
    is cancelled; then close them: a stream that still runs stops, and a peerwire server
    cancels its handler. ``first`` is settled by the first result or the end (an error
    before any result is set on it, to raise from ``stream()``)."""
    try:
        async for item in results:
            kept = buffer.put(item, result_size(item))
            if not first.done():
                first.set_result(None)
            if not kept:
                break
            room = buffer.room()
            if room is not None:
                buffer.pump_waits.set()
                try:
                    await room
                finally:
                    buffer.pump_waits.clear()
    except Exception as error:
        if first.done():
            buffer.finish(error)
        else:
            first.set_exception(error)
    finally:
        buffer.finish()  # no-op unless it ended, or this was cancelled: waiting readers wake
        if not first.done():
            first.set_result(None)
        await results.aclose()
