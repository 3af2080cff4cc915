"""A blocking facade over the async core, for scripts and threads.

    with rpc.blocking.connect("tcp+gotalk://127.0.0.1:1234") as peer:
        print(peer.request("greet", {"name": "Ada"}))

One event loop runs in a daemon thread shared by every blocking peer of the process; calls
from any thread are handed to it (made there, as tasks) and wait for the result. The loop is
:func:`rpc.loops.new_event_loop`'s: uvloop when installed, or as ``PEERWIRE_LOOP`` says. A
caller interrupted (KeyboardInterrupt) while it waits, or as it hands the call over, cancels
its call on the loop: nothing it started goes on in the background. A child process made
by ``os.fork()`` starts a loop of its own at its first call (the loop's thread does not
come along); the clients and streams it inherited belong to the parent and raise
ConnectionClosed there. A blocking call or ``next()`` made on the loop's own thread (in a
handler a blocking client serves, in its ``on_connect`` or ``on_state``) would wait for the
loop it stops, for good: it raises :class:`CalledOnLoopThread` instead. A handler there that
raises SystemExit or KeyboardInterrupt is answered, then ends the loop's run and its thread
(as asyncio passes them on), whose exit cuts the connections made on it and closes it
(:mod:`rpc.blocking_loop`): the calls and ``next()`` waiting on that loop then raise
ConnectionClosed, as do later calls of the clients and streams made on it, and the next
blocking call (a new ``connect()``) starts another loop, as after a fork.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from types import TracebackType
from typing import Any, TypeVar, cast

from rpc.api import connect as async_connect
from rpc.blocking_buffer import END, Buffer, pump_results
from rpc.blocking_loop import (
    GONE,
    Background,
    Call,
    background,
    live_loop,
    lock,
    lost,
    on_loop_thread,
    track,
)
from rpc.errors import ConnectionClosed
from rpc.peer import Peer
from rpc.reconnect import ConnectionState, ReconnectingPeer
from rpc.streaming import legacy_stream_args

T = TypeVar("T")


class CalledOnLoopThread(RuntimeError):
    """A blocking call, or a blocking stream's ``next()``, made on the background loop's own
    thread: in a handler a blocking client serves (its ``registry``), in an ``on_connect``
    or ``on_state`` callback, in a callback put on that loop. It would wait for the loop it
    stops, for good. Nothing was done (a stream stays as it was): there, use the async API
    (:attr:`BlockingPeer.peer`), or hand the blocking work to another thread."""


_ON_LOOP = (
    "a blocking peerwire call on the background loop's own thread (a handler or callback of"
    " a blocking client) would wait for that loop for good: use the async API there"
    " (BlockingPeer.peer), or make the call from another thread"
)


def _run(call: Callable[[], Awaitable[T]], home: asyncio.AbstractEventLoop | None = None) -> T:
    """Make ``call`` on the background loop (its coroutine is made there: a client's state
    is read on its loop) and wait for its result; ``home``: the loop the object making the
    call was made on, which a process forked since then does not run, nor one whose loop's
    thread ended (ConnectionClosed, as when it ends during the wait); on the loop's own
    thread, CalledOnLoopThread. The :class:`~rpc.blocking_loop.Call` waited on exists before
    the call is handed to the loop, so an interrupt (KeyboardInterrupt) at any point cancels
    it: the call is then never made, or its task is cancelled."""
    outcome = Call()
    loop: asyncio.AbstractEventLoop | None = None
    try:
        with lock():
            current = background()
            if home is not None and home is not current.loop:
                raise lost(home)
            if threading.current_thread() is current.thread:
                raise CalledOnLoopThread(_ON_LOOP)
            current.calls.add(outcome)
            loop = current.loop
            loop.call_soon_threadsafe(_start, call, outcome, current)
        return cast(T, outcome.wait())
    except BaseException:
        outcome.cancelled = True  # interrupted (KeyboardInterrupt): the call stops too
        if loop is not None and not outcome.settled:
            with contextlib.suppress(RuntimeError):  # the loop is closed (its thread ended)
                loop.call_soon_threadsafe(outcome.cancel)
        raise


def _start(call: Callable[[], Awaitable[Any]], outcome: Call, current: Background) -> None:
    """On the loop: make ``call`` as a task whose end settles ``outcome`` (nothing if its
    caller was interrupted already)."""
    if outcome.cancelled:
        current.calls.discard(outcome)
        return
    try:
        task = asyncio.ensure_future(call())
    except Exception as error:  # raised as it was called: the caller's to raise
        current.calls.discard(outcome)
        outcome.settle(error=error)
        return
    outcome.task = task

    def ended(task: asyncio.Future[Any]) -> None:
        current.calls.discard(outcome)
        if not task.cancelled():
            error = task.exception()
            outcome.settle(task.result() if error is None else None, error)
        elif current.ending:  # its thread's exit cancelled the loop's tasks
            outcome.settle(error=ConnectionClosed(GONE))
        else:
            outcome.settle(error=concurrent.futures.CancelledError())

    task.add_done_callback(ended)


MAX_BUFFERED = 65_536
"""Default ``max_buffered`` of :meth:`BlockingPeer.stream`: results a stream holds for its
reading thread; past it the stream takes one more from the connection each time a reader
takes one (the connection's own queue then fills, and it stops reading: see
:mod:`rpc.stream_hold`)."""

MAX_BUFFERED_BYTES = 16 * 1024 * 1024
"""Default ``max_buffered_bytes`` of a :class:`BlockingStream` made directly (16 MiB, the
default ``max_size``); :meth:`BlockingPeer.stream` takes its connection's ``max_size``."""


_stopping: set[asyncio.Task[None]] = set()
"""Pumps cancelled by a close that does not wait, and closes of clients an interrupted
connect made (held until done: the loop keeps only weak references to tasks)."""


def _cancel_soon(pump: asyncio.Task[None]) -> None:
    """Cancel ``pump`` on the loop without waiting (from any thread, a finalizer too)."""

    def cancel() -> None:
        pump.cancel()
        _stopping.add(pump)
        pump.add_done_callback(_stopping.discard)

    loop = pump.get_loop()
    if loop is not live_loop():  # the parent's (forked), or gone: no thread runs it
        return
    with contextlib.suppress(RuntimeError):  # the loop is closed (interpreter exit)
        loop.call_soon_threadsafe(cancel)


async def _stopped(pump: asyncio.Task[None]) -> None:
    """Wait until ``pump`` is done: its stream closed (cancelled pumps close theirs)."""
    await asyncio.wait([pump])


class BlockingStream(Iterator[Any]):
    """The results of :meth:`BlockingPeer.stream`. A task on the loop (the pump) takes them from
    the connection as they come and buffers them for the reading thread, up to ``max_buffered``
    results (default :data:`MAX_BUFFERED`) and ``max_buffered_bytes`` bytes of them
    (:func:`~rpc.blocking_buffer.result_size`; default :data:`MAX_BUFFERED_BYTES`, the result
    that passes it included); past either the pump waits, so a reader slower than the server
    slows the server down (see :mod:`rpc.stream_hold`) and gets every result. One that takes
    none for the stream's ``item_timeout`` while the connection waits for it gets StreamOverflow
    (the server is told, as on a cancel) after the results before it, as it gets an error the
    stream ends with. Past the bytes, the pump waits until the reader's takes bring the buffer
    back under them (one take, for results of one size): a reader that takes small results ahead
    of a large one for ``item_timeout`` without doing so gets StreamOverflow too.

    Closing it (:meth:`close`, the end of a ``with`` block, dropping it, or an interrupt
    such as KeyboardInterrupt in ``next()``) stops the pump and the stream, which tells a
    peerwire peer to cancel its handler; breaking out of a ``for`` over it does so once it
    is no longer referenced. One neither read nor closed (still referenced) is a reader that
    fell behind: once full it holds its whole connection, other calls too, for up to its
    ``item_timeout``, then fails (neither protocol has flow control per stream): close a
    stream you stop reading. Several threads may read it (each result goes to one); any
    may close it, which ends the ``next()`` calls that wait with StopIteration. ``next()`` on
    the background loop's own thread raises :class:`CalledOnLoopThread` (it would wait for
    good), leaving the stream as it was.
    """

    def __init__(
        self, max_buffered: int = MAX_BUFFERED, max_buffered_bytes: int = MAX_BUFFERED_BYTES
    ) -> None:
        if max_buffered < 1:
            raise ValueError("max_buffered must be at least 1")
        if max_buffered_bytes < 1:
            raise ValueError("max_buffered_bytes must be at least 1")
        self._buffer = Buffer(max_buffered, max_buffered_bytes)
        with lock():  # its buffer failed should the loop's thread end
            self._home = background(self._buffer).loop  # not this process's after a fork
        self._pump: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # one _stop() takes the pump to cancel it

    async def _begin(self, results: AsyncGenerator[Any, None]) -> None:
        """On the loop: start the pump and wait for the first result or the end; an error
        before any result raises here, and an interrupted ``stream()`` (this cancelled)
        stops the pump."""
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._pump = asyncio.ensure_future(pump_results(results, self._buffer, first))
        try:
            await first
        except BaseException:
            self._stop()
            raise

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the results buffered now (:func:`~rpc.blocking_buffer.result_size`)."""
        return self._buffer.bytes

    @property
    def waiting(self) -> int:
        """``next()`` calls waiting for a result now (a test interrupts one of them)."""
        return self._buffer.waiting

    def __iter__(self) -> BlockingStream:
        return self

    def __next__(self) -> Any:
        if on_loop_thread():  # take() would wait for this thread
            raise CalledOnLoopThread(_ON_LOOP)
        try:
            if self._home is not live_loop():  # forked since, or gone: nothing fills it
                raise lost(self._home)
            item = self._buffer.take()
            if item is END:
                raise StopIteration
            return item
        except BaseException:  # its end, its error, or an interrupt: the stream stops
            self._stop()
            raise

    def _stop(self) -> asyncio.Task[None] | None:
        """Finish the buffer, dropping what it holds, and cancel the pump; the pump if any.
        The pump is dropped only once its cancel was handed to the loop: an interrupt before
        that leaves it for the next close() or the drop (a cancel twice does no harm)."""
        self._buffer.finish(drop=True)
        pump = self._pump
        if pump is not None:
            _cancel_soon(pump)
            with self._lock:
                if self._pump is pump:
                    self._pump = None
        return pump

    def close(self) -> None:
        """Stop the stream; nothing more is read. Idempotent. Waits until it is closed on
        the loop, except on the loop's own thread."""
        pump = self._stop()
        if pump is None or pump.get_loop() is not live_loop():  # none, forked, gone
            return
        if not on_loop_thread():
            with contextlib.suppress(ConnectionClosed):  # its loop's thread ended meanwhile
                _run(functools.partial(_stopped, pump), home=pump.get_loop())

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
        self._home = track(peer)  # not this process's after a fork; cut should it end

    @property
    def connection_state(self) -> ConnectionState:
        """``connecting``, ``open``, ``reconnecting`` or ``closed`` (a plain peer: open or
        closed; closed in a child process forked since it was made, or once its loop's
        thread ended)."""
        peer = self.peer
        if self._home is not live_loop():
            return ConnectionState.CLOSED
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
                lambda: client.request(op, value, timeout=timeout, raw=raw, idempotent=idempotent),
                home=self._home,
            )
        plain = peer
        return _run(lambda: plain.request(op, value, timeout=timeout, raw=raw), home=self._home)

    def stream(
        self,
        op: str,
        *legacy: Any,
        value: Any = None,
        parts: Iterable[Any] | AsyncIterable[Any] | None = None,
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
            _run(start, home=self._home)
        except BaseException:  # its error before any result, or an interrupt: stop the pump
            stream._stop()
            raise
        return stream

    def notify(self, name: str, value: Any = None) -> None:
        async def send() -> None:
            self.peer.notify(name, value)

        _run(send, home=self._home)

    def wait_open(self, timeout: float | None = None) -> None:
        """Wait for the connection (reconnecting peers); raises TimeoutError or
        ConnectionClosed."""
        peer = self.peer
        if isinstance(peer, ReconnectingPeer):
            _run(functools.partial(peer.wait_open, timeout), home=self._home)
        elif not peer.is_open or self._home is not live_loop():
            raise ConnectionClosed("connection is closed")

    def close(self, *, drain_timeout: float = 5.0) -> None:
        """Close the connection gracefully: calls in flight (another thread's) may finish for up
        to ``drain_timeout`` s (default 5, as :meth:`rpc.peer.Peer.close`; 0: none waited for,
        they raise ConnectionClosed). In a child process forked since it was made, nothing to
        do (the connection is the parent's), nor once its loop's thread ended (which cut it)."""
        if self._home is live_loop():
            with contextlib.suppress(ConnectionClosed):  # its loop's thread ended meanwhile
                _run(
                    functools.partial(self.peer.close, drain_timeout=drain_timeout),
                    home=self._home,
                )

    def __enter__(self) -> BlockingPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(url: str | Sequence[str], **kwargs: Any) -> BlockingPeer:
    """Blocking :func:`rpc.connect`; takes the same arguments (callbacks such as
    ``on_state`` run on the background loop's thread)."""

    made: list[ReconnectingPeer | Peer] = []

    async def open_peer() -> ReconnectingPeer | Peer:
        peer: ReconnectingPeer | Peer = await async_connect(url, **kwargs)
        made.append(peer)
        track(peer)  # an interrupted connect's too
        return peer

    with lock():
        home = background().loop
    try:
        blocking = BlockingPeer(_run(open_peer, home=home))
        if blocking._home is not home:  # the loop's thread ended since the client was made
            raise lost(home)
        return blocking
    except BaseException:
        # interrupted: a connect that completed before _run's cancel reached the loop made
        # a client nobody holds; closed after that cancel (one still running is cancelled)
        with contextlib.suppress(RuntimeError):  # the loop is closed (exit, thread ended)
            home.call_soon_threadsafe(_close_made, made)
        raise


def _close_made(made: list[ReconnectingPeer | Peer]) -> None:
    """On the loop: close the clients an interrupted :func:`connect` made for nobody."""
    for peer in made:
        closing = asyncio.ensure_future(peer.close())
        _stopping.add(closing)
        closing.add_done_callback(_stopping.discard)
