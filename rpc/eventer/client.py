"""Eventer client on peerwire's Chatter core.

    async with await connect("tcp+sbs://127.0.0.1:23012", "app/one",
                             subscriptions=[("a", "*")]) as client:
        events = await client.register([RegisterEvent(("a", "b"))], with_response=True)
        result = await client.query(QueryLatestParams([("a", "*")]))
        async for events in client.events():
            ...

Notifications are delivered in arrival order, one at a time, to ``events_cb`` (sync or
async) and to every :meth:`Client.events` iterator; an events notification that asks for
an ack (last = False) is acked once the callback returned and the events are queued.
Status notifications go to ``status_cb`` in the same order, and so does the status in each
init response (hat's client does not call ``status_cb`` for it): a callback sees every
status, including the one a reconnect finds.

With ``reconnect=True`` the client is :func:`rpc.connect`'s reconnecting client (back-off
with full jitter from ``reconnect_delay`` up to ``reconnect_max_delay``, failing over
between URLs), and every new connection is initialised again (same name, token and
subscriptions) before any call goes out on it. Calls made meanwhile wait for it up to their
timeout; a query in flight when the connection dropped is sent again, a registration is not
(``rpc.ConnectionClosed``: it may have been registered). Without ``reconnect`` the client
closes when its connection drops (``closed`` at once; what it received is still delivered).
Registrations lost unconfirmed are counted and logged (:mod:`rpc.eventer.confirm`).
Notifications are taken in by :class:`~rpc.eventer.incoming.Incoming`, a part the client
owns (with the server's last status); while their bounds hold the connection's input, the
loop watches its socket for the server's close (:mod:`rpc.eventer.hold_watch`).

The Eventer exists only in the current Chatter dialect: a ``tcp+sbs``/``ssl+sbs`` URL
without ``?dialect=`` uses ``HatChatter``; ``?dialect=Hat`` is refused. ``max_size`` (16 MiB
by default) bounds every message both ways; a registration that would not fit raises
:class:`RegistrationTooLarge` before anything is sent.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from collections.abc import Iterable, Sequence

import rpc
from rpc.eventer import common
from rpc.eventer.addresses import address_text, eventer_url
from rpc.eventer.common import (
    MSG_INIT_REQ,
    MSG_INIT_RES,
    MSG_QUERY_REQ,
    MSG_QUERY_RES,
    MSG_REGISTER_REQ,
    MSG_REGISTER_RES,
    Event,
    EventerInitError,
    EventerInitTimeout,
    EventType,
    QueryError,
    QueryParams,
    QueryResult,
    RegisterEvent,
    RegistrationTooLarge,
    Status,
)
from rpc.eventer.confirm import Confirmations
from rpc.eventer.deliveries import Deliveries, ReaderIterator
from rpc.eventer.incoming import EventsCb, Incoming, StatusCb
from rpc.eventer.iterators import EventsIterator, EventsQueue

log = logging.getLogger("peerwire.eventer.client")

EVENTS_QUEUE_BYTES = 16 * 1024 * 1024
"""Default ``events_queue_bytes`` of :func:`connect` (see there)."""


async def connect(
    url: str | Sequence[str],
    client_name: str,
    *,
    client_token: str | None = None,
    subscriptions: Iterable[EventType] = (),
    server_id: int | None = None,
    persisted: bool = False,
    status_cb: StatusCb | None = None,
    events_cb: EventsCb | None = None,
    reconnect: bool = False,
    reconnect_delay: float = 0.5,
    reconnect_max_delay: float = 10.0,
    timeout: float = 10.0,
    events_queue_size: int = 1024,
    events_queue_bytes: int = EVENTS_QUEUE_BYTES,
    ssl: ssl_module.SSLContext | None = None,
    server_hostname: str | None = None,
    max_size: int = 16 * 1024 * 1024,
    ping_interval: float | None = 20.0,
    ping_timeout: float = 20.0,
) -> Client:
    """Connect and init; raises :class:`EventerInitError` if the server refuses the init
    (the first attempt is never retried), :class:`EventerInitTimeout` (an
    ``rpc.RequestTimeout``) if it does not answer it within ``timeout``,
    ``rpc.ConnectionClosed`` / OSError if the server is unreachable (every URL of a list),
    ValueError for a URL that cannot carry the Eventer.

    ``max_size``: largest message in bytes, both ways; raise it to read results of a
    server configured with a larger ``max_message_size`` (hat-event's has no limit).
    ``events_queue_size`` (1,024) and ``events_queue_bytes`` (16 MiB, bytes as received):
    notifications (events, status) received and not yet handed to the callbacks and
    iterators; the one that passes either goes in, and the connection then stops reading
    from the server until delivery is back under both, so a slow callback slows the server
    down (TCP) instead of growing memory. Both also bound each :meth:`Client.events`
    iterator's queue (lists, and bytes as received), whose reader slows delivery the same
    way. Each at least 1 (ValueError). A server's close is seen meanwhile, unread, by the
    loop watching the socket (Linux's epoll; no timer): at its FIN the rest (at most the
    receive buffer) is read and delivered, answers included, at a reset dropped; within
    one loop iteration of the FIN or reset reaching us, or ``ping_timeout / 2`` and a round
    trip when our closed window keeps its FIN out (our Pings draw a reset); without
    ``select.epoll``, within ``ping_timeout`` (:mod:`rpc.eventer.hold_watch`).
    ``ping_interval`` and ``ping_timeout`` (20 s each, as hat's) are the Chatter
    connection's (:class:`rpc.ChatterPeer`)."""
    urls = [url] if isinstance(url, str) else list(url)
    client = Client(
        [eventer_url(u) for u in urls],
        client_name,
        client_token=client_token,
        subscriptions=subscriptions,
        server_id=server_id,
        persisted=persisted,
        status_cb=status_cb,
        events_cb=events_cb,
        reconnect=reconnect,
        reconnect_delay=reconnect_delay,
        reconnect_max_delay=reconnect_max_delay,
        timeout=timeout,
        events_queue_size=events_queue_size,
        events_queue_bytes=events_queue_bytes,
        ssl=ssl,
        server_hostname=server_hostname,
        max_size=max_size,
    )
    await client._start(ping_interval=ping_interval, ping_timeout=ping_timeout)
    return client


class Client:
    """One Eventer client; create it with :func:`connect`."""

    def __init__(
        self,
        urls: Sequence[str],
        client_name: str,
        *,
        client_token: str | None,
        subscriptions: Iterable[EventType],
        server_id: int | None,
        persisted: bool,
        status_cb: StatusCb | None,
        events_cb: EventsCb | None,
        reconnect: bool,
        reconnect_delay: float,
        reconnect_max_delay: float,
        timeout: float,
        events_queue_size: int,
        events_queue_bytes: int,
        ssl: ssl_module.SSLContext | None,
        server_hostname: str | None,
        max_size: int,
    ) -> None:
        self.urls = tuple(urls)
        self.max_size = max_size
        self._options = rpc.Options(max_size=max_size)
        self.client_name = client_name
        self.subscriptions = [tuple(t) for t in subscriptions]
        self.timeout = timeout
        self._init_req = common.encode(
            MSG_INIT_REQ,
            common.init_req_to_sbs(
                client_name, client_token, self.subscriptions, server_id, persisted
            ),
        )
        self._policy = rpc.Reconnect(
            backoff=rpc.Backoff(reconnect_delay, reconnect_max_delay),
            attempts=None if reconnect else 0,
        )
        if events_queue_size < 1 or events_queue_bytes < 1:
            raise ValueError("events_queue_size and events_queue_bytes must be at least 1")
        self._queue_size = events_queue_size
        self._queue_bytes = events_queue_bytes
        self._ssl = ssl
        self._server_hostname = server_hostname
        self._conn: rpc.ReconnectingPeer | None = None
        self._inits = 0
        self._closing = False
        self._closed = asyncio.get_running_loop().create_future()
        self._ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Set once the iterators are ended: nothing more is delivered."""
        self._deliveries = Deliveries(events_queue_size, events_queue_bytes)
        self._confirmations = Confirmations(client_name, timeout)
        self._iterators: set[EventsQueue] = set()
        """The queues of the :meth:`events` iterators still in use."""
        self._incoming = Incoming(self, self._deliveries, status_cb, events_cb, self._iterators)
        self._delivery = asyncio.get_running_loop().create_task(
            self._deliveries.run(self._incoming.hand, self._end_iterators)
        )

    # --- public ----------------------------------------------------------------------------

    @property
    def status(self) -> Status:
        """The server's last announced status."""
        return self._incoming.status

    @property
    def registry(self) -> rpc.Registry:
        """The handlers of the client's connections (the server's notifications)."""
        return self._incoming.registry

    @property
    def url(self) -> str:
        """The URL of the current connection (or the one being tried, or the last)."""
        return self._conn.url if self._conn is not None else self.urls[0]

    @property
    def connection(self) -> rpc.ReconnectingPeer | None:
        """The client's connection (its state, transitions, remote address)."""
        return self._conn

    @property
    def is_connected(self) -> bool:
        conn = self._conn
        return (
            conn is not None and conn.is_open and conn.connection_state is rpc.ConnectionState.OPEN
        )

    @property
    def queued_bytes(self) -> int:
        """Bytes (as received) of the notifications not yet handed to the callbacks."""
        return self._deliveries.queued_bytes

    @property
    def unconfirmed_registrations(self) -> int:
        """Registrations sent without response whose connection dropped before the server
        confirmed them: each may or may not have been registered (also logged, see
        :mod:`rpc.eventer.confirm`)."""
        return self._confirmations.unconfirmed

    @property
    def unconfirmed_events(self) -> int:
        """The events of :attr:`unconfirmed_registrations`."""
        return self._confirmations.unconfirmed_events

    @property
    def awaiting_confirmation(self) -> int:
        """Registrations sent without response on the current connection that the server
        has not confirmed yet."""
        return self._confirmations.pending

    @property
    def closed(self) -> asyncio.Future[None]:
        """Resolves once the client is closed for good (closed, or lost without reconnect)."""
        return self._closed

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait for an initialised connection; TimeoutError after ``timeout`` (default:
        the client's), ``rpc.ConnectionClosed`` once the client is closed."""
        if self._conn is None or self._closing:
            raise rpc.ConnectionClosed("eventer client is closed")
        await self._conn.wait_open(self.timeout if timeout is None else timeout)

    async def register(
        self, events: Sequence[RegisterEvent], with_response: bool = False
    ) -> list[Event] | None:
        """Register one session. With a response: its events, or None if the server
        refused them; without: None once sent, after waiting (up to ``timeout``, then
        RequestTimeout, nothing sent) while the connection's output is over its
        ``high_water``, as a request waits: a server that stopped reading would otherwise
        leave every registration buffered here. Sent without response, it is lost if its
        connection drops before the server read it: counted and logged then
        (:attr:`unconfirmed_registrations`). Raises :class:`RegistrationTooLarge`
        (nothing sent) if the request, or the events it would bring back, exceed
        ``max_size``."""
        data = common.encode(MSG_REGISTER_REQ, [common.register_event_to_sbs(e) for e in events])
        size = len(data) + len(events) * common.MAX_EVENT_GROWTH + common.ENVELOPE_RESERVE
        if size > self.max_size:
            raise RegistrationTooLarge(
                f"registration of {len(data)} bytes ({len(events)} events) would not fit in "
                f"a message of max_size {self.max_size}"
            )
        peer = await self._ready_peer()
        if not with_response:
            if peer.outbox.blocked:
                try:  # reading goes on meanwhile: the server may wait for us to read it
                    async with asyncio.timeout(self.timeout):
                        with self._deliveries.answer_awaited():
                            await peer.drain()
                except TimeoutError:
                    raise rpc.RequestTimeout(
                        f"register: the server took none of our output for {self.timeout} s"
                    ) from None
            peer.notify(MSG_REGISTER_REQ, data)
            self._confirmations.sent(peer, len(events))
            return None
        # not idempotent: lost in flight, it fails (the server may have registered it)
        mark = self._confirmations.mark(peer)
        with self._deliveries.answer_awaited():
            res = await peer.request(MSG_REGISTER_REQ, data, timeout=self.timeout, raw=True)
        self._confirmations.answered(mark)
        kind, value = common.decode(MSG_REGISTER_RES, res)
        if kind == "events":
            return [common.event_from_sbs(e) for e in value]
        return None

    async def query(self, params: QueryParams, *, timeout: float | None = None) -> QueryResult:
        """Raises :class:`QueryError` if the server answers with an error (a latest result
        larger than its ``max_message_size``)."""
        data = common.encode(MSG_QUERY_REQ, common.query_params_to_sbs(params))
        conn = self._ready_conn()
        mark = self._confirmations.mark(conn.connection)
        try:
            with self._deliveries.answer_awaited():
                res = await conn.request(
                    MSG_QUERY_REQ,
                    data,
                    timeout=self.timeout if timeout is None else timeout,
                    raw=True,
                    idempotent=True,  # a query changes nothing: sent again after a reconnect
                )
        except rpc.RemoteError as exc:
            self._confirmations.answered(mark)  # an error comes in order too
            raise QueryError(str(exc)) from None
        self._confirmations.answered(mark)
        return common.query_result_from_sbs(common.decode(MSG_QUERY_RES, res))

    def events(self) -> EventsIterator:
        """Every events notification from now on (one list per notification), those that
        arrive before the first iteration included; ends, after what is already queued,
        when the client closes. Each iterator queues at most ``events_queue_size`` lists
        (1,024) and ``events_queue_bytes`` bytes as received (16 MiB; a larger list goes in
        alone): a full one holds up delivery, then the connection (and, with acks, the
        server), until it is read, closed (``aclose``) or dropped (the reader's own requests,
        between a list it took and the next, are answered meanwhile: see
        :class:`~rpc.eventer.deliveries.ReaderIterator`); one that is no longer referenced
        holds nothing, started or not."""
        queue = EventsQueue(self._queue_size, self._queue_bytes)
        return ReaderIterator(queue, self._iterators, self._ended, self._deliveries)

    async def close(self) -> None:
        """Close the connection (its calls in flight get up to 1 s), dropping notifications
        not delivered yet or coming meanwhile (acked, with acks). One lost for good first
        delivers what it brought, up to ``timeout`` (unless closed by a callback or reader)."""
        if self._closing:
            await asyncio.shield(self._closed)
            return
        if self._closed.done() and not self._deliveries.handling():  # lost for good
            await asyncio.wait((self._delivery,), timeout=self.timeout)
            if self._closing:  # closed meanwhile, by a callback
                return
        self._closing = True
        self._confirmations.close()
        self._deliveries.closing()  # frees what the drain would wait for: the callback's
        try:
            if self._conn is not None:
                await self._conn.close(drain_timeout=1.0)
        finally:  # cancelled too (its connection then closed at once): closed, ended
            self._finish()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- connection ------------------------------------------------------------------------

    async def _start(self, *, ping_interval: float | None, ping_timeout: float) -> None:
        """The first connection (its init refused: EventerInitError, never retried)."""
        self._conn = await rpc.connect(
            self.urls,
            registry=self.registry,
            ssl=self._ssl,
            server_hostname=self._server_hostname,
            connect_timeout=self.timeout,
            options=self._options,
            sbs_repo=common.peer_repository(),
            reconnect=self._policy,
            on_connect=self._init,
            on_state=self._on_state,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
        )

    async def _init(self, peer: rpc.Peer) -> None:
        """Initialise a new connection (its subscriptions with it), before any call goes
        out on it; a refusal fails this connection attempt."""
        try:
            res = await peer.request(MSG_INIT_REQ, self._init_req, timeout=self.timeout, raw=True)
        except rpc.RequestTimeout:
            raise EventerInitTimeout(
                f"eventer server {address_text(peer.remote_address)} accepted the connection but "
                f"did not answer its handshake (init) within {self.timeout} s"
            ) from None
        kind, value = common.decode(MSG_INIT_RES, res)
        if kind == "error":
            raise EventerInitError(value)
        self._inits += 1
        if self._inits > 1:
            log.info(
                "eventer client %r reconnected to %s and resubscribed to %d event types",
                self.client_name,
                peer.remote_address,
                len(self.subscriptions),
            )
        self._incoming.set_status(common.status_from_sbs(value))

    def _on_state(self, transition: rpc.Transition) -> None:
        state = transition.state
        if self._closing:
            return
        if state is rpc.ConnectionState.RECONNECTING or state is rpc.ConnectionState.CLOSED:
            self._confirmations.dropped()  # what the server did not confirm may be lost
        if state is rpc.ConnectionState.CLOSED:
            self._finish(deliver=True)  # lost without reconnecting

    def _finish(self, deliver: bool = False) -> None:
        """Closed for good. ``deliver`` (the connection was lost): what was received is
        still handed to the callbacks and iterators, in order, then the iterators end, as
        hat's client calls back before it reads on; otherwise (:meth:`close`) what is not
        delivered yet is dropped and the iterators end after what they hold."""
        self._confirmations.close()
        self._deliveries.release()
        if not self._closed.done():
            self._closed.set_result(None)
        if deliver and not self._delivery.done():
            self._deliveries.put(("end", None, None, 0))
        else:
            self._delivery.cancel()
            self._end_iterators()

    def _end_iterators(self) -> None:
        if not self._ended.done():
            self._ended.set_result(None)
            for queue in self._iterators:  # each ends once it has taken what it holds
                queue.end()

    def _ready_conn(self) -> rpc.ReconnectingPeer:
        if self._closing or self._closed.done() or self._conn is None:
            raise rpc.ConnectionClosed("eventer client is closed")
        return self._conn

    async def _ready_peer(self) -> rpc.Peer:
        """The initialised connection, waiting for a reconnect up to the timeout."""
        conn = self._ready_conn()
        try:
            return await conn.wait_open(self.timeout)
        except TimeoutError:
            raise rpc.ConnectionClosed(f"not reconnected within {self.timeout} s") from None


__all__ = [
    "Client",
    "EventerInitError",
    "EventerInitTimeout",
    "EventsCb",
    "EventsIterator",
    "StatusCb",
    "connect",
    "eventer_url",
]
