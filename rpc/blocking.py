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
import concurrent.futures
import contextlib
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
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


async def _next(results: AsyncIterator[Any]) -> Any:
    """The next result, or ``_END`` (StopAsyncIteration does not cross to another thread)."""
    try:
        return await anext(results)
    except StopAsyncIteration:
        return _END


_closing: set[asyncio.Future[Any]] = set()
"""Closes started for streams dropped unread (held until done: the loop keeps only weak
references to tasks)."""


def _close_soon(results: AsyncGenerator[Any, None]) -> None:
    """Close ``results`` on the loop without waiting (from a finalizer, or the loop's thread)."""

    def start() -> None:
        task = asyncio.ensure_future(results.aclose())
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    with contextlib.suppress(RuntimeError):  # the loop is closed (interpreter exit)
        _background_loop().call_soon_threadsafe(start)


class BlockingStream(Iterator[Any]):
    """The results of :meth:`BlockingPeer.stream`: an iterator that fetches each next result
    from the loop when asked, so an endless stream (a subscription) costs one result at a
    time. Read-ahead: none past the first result, which ``stream()`` waits for.

    Closing it (:meth:`close`, the end of a ``with`` block, breaking out of a ``for`` over
    it, or dropping it) stops the stream, which tells a peerwire peer to cancel its handler.
    One thread reads it at a time; another may close it, which ends a ``next()`` that waits.
    """

    def __init__(self, results: AsyncGenerator[Any, None], first: Any) -> None:
        self._results: AsyncGenerator[Any, None] | None = None if first is _END else results
        self._ahead = [] if first is _END else [first]
        self._fetch: concurrent.futures.Future[Any] | None = None
        self._lock = threading.Lock()

    def __iter__(self) -> BlockingStream:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._ahead:
                return self._ahead.pop()
            results = self._results
            if results is None:
                raise StopIteration
            if self._fetch is not None:
                raise RuntimeError("a blocking stream is read by one thread at a time")
            fetch = self._fetch = asyncio.run_coroutine_threadsafe(
                _next(results), _background_loop()
            )
        try:
            item = fetch.result()
        except concurrent.futures.CancelledError:
            self._ended()
            raise StopIteration from None  # closed by another thread
        except BaseException:
            self._ended()  # the stream ended with its error, or our cancel ends it
            if not fetch.cancel() and fetch.exception() is None:
                _close_soon(results)  # interrupted just as a result came: end it here
            raise
        with self._lock:
            self._fetch = None
            if item is _END:
                self._results = None
                raise StopIteration
        return item

    def _ended(self) -> None:
        with self._lock:
            self._fetch = None
            self._results = None

    def close(self) -> None:
        """Stop the stream; nothing more is fetched. Idempotent. Waits until it is closed on
        the loop, except on the loop's own thread or while another thread's ``next()`` waits
        (that wait is cancelled, which closes it, and ends with StopIteration)."""
        with self._lock:
            results, self._results = self._results, None
            fetch = self._fetch
            self._ahead.clear()
        if results is None or (fetch is not None and fetch.cancel()):
            return  # done, or the fetch another thread waits for was cancelled: that ends it
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is _background_loop():
            _close_soon(results)
        else:
            _run(results.aclose())

    def __enter__(self) -> BlockingStream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        results = getattr(self, "_results", None)
        if results is not None:
            self._results = None
            _close_soon(results)


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
    ) -> Iterator[Any]:
        """Send the request and wait for its first result (or its end, or its error); the
        results then come one at a time as they are iterated (:class:`BlockingStream`).
        Arguments as in :meth:`rpc.peer.Peer.stream` (``stream(op, parts, value)`` is
        deprecated)."""
        if legacy:
            parts, value = legacy_stream_args(legacy, parts, value)
        peer = self.peer

        async def start() -> tuple[AsyncGenerator[Any, None], Any]:
            # made on the loop: a reconnecting peer picks its connection when called
            results = peer.stream(
                op, value=value, parts=parts, timeout=timeout, item_timeout=item_timeout, raw=raw
            )  # an async generator either way (Peer.stream's is typed as an iterator)
            return cast(AsyncGenerator[Any, None], results), await _next(results)

        results, first = _run(start())
        return BlockingStream(results, first)

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
