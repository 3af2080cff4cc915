"""A Python worker's connections: at most ``max_connections`` links, the least recently used
idle one closed to make room.

Spark reuses a Python worker process for task after task, so its :class:`ConnectionPool`
outlives every UDF: a job calling many URLs (one UDF per URL, or options that differ) would
otherwise keep a connection and a reconnect task per endpoint for the life of the
executor. A row takes its endpoint's link for the whole call (waits and resends included)
and gives it back when done; a link with a row on it is never closed under that row. A new
endpoint's link, when the pool holds ``max_connections`` links or more (the largest value
any UDF of the process gave, as UDFs share the pool), first closes the least recently used
link with no row on it: its reconnect task is cancelled and its connection closed (it has
no call in flight). When every link has rows on it, the row waits for one to be given back
within its ``retry_for`` budget, then fails with :class:`PoolFull` (nothing was sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from typing import Any

from rpc.api import connect
from rpc.errors import RpcError
from rpc.peer import Options, Peer
from rpc.registry import Registry
from rpc.spark.reconnect import Link, LoopErrors
from transports.stream import client_ssl_context

MAX_CONNECTIONS = 64
"""Links a Python worker keeps when the UDF does not say (``CallOptions.max_connections``)."""


class PoolFull(RpcError):
    """A row needed a new endpoint's link while every one of ``max_connections`` links had
    rows on it, and none was given back within the row's ``retry_for``: nothing was sent."""


@dataclass(frozen=True, slots=True)
class Tls:
    """Client TLS settings that travel to executors (an ``SSLContext`` cannot be pickled).

    Paths are read on the executors, so they must exist there. ``verify=False`` turns
    certificate and hostname checks off (tests only).
    """

    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: bool = True
    server_hostname: str | None = None

    def context(self) -> ssl.SSLContext:
        return client_ssl_context(
            cafile=self.cafile, certfile=self.certfile, keyfile=self.keyfile, verify=self.verify
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What a pooled connection is keyed by: the URL and how to connect to it."""

    url: str
    tls: Tls | None = None
    connect_timeout: float = 10.0
    protocol_options: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments for the protocol peer (``ping_interval``, ``heartbeat_interval``)."""


class _Pooled:
    """A link in the pool, the rows on it and when a row last took it."""

    __slots__ = ("calls", "closed", "link", "used")

    def __init__(self, link: Link) -> None:
        self.link = link
        self.calls = 0
        self.used = 0
        self.closed = False


class ConnectionPool:
    """One :class:`Link` (a connection, reconnected on demand) per endpoint, at most
    ``max_connections`` of them (see the module's docstring); on its loop only, but for
    :meth:`link` and :attr:`connects`.

    Calls that find no connection wait for the link's reconnect task within their time
    budget (see :mod:`rpc.spark.reconnect`); a peer that stays down makes them fail with
    the cause of its last failed connection attempt.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, errors: LoopErrors) -> None:
        self.loop = loop
        self.errors = errors
        self._links: dict[Endpoint, _Pooled] = {}
        self._uses = 0
        """Links taken so far: a link's ``used`` is this count when it was last taken."""
        self._closing: set[asyncio.Task[None]] = set()  # links closed to make room
        self._given_back: asyncio.Future[None] | None = None
        """Resolved (and dropped) when a link has no row left on it and rows wait for room."""
        self._closed_connects = 0
        self._bound = 0
        """The largest ``max_connections`` any caller gave (UDFs share the pool)."""

    def __len__(self) -> int:
        return len(self._links)

    def borrower(self, endpoint: Endpoint, max_connections: int) -> Borrower:
        """How one caller's rows take the endpoint's link (see :class:`Borrower`)."""
        return Borrower(self, endpoint, max_connections)

    def link(self, endpoint: Endpoint, max_connections: int = MAX_CONNECTIONS) -> Link:
        """The endpoint's link, made on first use (for statistics and tests; rows take it
        with a :class:`Borrower`). From any thread: off the loop, it waits for the loop to
        find or make it. PoolFull when the pool is full and every link has rows on it."""
        with contextlib.suppress(RuntimeError):  # no loop running in this thread
            if asyncio.get_running_loop() is self.loop:
                return self._link(endpoint, max_connections)

        async def on_the_loop() -> Link:
            return self._link(endpoint, max_connections)

        return asyncio.run_coroutine_threadsafe(on_the_loop(), self.loop).result()

    def _link(self, endpoint: Endpoint, max_connections: int) -> Link:
        pooled = self._entry(endpoint, max_connections)
        if pooled is None:
            raise PoolFull(self._full(0.0))
        return pooled.link

    def _entry(self, endpoint: Endpoint, max_connections: int) -> _Pooled | None:
        """The endpoint's entry, made if need be (None: no room); making one in a full pool
        closes the least recently used link with no row on it."""
        pooled = self._links.get(endpoint)
        if pooled is not None:
            return pooled
        self._bound = max(self._bound, max_connections)
        if len(self._links) >= self._bound:
            idle = [(p.used, e) for e, p in self._links.items() if p.calls == 0]
            if not idle:
                return None
            self._close(min(idle, key=lambda used_endpoint: used_endpoint[0])[1])
        pooled = _Pooled(Link(self.loop, endpoint.url, lambda: self._connect(endpoint)))
        self._links[endpoint] = pooled
        return pooled

    def _taken(self, pooled: _Pooled) -> None:
        pooled.calls += 1
        self._uses += 1
        pooled.used = self._uses

    def _given(self, pooled: _Pooled) -> None:
        pooled.calls -= 1
        if pooled.calls == 0 and self._given_back is not None:
            given_back, self._given_back = self._given_back, None
            given_back.set_result(None)

    async def _room(self, deadline: float) -> None:
        """Wait until a link has no row left on it, or until ``deadline`` (loop time)."""
        if self._given_back is None:
            self._given_back = self.loop.create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._given_back), deadline - self.loop.time())

    def _close(self, endpoint: Endpoint) -> None:
        pooled = self._links.pop(endpoint)
        pooled.closed = True
        link = pooled.link
        task = self.loop.create_task(link.close())
        self._closing.add(task)

        def closed(task: asyncio.Task[None]) -> None:
            self._closing.discard(task)
            self._closed_connects += link.connects

        task.add_done_callback(closed)

    def _full(self, waited: float) -> str:
        return (
            f"all {len(self._links)} connections of this Python worker (max_connections="
            f"{self._bound}, the largest its UDFs gave) have calls in flight; waited "
            f"{waited:.1f} s for one"
        )

    async def _connect(self, endpoint: Endpoint) -> Peer:
        errors, before = self.errors, self.errors.count
        try:
            return await _connect(endpoint)
        except Exception as exc:
            if errors.count == before or errors.last is None:
                raise
            # the real cause died in a protocol callback (asyncio only logged it); the
            # core then fails with something less telling
            raise errors.last from exc

    @property
    def connects(self) -> int:
        """Connections opened so far, closed links' included (a statistic for tests and logs)."""
        links = [p.link for p in list(self._links.values())]
        return self._closed_connects + sum(link.connects for link in links)

    async def close(self) -> None:
        """Close every link (rows still on them then fail) and wait for links closed to
        make room."""
        pooled = list(self._links.values())
        self._links.clear()
        for p in pooled:
            p.closed = True
        closing = list(self._closing)
        await asyncio.gather(*(p.link.close() for p in pooled), *closing, return_exceptions=True)


class Borrower:
    """One caller's rows' way to its endpoint's link, on the pool's loop: each row takes it
    (:meth:`take`, or :meth:`wait` when the pool has no room) and gives it back when done,
    and a link is not closed to make room while rows have it. The link is kept between
    rows, so a row costs no lookup while the pool has not closed it."""

    __slots__ = ("_endpoint", "_limit", "_pool", "_pooled")

    def __init__(self, pool: ConnectionPool, endpoint: Endpoint, max_connections: int) -> None:
        self._pool = pool
        self._endpoint = endpoint
        self._limit = max_connections
        self._pooled: _Pooled | None = None

    def take(self) -> Link | None:
        """The link for one row (give it back with :meth:`give_back`); None when the pool
        is full and every link has rows on it."""
        pooled = self._pooled
        if pooled is None or pooled.closed:
            pooled = self._pooled = self._pool._entry(self._endpoint, self._limit)
            if pooled is None:
                return None
        self._pool._taken(pooled)
        return pooled.link

    async def wait(self, deadline: float) -> Link:
        """:meth:`take`, waiting until the loop's time ``deadline`` for a link to be given
        back when none can be had; PoolFull after that (nothing was sent)."""
        pool = self._pool
        started = pool.loop.time()
        while (link := self.take()) is None:
            now = pool.loop.time()
            if now >= deadline:
                raise PoolFull(pool._full(now - started))
            await pool._room(deadline)
        return link

    def give_back(self, link: Link) -> None:
        """A row is done with ``link`` (from :meth:`take` or :meth:`wait`)."""
        pooled = self._pooled
        if pooled is not None and pooled.link is link:  # else the pool was closed under it
            self._pool._given(pooled)


async def _connect(endpoint: Endpoint) -> Peer:
    tls = endpoint.tls
    peer: Peer = await connect(
        endpoint.url,
        registry=Registry(),  # the remote side may not call anything on executors
        options=Options(retries=0),  # retry results are the caller's to honour
        ssl=tls.context() if tls is not None else None,
        server_hostname=tls.server_hostname if tls is not None else None,
        connect_timeout=endpoint.connect_timeout,
        reconnect=False,  # the Link reconnects (rpc.spark.reconnect)
        **dict(endpoint.protocol_options),
    )
    return peer
