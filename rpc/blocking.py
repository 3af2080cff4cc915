"""A blocking facade over the async core, for scripts and threads.

    with rpc.blocking.connect("tcp+gotalk://127.0.0.1:1234") as peer:
        print(peer.request("greet", {"name": "Ada"}))

One event loop runs in a daemon thread shared by every blocking peer of the process; calls
from any thread are handed to it with ``run_coroutine_threadsafe`` and wait for the result.
The loop is :func:`rpc.loops.new_event_loop`'s: uvloop when installed, or as
``PEERWIRE_LOOP`` says. A caller interrupted while it waits (KeyboardInterrupt) cancels
its call on the loop: nothing it started goes on in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import threading
from collections import deque
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Sequence,
)
from types import TracebackType
from typing import Any, TypeVar, cast

from rpc import loops
from rpc.api import connect as async_connect
from rpc.errors import ConnectionClosed
from rpc.peer import Peer
from rpc.reconnect import ConnectionState, ReconnectingPeer
from rpc.streaming import legacy_stream_args

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            loop = loops.new_event_loop()
            threading.Thread(target=loop.run_forever, name="peerwire-loop", daemon=True).start()
            _loop = loop
        return _loop


def _run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    loop = _background_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("blocking peerwire call from inside its own event loop")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except BaseException:
        future.cancel()  # interrupted (KeyboardInterrupt, timeout): the call stops too
        raise


async def _on_loop(call: Callable[[], Awaitable[T]]) -> T:
    """Make ``call`` on the loop's thread, where the client's state may be read."""
    return await call()


_END: Any = object()
"""What a buffer's take() returns once the stream ended."""


MAX_BUFFERED = 65_536
"""Default ``max_buffered`` of :meth:`BlockingPeer.stream`: results a stream holds for its
reading thread; past it the stream takes one more from the connection each time a reader
takes one (the connection's own queue then fills, and it stops reading: see
:mod:`rpc.stream_hold`)."""

MAX_BUFFERED_BYTES = 16 * 1024 * 1024
"""Default ``max_buffered_bytes`` of a :class:`BlockingStream` made directly (16 MiB, the
default ``max_size``); :meth:`BlockingPeer.stream` takes its connection's ``max_size``."""


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


_stopping: set[asyncio.Task[None]] = set()
"""Pumps cancelled by a close that does not wait (held until done: the loop keeps only weak
references to tasks)."""


def _cancel_soon(pump: asyncio.Task[None]) -> None:
    """Cancel ``pump`` on the loop without waiting (from any thread, a finalizer too)."""

    def cancel() -> None:
        pump.cancel()
        _stopping.add(pump)
        pump.add_done_callback(_stopping.discard)

    with contextlib.suppress(RuntimeError):  # the loop is closed (interpreter exit)
        _background_loop().call_soon_threadsafe(cancel)


async def _stopped(pump: asyncio.Task[None]) -> None:
    """Wait until ``pump`` is done: its stream closed (cancelled pumps close theirs)."""
    await asyncio.wait([pump])


class _Buffer:
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
                room[0].call_soon_threadsafe(_settle, room[1])

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
        """The next result, or ``_END``; raises the error the stream ended with (once)."""
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
                    return _END
                self._bell.acquire(blocking=False)  # nothing to take: quiet until a put
                self.waiting += 1
            try:
                self._bell.acquire()
            finally:
                with self._mutex:
                    self.waiting -= 1


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _pump(
    results: AsyncGenerator[Any, None], buffer: _Buffer, first: asyncio.Future[None]
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


class BlockingStream(Iterator[Any]):
    """The results of :meth:`BlockingPeer.stream`. A task on the loop (the pump) takes them
    from the connection as they come and buffers them for the reading thread, up to
    ``max_buffered`` results (default :data:`MAX_BUFFERED`) and ``max_buffered_bytes``
    bytes of them (:func:`result_size`; default :data:`MAX_BUFFERED_BYTES`, the result that
    passes it included); past either the pump waits, so a reader slower than the server
    slows the server down (see :mod:`rpc.stream_hold`) and gets every result. One that
    takes none for the stream's ``item_timeout`` while the connection waits for it gets
    StreamOverflow (the server is told, as on a cancel) after the results before it, as it
    gets an error the stream ends with. Past the bytes, the pump waits until the reader's
    takes bring the buffer back under them (one take, for results of one size): a reader
    that takes small results ahead of a large one for ``item_timeout`` without doing so
    gets StreamOverflow too.

    Closing it (:meth:`close`, the end of a ``with`` block, dropping it, or an interrupt
    such as KeyboardInterrupt in ``next()``) stops the pump and the stream, which tells a
    peerwire peer to cancel its handler; breaking out of a ``for`` over it does so once it
    is no longer referenced. Several threads may read it (each result goes to one); any
    may close it, which ends the ``next()`` calls that wait with StopIteration.
    """

    def __init__(
        self, max_buffered: int = MAX_BUFFERED, max_buffered_bytes: int = MAX_BUFFERED_BYTES
    ) -> None:
        if max_buffered < 1:
            raise ValueError("max_buffered must be at least 1")
        if max_buffered_bytes < 1:
            raise ValueError("max_buffered_bytes must be at least 1")
        self._buffer = _Buffer(max_buffered, max_buffered_bytes)
        self._pump: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # one _stop() takes the pump to cancel it

    async def _begin(self, results: AsyncGenerator[Any, None]) -> None:
        """On the loop: start the pump and wait for the first result or the end; an error
        before any result raises here, and an interrupted ``stream()`` (this cancelled)
        stops the pump."""
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._pump = asyncio.ensure_future(_pump(results, self._buffer, first))
        try:
            await first
        except BaseException:
            self._stop()
            raise

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the results buffered now (:func:`result_size`)."""
        return self._buffer.bytes

    @property
    def waiting(self) -> int:
        """``next()`` calls waiting for a result now (a test interrupts one of them)."""
        return self._buffer.waiting

    def __iter__(self) -> BlockingStream:
        return self

    def __next__(self) -> Any:
        try:
            item = self._buffer.take()
            if item is _END:
                raise StopIteration
            return item
        except BaseException:  # its end, its error, or an interrupt: the stream stops
            self._stop()
            raise

    def _stop(self) -> asyncio.Task[None] | None:
        """Finish the buffer, dropping what it holds, and cancel the pump; the pump if any."""
        self._buffer.finish(drop=True)
        with self._lock:
            pump, self._pump = self._pump, None
        if pump is not None:
            _cancel_soon(pump)
        return pump

    def close(self) -> None:
        """Stop the stream; nothing more is read. Idempotent. Waits until it is closed on
        the loop, except on the loop's own thread."""
        pump = self._stop()
        if pump is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not _background_loop():
            _run(_stopped(pump))

    def __enter__(self) -> BlockingStream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_pump", None) is not None:
            self._stop()


class BlockingPeer:
    """The blocking twin of :class:`rpc.ReconnectingPeer` (or, with ``reconnect=False``,
    of :class:`rpc.Peer`); every method waits for its answer."""

    def __init__(self, peer: ReconnectingPeer | Peer) -> None:
        self.peer = peer

    @property
    def connection_state(self) -> ConnectionState:
        """``connecting``, ``open``, ``reconnecting`` or ``closed`` (a plain peer: open or
        closed)."""
        peer = self.peer
        if isinstance(peer, ReconnectingPeer):
            return peer.connection_state
        return ConnectionState.CLOSED if peer.closed.done() else ConnectionState.OPEN

    def request(
        self,
        op: str,
        value: Any = None,
        *,
        timeout: float | None = None,
        raw: bool = False,
        idempotent: bool = False,
    ) -> Any:
        """``idempotent=True``: sent again if the connection drops while it is in flight
        (reconnecting peers only; a plain peer never sends anything twice)."""
        peer = self.peer
        if isinstance(peer, ReconnectingPeer):  # picks its connection when called: on the loop
            client = peer
            return _run(
                _on_loop(
                    lambda: client.request(
                        op, value, timeout=timeout, raw=raw, idempotent=idempotent
                    )
                )
            )
        return _run(peer.request(op, value, timeout=timeout, raw=raw))

    def stream(
        self,
        op: str,
        *legacy: Any,
        value: Any = None,
        parts: Iterable[Any] | None = None,
        timeout: float | None = None,
        item_timeout: float | None = None,
        raw: bool = False,
        max_buffered: int = MAX_BUFFERED,
        max_buffered_bytes: int | None = None,
    ) -> BlockingStream:
        """Send the request and wait for its first result (or its end, or its error); the
        results then come as they are iterated (:class:`BlockingStream`), buffered for the
        reader up to ``max_buffered`` (default :data:`MAX_BUFFERED`, 65,536) results and
        ``max_buffered_bytes`` bytes of them (None: the connection's ``max_size``, 16 MiB
        by default; the result that passes it included). Other arguments as in
        :meth:`rpc.peer.Peer.stream` (``stream(op, parts, value)`` is deprecated)."""
        if legacy:
            parts, value = legacy_stream_args(legacy, parts, value)
        peer = self.peer
        if max_buffered_bytes is None:
            max_buffered_bytes = peer.options.max_size
        stream = BlockingStream(max_buffered, max_buffered_bytes)

        async def start() -> None:
            # made on the loop: a reconnecting peer picks its connection when called
            results = peer.stream(
                op, value=value, parts=parts, timeout=timeout, item_timeout=item_timeout, raw=raw
            )  # an async generator either way (Peer.stream's is typed as an iterator)
            await stream._begin(cast(AsyncGenerator[Any, None], results))

        try:
            _run(start())
        except BaseException:  # its error before any result, or an interrupt: stop the pump
            stream._stop()
            raise
        return stream

    def notify(self, name: str, value: Any = None) -> None:
        async def send() -> None:
            self.peer.notify(name, value)

        _run(send())

    def wait_open(self, timeout: float | None = None) -> None:
        """Wait for the connection (reconnecting peers); raises TimeoutError or
        ConnectionClosed."""
        peer = self.peer
        if isinstance(peer, ReconnectingPeer):
            _run(peer.wait_open(timeout))
        elif not peer.is_open:
            raise ConnectionClosed("connection is closed")

    def close(self) -> None:
        _run(self.peer.close())

    def __enter__(self) -> BlockingPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(url: str | Sequence[str], **kwargs: Any) -> BlockingPeer:
    """Blocking :func:`rpc.connect`; takes the same arguments (callbacks such as
    ``on_state`` run on the background loop's thread)."""

    async def open_peer() -> ReconnectingPeer | Peer:
        peer: ReconnectingPeer | Peer = await async_connect(url, **kwargs)
        return peer

    return BlockingPeer(_run(open_peer()))
