"""One endpoint's pooled connection, reconnected with back-off while calls wait for it.

A :class:`Link` belongs to a Python worker's :class:`rpc.spark.pool.ConnectionPool` and
lives on its event loop. When the connection is missing or found closed, an *outage*
starts: one reconnect task tries to connect, waiting between attempts with exponential
back-off and full jitter (a uniform wait in ``[0, min(cap, first * 2**n)]``), and every
call that needs the connection waits for it, each within its own time budget. A call whose
budget is spent fails with the cause of the last failed attempt; calls that arrive once the
outage is older than their budget fail at once, while the reconnect task keeps trying
(every ``cap`` seconds at most) for as long as calls keep asking, so a peer that comes back
is found again. A new connection carries one call (the probe) until that call has ended
with the connection still open: a connection that the kernel of a dying peer accepted just
before its listening socket closed then costs one call, not a window of them. Only that
answer ends the outage: a connection that closes before it (a server at ``max_connections``
accepts and closes; Chatter has no handshake to fail) is a failed attempt, so the outage,
its start, its error and its back-off go on instead of a new outage reconnecting at once.

Any failure of connection set-up counts as the peer being unreachable (refused, timed out,
TLS errors, and errors inside the protocol such as missing schemas): it is named in the
calls' errors and logged once per outage, with a count of attempts when the outage ends.
A definite TLS refusal (:data:`REFUSALS`: a certificate signed by an unknown CA, a wrong
host name, a client certificate required) is configuration, not an outage: the calls
waiting fail at once instead of spending their budget on attempts that cannot succeed (the
reconnect task still tries, with back-off, in case a certificate is replaced). Other TLS
failures may pass (a server at ``max_connections`` closes before any TLS, which looks like
a plain port), so they are waited out like any outage.

Only the public core API is used (``rpc.connect``, ``Peer.is_open``, ``Peer.close``); this
module is meant to give way to the core's reconnecting client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rpc.backoff import full_jitter
from rpc.errors import (
    ConnectionClosed,
    TlsCertificateRequired,
    TlsHostnameMismatch,
    TlsUnknownCA,
)
from rpc.peer import Peer

log = logging.getLogger("peerwire.spark")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential back-off with full jitter: attempt ``n`` waits a uniform random time in
    ``[0, min(cap, first * 2**n)]`` seconds."""

    first: float = 0.05
    cap: float = 2.0

    def delay(self, attempt: int) -> float:
        return full_jitter(attempt + 1, self.first, self.cap)


REFUSALS = (TlsUnknownCA, TlsHostnameMismatch, TlsCertificateRequired)
"""TLS failures that another attempt cannot mend: verification of the server's certificate
failed, or the server's alert said it does not trust ours or needs one."""

RECONNECT = Backoff()
"""Between connection attempts: from 50 ms, at most 2 s (a restarted peer is found within
about 2 s of listening again)."""


class LoopErrors:
    """The worker loop's exception handler: remembers the latest error that asyncio could
    only log (an exception inside a protocol callback, such as a protocol peer that fails
    to start while a connection is being made), so that a failed connection attempt can
    name it; logs each distinct error once (with its traceback) and counts the rest."""

    MAX_DISTINCT = 100

    def __init__(self) -> None:
        self.count = 0
        self.last: BaseException | None = None
        self._logged: dict[str, int] = {}

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        message = str(context.get("message", "unhandled error in the event loop"))
        self.count += 1
        self.last = exc if isinstance(exc, BaseException) else None
        key = f"{message}: {exc!r}"
        seen = self._logged.get(key)
        if seen is None and len(self._logged) < self.MAX_DISTINCT:
            self._logged[key] = 1
            log.error("%s (logged once; repeats are counted)", message, exc_info=self.last)
        elif seen is not None:
            self._logged[key] = seen + 1

    def repeats(self) -> dict[str, int]:
        """Errors seen more than once: how often each was seen."""
        return {key: n for key, n in self._logged.items() if n > 1}


class Link:
    """One endpoint's connection: ``get`` returns it, waiting for a reconnect if need be."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        url: str,
        connect: Callable[[], Awaitable[Peer]],
        backoff: Backoff = RECONNECT,
    ) -> None:
        self._loop = loop
        self.url = url
        self._connect = connect
        self._backoff = backoff
        self._peer: Peer | None = None
        self._proven = False
        """A reply has come back on ``_peer`` (until then only one call, the probe, uses it:
        a connection the kernel of a dying peer accepted loses one call, not a window)."""
        self._probing = False
        self._task: asyncio.Task[None] | None = None
        self._news: asyncio.Future[None] = loop.create_future()
        """Resolved (and replaced) after every connection attempt."""
        self._down_since: float | None = None
        """When the outage began (None: the connection has answered, or none was needed)."""
        self._error: str | None = None
        """Why the last attempt of this outage failed (None: none failed yet)."""
        self._failures = 0
        """Failed attempts in this outage (a connection closed unanswered is one): the
        exponent of the back-off before the next attempt."""
        self._refused = False
        """The last attempt failed on one of :data:`REFUSALS`: calls fail at once."""
        self._waiters = 0
        self._asked = 0.0
        self._gave_up = False
        self._closed = False
        """:meth:`close` was called: no reconnect task is started again."""
        self.attempts = 0
        """Connection attempts so far (successful or not)."""
        self.connects = 0
        """Connections opened so far."""

    def ready(self) -> Peer | None:
        """The open connection, if there is one and it has answered (no waiting)."""
        peer = self._peer
        return peer if self._proven and peer is not None and peer.is_open else None

    async def get(self, since: float, budget: float) -> tuple[Peer, bool]:
        """The open connection, and whether the caller is its probe: the first call on a
        new connection goes alone, and its caller must report with :meth:`settled`; the
        others wait for it. Without a connection, wait for the reconnect task until
        ``since`` (or the outage's start, if earlier) plus ``budget`` seconds; then raise
        ConnectionClosed naming the last attempt's failure. The first attempt of an outage
        is always waited for (``connect_timeout`` bounds it)."""
        while True:
            if self._closed:
                raise ConnectionClosed(f"connection to {self.url} closed by this worker")
            peer = self._peer
            if peer is not None:
                if self._proven and peer.is_open:
                    return peer, False
                if self._probing:
                    await asyncio.shield(self._news)  # the probe settles it
                    continue
                if peer.is_open:
                    self._probing = True
                    return peer, True
                if not self._proven:
                    self._closed_unanswered()  # closed before any call went out on it
            now = self._loop.time()
            if self._down_since is None or self._task is None:
                self._outage_starts(now)  # a new outage, or an old one nobody asked about
            self._asked = now
            self._start_reconnecting()
            deadline = min(since, self._down_since or now) + budget
            if self._error is not None and (now >= deadline or self._refused):
                self._give_up()
                raise ConnectionClosed(f"cannot connect to {self.url}: {self._error}")
            news = self._news
            self._waiters += 1
            try:
                timeout = None if self._error is None else deadline - now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(news), timeout)
            finally:
                self._waiters -= 1

    def settled(self, peer: Peer, answered: bool | None) -> None:
        """The probe's call on ``peer`` ended: ``answered`` True (a result, an error or a
        retry result came back), False (none within the call's timeout, or the connection
        closed), None (the call failed here, before it was sent: the next call probes).
        On a peer still open, an answer ends the outage, and so does a timeout on a peer
        that has sent us anything at all (a Gotalk version, a Pong: alive, only slow);
        else it is a failed attempt and the outage goes on: a connection closed
        meanwhile, or one silent since it opened (a frozen process, a proxy with nothing
        behind it; a Chatter server has no handshake to fail first), which is closed."""
        if peer is self._peer and self._probing:
            self._probing = False
            if not peer.is_open:
                self._closed_unanswered()
            elif answered or (answered is False and peer.read_at > 0):
                self._proven = True
                self._outage_ends()
            elif answered is False:
                peer.abort(ConnectionClosed("silent since it opened"))
                self._closed_unanswered("connection did not answer its first call")
            # answered None: not sent, not a probe after all; the next call is
            news, self._news = self._news, self._loop.create_future()
            news.set_result(None)

    def _closed_unanswered(self, why: str = "connection closed before answering") -> None:
        """The new connection closed, or was given up on, before answering: count a failed
        attempt and start the reconnect task, which backs off before its first attempt."""
        self._peer = None
        self._failed(ConnectionClosed(why))
        self._start_reconnecting()

    def _start_reconnecting(self) -> None:
        if self._task is None and not self._closed:
            self._task = self._loop.create_task(self._reconnect())

    def _outage_starts(self, now: float) -> None:
        self._down_since = now
        self._error = None
        self._failures = 0
        self._refused = False
        self._gave_up = False
        if self._peer is not None:
            log.info("connection to %s lost; reconnecting", self.url)
            self._peer = None

    def _give_up(self) -> None:
        if not self._gave_up:
            self._gave_up = True
            log.warning(
                "%s still unreachable after %.1f s: calls fail at once until it is back (%s)",
                self.url,
                self._loop.time() - (self._down_since or 0.0),
                self._error,
            )

    async def _reconnect(self) -> None:
        try:
            while True:
                if self._failures:
                    await asyncio.sleep(self._backoff.delay(self._failures - 1))
                self.attempts += 1
                try:
                    peer = await self._connect()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # any set-up failure: the peer is unreachable
                    self._failed(exc)
                else:
                    self._connected(peer)
                    return
                finally:
                    news, self._news = self._news, self._loop.create_future()
                    news.set_result(None)
                if self._waiters == 0 and self._loop.time() - self._asked > self._backoff.cap:
                    return  # nobody asked for a while: stop until asked again
        finally:
            self._task = None

    def _failed(self, exc: BaseException) -> None:
        self._error = cause(exc, self.url)
        self._refused = isinstance(exc, REFUSALS)
        if self._failures == 0:
            log.warning("cannot connect to %s: %s; retrying with back-off", self.url, self._error)
        self._failures += 1

    def _connected(self, peer: Peer) -> None:
        """A new connection: the outage lasts until it answers (see :meth:`settled`)."""
        self._peer = peer
        self._proven = self._probing = False
        self.connects += 1

    def _outage_ends(self) -> None:
        if self._failures:
            log.warning(
                "connected to %s after %.1f s and %d failed attempts",
                self.url,
                self._loop.time() - (self._down_since or 0.0),
                self._failures,
            )
        self._down_since = None
        self._error = None
        self._failures = 0
        self._refused = False

    async def close(self) -> None:
        """End the reconnect task (waiting for it to end) and close the connection (its
        calls in flight get up to 1 s); calls waiting for it, and any later, fail with
        ConnectionClosed, and no reconnect task is started again."""
        self._closed = True
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # its own CancelledError stays in it
        news, self._news = self._news, self._loop.create_future()
        news.set_result(None)  # wakes the calls waiting: they see the link closed
        peer, self._peer = self._peer, None
        if peer is not None:
            await peer.close(drain_timeout=1.0)


def cause(exc: BaseException, url: str) -> str:
    """Why connecting to ``url`` failed: the core's message without the URL it repeats, or
    the type and message of any other exception (a failure inside the protocol)."""
    text = str(exc)
    if isinstance(exc, ConnectionClosed):
        if text == f"connecting to {url} timed out":
            return "timed out"
        return text.removeprefix(f"cannot connect to {url}: ")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
