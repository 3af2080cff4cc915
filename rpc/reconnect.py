"""The client that reconnects by itself: what :func:`rpc.connect` returns.

A :class:`ReconnectingPeer` owns the current connection (a :class:`~rpc.peer.Peer`, the
protocol of one connection) and presents the calls of a peer: ``request``, ``stream``,
``notify``, ``drain``, ``close``, ``closed``, ``registry``, ``remote_address``. Rules:

- After the connection drops, the client tries again in *rounds*: a round tries every URL
  once, back to back, starting with the URL after the one that dropped (or in a new random
  order each round, with ``Reconnect(shuffle=True)``). Before round ``n`` (from 0) it waits
  :meth:`Backoff.delay` ``(n)``, a uniform random time in ``[0, min(cap, base * 2**n)]``
  (exponential back-off with full jitter). ``Reconnect(attempts=N)`` closes the client
  after ``N`` failed attempts in a row (each URL tried counts one); ``None``: no limit.
  A connection that closes before anything was answered on it, within ``cap`` seconds,
  counts as a failed attempt (the back-off keeps growing against a server that accepts
  and closes).
- The first connection is one round without waiting: if no URL answers, ``connect``
  raises (a wrong URL fails at once).
- A request made while disconnected waits for the connection within its own timeout, then
  goes out. A request in flight when the connection dropped fails with
  :class:`~rpc.errors.ConnectionClosed`, unless it was marked ``idempotent=True``: then it
  is sent again on the next connection, within the same timeout. Nothing else is ever sent
  twice; streams are never sent again. ``notify`` while disconnected raises
  ConnectionClosed (``await wait_open()`` first).
- Every connection serves the same registry: handlers registered on the client are served
  again after a reconnect. ``on_connect(peer)`` (sync or async) runs on every new
  connection before any request of ours goes out on it (to log in, to subscribe); if it
  raises, that connection is closed and the attempt counts as failed (on the first
  connection the error reaches the caller of ``connect``).
- :attr:`ReconnectingPeer.connection_state` is ``connecting``, ``open``, ``reconnecting``
  or ``closed``; every transition (one ``reconnecting`` per round, with its wait) goes to
  ``on_state`` and to each :meth:`ReconnectingPeer.transitions` iterator, and is logged at
  INFO on the ``peerwire.rpc`` logger with the URL and the wait.

Per-client state: the current connection (replaced at each reconnect), one reconnect task,
the count of failed attempts and rounds (:class:`~rpc.reconnect_rounds.Rounds`, which also
orders each round's URLs), and at most :data:`TRANSITIONS_QUEUE` transitions per unread
iterator (the oldest dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Coroutine,
    Sequence,
)
from contextvars import Context
from typing import Any, cast

from rpc.backoff import Reconnect
from rpc.connection_state import (
    TRANSITIONS_QUEUE,
    ConnectionState,
    OnState,
    StateReporter,
    Transition,
    TransitionIterator,
)
from rpc.deadlines import EARLY
from rpc.errors import ConnectionClosed, RemoteError, RequestTimeout, RetryLater
from rpc.peer import Options, Peer
from rpc.reconnect_rounds import Rounds, failure, one_line
from rpc.registry import Registry
from transports.stream import ClosedHere
from wire.errors import MessageTooLarge

log = logging.getLogger("peerwire.rpc")

Dial = Callable[[str], Awaitable[Peer]]
"""Opens one connection to a URL (raising ConnectionClosed when it cannot)."""
OnConnect = Callable[[Peer], Any]


class ReconnectingPeer:
    """A client connection that reconnects by itself; create it with :func:`rpc.connect`.

    Presents the calls of :class:`~rpc.peer.Peer` on the current connection; see
    :mod:`rpc.reconnect` for what happens across connections.
    """

    def __init__(
        self,
        urls: Sequence[str],
        dial: Dial,
        *,
        registry: Registry,
        options: Options,
        protocol_name: str,
        default_timeout: float,
        policy: Reconnect | None = None,
        on_connect: OnConnect | None = None,
        on_state: OnState | None = None,
    ) -> None:
        if not urls:
            raise ValueError("connect needs at least one URL")
        self.urls = tuple(urls)
        self.registry = registry
        """The handlers every connection of this client serves."""
        self.options = options
        self.protocol_name = protocol_name
        self.policy = policy if policy is not None else Reconnect()
        self.state: dict[str, Any] = {}
        """Free room for the application's data; lives as long as the client (each
        connection's :class:`~rpc.peer.Peer` has its own ``state``)."""
        self.attempts = 0
        """Connection attempts so far (successful or not)."""
        self.connects = 0
        """Connections opened so far."""
        self._dial = dial
        self._on_connect = on_connect
        self._default_timeout = default_timeout
        self._loop = asyncio.get_running_loop()
        self._peer: Peer | None = None
        self._states = StateReporter(self._loop, self.urls[0], on_state)
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._proven: Peer | None = None
        """The current connection once a request on it was answered: requests and streams
        go straight to it while it is open (one check per call). Set by :meth:`_answered`
        to the current peer only; cleared with ``_peer`` (a drop, the end) and by a new
        connection, so an open one is always the current connection."""
        self._opened_at = 0.0
        self._rounds = Rounds(self.urls, self.policy)
        self.closed: asyncio.Future[BaseException | None] = self._loop.create_future()
        """Resolves once the client is closed for good (with the last connection error,
        or None after :meth:`close`)."""

    # --- state ----------------------------------------------------------------------------

    @property
    def connection_state(self) -> ConnectionState:
        """``connecting``, ``open``, ``reconnecting`` or ``closed``."""
        return self._states.last.state

    @property
    def connection(self) -> Peer | None:
        """The current connection's peer (None while there is none)."""
        return self._peer

    @property
    def url(self) -> str:
        """The URL of the current connection (or the one being tried, or the last)."""
        return self._states.last.url

    @property
    def is_open(self) -> bool:
        peer = self._peer
        return peer is not None and peer.is_open

    @property
    def remote_address(self) -> Any:
        return self._peer.remote_address if self._peer is not None else None

    @property
    def transport(self) -> Any:
        """The current connection's transport (None without one)."""
        return self._peer.transport if self._peer is not None else None

    @property
    def write_buffer_size(self) -> int:
        return self._peer.write_buffer_size if self._peer is not None else 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def transitions(self) -> TransitionIterator:
        """Every transition from now on; ends after ``closed`` (at once if already closed).
        An iterator not read keeps the latest :data:`~rpc.connection_state.TRANSITIONS_QUEUE`;
        one dropped is forgotten, and ``aclose()`` ends it."""
        return self._states.transitions()

    async def wait_open(self, timeout: float | None = None) -> Peer:
        """Wait (at most ``timeout`` s; None: the request timeout) for the connection and
        return its peer. Raises TimeoutError, or ConnectionClosed once closed."""
        timeout = self._timeout(timeout)
        return await self._ready(self._loop.time() + timeout, "wait_open", timeout)

    # --- calls ----------------------------------------------------------------------------

    def request(
        self,
        op: str,
        value: Any = None,
        *,
        timeout: float | None = None,
        raw: bool = False,
        idempotent: bool = False,
    ) -> Coroutine[Any, Any, Any]:
        """:meth:`Peer.request <rpc.peer.Peer.request>` on the current connection, waiting
        for one within ``timeout``. ``idempotent=True``: the request may run twice, and is
        sent again if the connection drops while it is in flight (not when we cut it on a
        message over ``max_size``, which may be its answer: that would only come again),
        and when a peer closing the connection refused it (a retry result, then the close:
        see :meth:`Peer.request <rpc.peer.Peer.request>`).

        Returns a coroutine to await. On a connection that is open and has answered, a
        request that is not idempotent is the connection's own ``request`` (its result and
        errors are the same as through this client's, and a frame of ours per call is saved:
        about a sixth of a Gotalk client's CPU per call at 100 in flight). The connection is
        then the one open when ``request`` was called: should it drop before the coroutine
        runs, the request fails with ConnectionClosed as one in flight would."""
        peer = self._proven
        if peer is not None and not idempotent and peer.is_open:
            return peer.request(op, value, timeout=timeout, raw=raw)
        return self._request(op, value, timeout, raw, idempotent)

    async def _request(
        self, op: str, value: Any, timeout: float | None, raw: bool, idempotent: bool
    ) -> Any:
        loop = self._loop
        chosen = timeout is not None or self.options.timeout is not None
        timeout = self._timeout(timeout)
        deadline = loop.time() + timeout
        waited = False
        while True:
            peer = self._peer
            if (
                peer is None
                or not peer.is_open
                or self._states.last.state is not ConnectionState.OPEN
            ):
                peer = await self._ready(deadline, op, timeout)
                waited = True
            # the time left travels to the server only when the caller chose a timeout or
            # part of the default went on waiting for a connection
            left = deadline - loop.time() if chosen or waited else None
            try:
                reply = await peer.request(op, value, timeout=left, raw=raw)
            except ConnectionClosed as exc:
                if not idempotent or self._closing:
                    raise
                if _cut_for_size(peer.gave_up):  # its answer may be that message: sent
                    raise ConnectionClosed(  # again, it would come back as large
                        f"{op}: the connection was cut on a message over max_size "
                        f"({peer.gave_up}); not sent again"
                    ) from exc
                log.debug("%s: connection to %s lost in flight; sending it again", op, self.url)
                continue
            except RetryLater:
                if idempotent and not self._closing and not peer.is_open:
                    # refused by a peer closing the connection (see Peer.request): not run
                    log.debug("%s: refused by %s as it closed; sending it again", op, self.url)
                    continue
                self._answered(peer)
                raise
            except RemoteError:
                self._answered(peer)
                raise
            except RequestTimeout:  # named with the caller's timeout, not what was left of it
                raise RequestTimeout(f"{op}: no result within {timeout} s") from None
            self._answered(peer)
            return reply

    def stream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        """:meth:`Peer.stream <rpc.peer.Peer.stream>` (same arguments) on the current
        connection, waiting for one within the stream's ``timeout`` (a deadline for the
        whole stream, the wait included; without one, ``item_timeout`` or the request
        timeout); never sent again.

        On a connection that is open and has answered, this is the connection's own
        ``stream`` (as :meth:`request` is), without a generator of ours around it that
        every result would pass through. The connection is then the one open when
        ``stream`` was called: should it drop before the stream is first read, the stream
        raises ConnectionClosed as one in flight would, instead of waiting for the next."""
        peer = self._proven
        if peer is not None and peer.is_open:
            return cast(AsyncGenerator[Any, None], peer.stream(*args, **kwargs))
        return self._stream(*args, **kwargs)

    async def _stream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        loop = self._loop
        timeout = kwargs.get("timeout")
        wait = timeout if timeout is not None else self._timeout(kwargs.get("item_timeout"))
        deadline = loop.time() + wait
        op = str(args[0] if args else kwargs.get("op", "stream"))
        peer = await self._ready(deadline, op, wait)
        if timeout is not None:
            kwargs = {**kwargs, "timeout": max(deadline - loop.time(), 0.0)}
        items = cast(AsyncGenerator[Any, None], peer.stream(*args, **kwargs))
        async with contextlib.aclosing(items):
            async for item in items:
                self._answered(peer)
                yield item

    def notify(self, name: str, value: Any = None) -> None:
        """Send a notification now; raises ConnectionClosed while disconnected."""
        self._open_peer().notify(name, value)

    async def drain(self) -> None:
        """:meth:`Peer.drain <rpc.peer.Peer.drain>` of the current connection."""
        await self._open_peer().drain()

    def _open_peer(self) -> Peer:
        peer = self._peer
        if peer is None or not peer.is_open:
            raise ConnectionClosed(f"not connected to {self.url} ({self.connection_state.value})")
        return peer

    def _timeout(self, timeout: float | None) -> float:
        if timeout is not None:
            return timeout
        if self.options.timeout is not None:
            return self.options.timeout
        return self._default_timeout

    async def _ready(self, deadline: float, what: str, timeout: float) -> Peer:
        """The open connection, once there is one by loop time ``deadline``."""
        while True:
            peer = self._peer
            state = self._states.last.state
            if state is ConnectionState.OPEN and peer is not None and peer.is_open:
                return peer
            if state is ConnectionState.CLOSED:
                reason = f": {self._states.last.error}" if self._states.last.error else ""
                raise ConnectionClosed(f"connection to {self.url} is closed{reason}")
            if self._loop.time() + EARLY >= deadline:  # uvloop's timers may fire that early
                raise RequestTimeout(f"{what}: not connected within {timeout} s ({state.value})")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await asyncio.shield(self._states.settled())

    # --- connecting -----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the first connection: one round over the URLs; raises the last failure."""
        self._states.emit(ConnectionState.CONNECTING, self.urls[0])
        error: BaseException | None = None
        urls = self._rounds.order(-1)
        try:
            for url in urls:
                try:
                    peer = await self._attempt(url)
                except Exception as exc:
                    if self._closing:  # closed meanwhile (by on_connect): no more URLs
                        raise
                    error = exc
                    if url != urls[-1]:  # the last failure is raised
                        log.info("%s; trying the next URL", failure(url, exc))
                    continue
                self._opened(peer, url)
                # not the caller's context (a served call's), as rpc.dial.in_own_context
                self._task = self._loop.create_task(self._supervise(), context=Context())
                return
        except BaseException:
            self._finish("cancelled while connecting")
            raise
        self._finish(failure(self.url, error) if error is not None else "no URL")
        if error is not None:
            raise error

    async def _attempt(self, url: str) -> Peer:
        """One connection to ``url``, with ``on_connect`` done."""
        self.attempts += 1
        peer = await self._dial(url)
        if self._on_connect is None:
            return peer
        try:
            result = self._on_connect(peer)
            if inspect.isawaitable(result):
                await result
            if self._closing:  # on_connect closed the client: this connection goes too
                raise ConnectionClosed(f"the client was closed during on_connect ({url})")
            if not peer.is_open:
                raise ConnectionClosed(f"connection to {url} closed during on_connect")
        except BaseException:
            peer.abort()
            raise
        return peer

    async def _supervise(self) -> None:
        """Wait for the connection to drop; reconnect; until closed or out of attempts."""
        try:
            while True:
                peer = self._peer
                if peer is None:
                    return
                exc = await asyncio.shield(peer.closed)
                proven = self._proven is not None
                self._peer = self._proven = None
                cause = peer.gave_up or exc or "closed by the peer"
                why = f"{self.url}: {cause}"
                lived = self._loop.time() - self._opened_at
                if proven or lived >= self.policy.backoff.cap:
                    self._rounds.worked()  # it worked: back-off starts again
                else:  # accepted, then closed before it answered: a failed attempt
                    self._rounds.failed()
                    why = f"{self.url} closed after {lived:.3f} s, before answering: {cause}"
                if not await self._reconnect(why):
                    return
        except Exception as exc:  # a bug of ours: say so, and do not leave callers waiting
            log.exception("reconnecting to %s failed", self.url)
            self._finish(one_line(exc))

    async def _reconnect(self, why: str) -> bool:
        """Rounds of attempts until one connects (True) or the limit is reached (False)."""
        rounds = self._rounds
        last = self.urls.index(self.url) if self.url in self.urls else -1
        while True:
            if rounds.exhausted:
                self._finish(rounds.gave_up(why))
                return False
            urls = rounds.order(last)
            wait = rounds.wait()
            self._states.emit(ConnectionState.RECONNECTING, urls[0], wait, why, rounds.failures)
            await asyncio.sleep(wait)
            for url in urls:
                if rounds.exhausted:
                    break
                try:
                    peer = await self._attempt(url)
                except Exception as exc:
                    if self._closing:  # closed meanwhile (by on_connect): no more attempts
                        return False
                    failures = rounds.failed()
                    why = failure(url, exc)
                    last = self.urls.index(url)
                    log.info("%s (%d failed in a row)", why, failures)
                    continue
                self._opened(peer, url)
                return True

    def _opened(self, peer: Peer, url: str) -> None:
        self._peer = peer
        self._proven = None
        self._opened_at = self._loop.time()
        self.connects += 1
        self._states.emit(ConnectionState.OPEN, url, failures=self._rounds.failures)

    def _answered(self, peer: Peer) -> None:
        """A request on ``peer`` got an answer: the connection works."""
        if peer is self._peer:
            self._proven = peer

    def _finish(self, error: str | None) -> None:
        """Closed for good."""
        self._peer = self._proven = None
        if self._states.last.state is not ConnectionState.CLOSED:
            self._states.emit(ConnectionState.CLOSED, self.url, error=error)
        if not self.closed.done():
            self.closed.set_result(ConnectionClosed(error) if error else None)

    # --- closing --------------------------------------------------------------------------

    async def close(self, *, drain_timeout: float = 5.0) -> None:
        """Stop reconnecting and close the connection gracefully (waiting up to
        ``drain_timeout`` for work in flight). Cancelled meanwhile (a timeout around it,
        an interrupted blocking ``close()``), it closes the connection at once and the
        client is closed all the same."""
        if self._closing:
            await asyncio.shield(self.closed)
            return
        self._closing = True
        closing: Peer | None = None
        try:
            task = self._task
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                await asyncio.wait([task])
            closing = self._peer
            if closing is not None:
                await closing.close(drain_timeout=drain_timeout)
        finally:
            peer = self._peer
            if closing is None and peer is not None:  # cancelled before its close began
                peer.abort()
            self._finish(None)

    def abort(self) -> None:
        """Close the current connection now, dropping work in flight; the client then
        reconnects like after any drop (:meth:`close` stops it)."""
        if self._peer is not None:
            self._peer.abort(ConnectionClosed("aborted by this client"))

    def __repr__(self) -> str:
        return f"<ReconnectingPeer {self.url} {self.connection_state.value}>"


def _cut_for_size(reason: BaseException | None) -> bool:
    """We cut the connection on an incoming message over ``max_size``: the codec's check,
    or the WebSocket layer's (close code 1009)."""
    return isinstance(reason, MessageTooLarge) or (
        isinstance(reason, ClosedHere) and reason.too_large
    )


__all__ = ["TRANSITIONS_QUEUE", "ConnectionState", "ReconnectingPeer", "Transition"]
