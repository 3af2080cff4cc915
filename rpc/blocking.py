"""A blocking facade over the async core, for scripts and threads.

    with rpc.blocking.connect("tcp+gotalk://127.0.0.1:1234") as peer:
        print(peer.request("greet", {"name": "Ada"}))

One event loop runs in a daemon thread shared by every blocking peer of the process; calls
from any thread are handed to it with ``run_coroutine_threadsafe`` and wait for the result.
The loop is :func:`rpc.loops.new_event_loop`'s: uvloop when installed, or as
``PEERWIRE_LOOP`` says.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar

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
        raise RuntimeError("blocking peerwire call from inside its own event loop")
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


async def _on_loop(call: Callable[[], Awaitable[T]]) -> T:
    """Make ``call`` on the loop's thread, where the client's state may be read."""
    return await call()


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
        """Collects the whole result stream, then iterates it. Arguments as in
        :meth:`rpc.peer.Peer.stream` (``stream(op, parts, value)`` is deprecated)."""
        if legacy:
            parts, value = legacy_stream_args(legacy, parts, value)

        async def collect() -> list[Any]:
            results = self.peer.stream(
                op, value=value, parts=parts, timeout=timeout, item_timeout=item_timeout, raw=raw
            )
            return [x async for x in results]

        return iter(_run(collect()))

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
