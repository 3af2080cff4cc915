"""Eventer server on peerwire's Chatter core, persisting to SQLite.

How the messages map onto the core (peers use :func:`~rpc.eventer.common.peer_repository`,
so HatEventer payloads arrive and leave as SBS bytes this module encodes itself):

=========================  ================================================================
MsgInitReq (last=False)    request handler; answers MsgInitRes (``rpc.Reply``); a refused
                           init is answered with the error, then closed after 0.5 s
MsgRegisterReq             request (last=False) -> MsgRegisterRes after the commit;
                           notification (last=True) -> registered, nothing answered
MsgQueryReq                request -> MsgQueryRes; a latest result over
                           ``max_message_size`` -> an error reply (``PeerwireRpc.Error``)
MsgStatusNotify            ``peer.notify`` (a one-message conversation)
MsgEventsNotify            ``peer.notify``; with ``events_ack``: ``peer.request`` whose
                           result is the client's MsgEventsAck
=========================  ================================================================

Durability: a register request becomes a *session* (ids and one timestamp assigned at
once, in arrival order). Sessions queue for a single writer that commits everything
queued in one SQLite transaction (group commit) on its own thread. Only after the commit
are the session's events answered, notified (to every client, ``persisted`` or not) or
visible to queries, so the server never reports an event it could then lose. A query waits
for the sessions registered before it, so a client reads its own writes.

Sizes: every message fits in ``config.max_message_size``. A registration whose events would
not fit in one response or notification is refused alone (failure response); timeseries and
server results are cut by size as by count (``more_follows``); a latest result that cannot
fit is answered with an error. Stopping announces STOPPING, commits what is queued, then
announces STANDBY (as the reference does) before the connections close.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl as ssl_module
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import rpc
from rpc.eventer import common
from rpc.eventer.common import (
    MSG_EVENTS_NOTIFY,
    MSG_INIT_REQ,
    MSG_INIT_RES,
    MSG_QUERY_REQ,
    MSG_QUERY_RES,
    MSG_REGISTER_REQ,
    MSG_REGISTER_RES,
    MSG_STATUS_NOTIFY,
    Event,
    EventType,
    InvalidMessage,
    QueryLatestParams,
    QueryParams,
    QueryResult,
    QueryServerParams,
    QueryTimeseriesParams,
    RegisterEvent,
    Status,
    Subscription,
)
from rpc.eventer.config import ServerConfig
from rpc.eventer.store import LatestRow, ResultTooLarge, Row, Store, TimeseriesQuery
from transports.stream import server_ssl_context
from wire.chatter import encode_integer

log = logging.getLogger("peerwire.eventer.server")

INIT_REFUSED_CLOSE_TIMEOUT = 0.5
"""After a refused init, seconds the client gets to close before we do (the reference's)."""
MAX_BATCH_EVENTS = 50_000
"""Events written in one transaction at most (bounds commit latency)."""
INLINE_COMMIT_ROWS = 8
"""With ``sync = "normal"`` (no fsync), batches up to this size commit on the event loop
thread: about 60 us, less than the round trip to the writer thread."""
CHECKPOINT_ROWS = 5_000
"""Rows committed between two background WAL checkpoints."""
MAX_PENDING_EVENTS = 500_000
"""Events waiting for their commit at most; past it registrations fail (bounded memory)."""
MAX_QUEUED_NOTIFICATIONS = 10_000
"""Notifications waiting for a slow client's acks at most; past it it is disconnected."""
MATCH_CACHE_SIZE = 65_536
"""Event types whose subscription match is remembered per client."""
STOP_FLUSH_TIMEOUT = 1.0
"""Seconds ``close`` waits for ack-paced clients to take their last notifications."""

_CLIENT = "eventer.client"
_REFUSED = "eventer.refused"


@dataclass(slots=True, eq=False)
class ClientInfo:
    """One initialised Eventer connection."""

    id: int
    name: str
    token: str | None
    subscription: Subscription
    server_id: int | None
    persisted: bool
    peer: rpc.Peer = field(repr=False)
    since_session: int = 0
    """Sessions up to this one were registered before the client's init: not notified."""
    matches: dict[EventType, bool] = field(default_factory=dict, repr=False)
    sender: _AckSender | None = field(default=None, repr=False)


class _Session:
    """One registration: its events' SBS bytes, store rows and types, and who waits."""

    __slots__ = ("blobs", "future", "id", "rows", "types")

    def __init__(self, session_id: int) -> None:
        self.id = session_id
        self.blobs: list[bytes] = []
        self.rows: list[Row] = []
        self.types: list[EventType] = []
        self.future: asyncio.Future[list[bytes] | None] | None = None


class EventerServer:
    """``async with EventerServer(config) as server``: listens on every ``config.listen``.

    Besides serving Eventer clients, :meth:`register` and :meth:`query` give in-process
    code the same operations, and :meth:`set_status` announces a status change.
    """

    def __init__(self, config: ServerConfig, *, ssl: ssl_module.SSLContext | None = None) -> None:
        self.config = config
        self.server_id = config.server_id
        self.servers: list[rpc.Server] = []
        self._ssl = ssl
        self._status = Status.STANDBY
        self._store = Store(config.database, sync=config.sync)
        self._writer_exec: ThreadPoolExecutor | None = None
        self._checkpoint_exec: ThreadPoolExecutor | None = None
        self._checkpoint: asyncio.Future[None] | None = None
        self._rows_since_checkpoint = 0
        self._reader_exec: ThreadPoolExecutor | None = None
        self._clients: dict[rpc.Peer, ClientInfo] = {}
        self._conn_ids = itertools.count(1)
        self._type_ids: dict[EventType, int] = {}
        self._type_list: list[tuple[int, EventType]] = []
        self._unsaved_types: dict[int, EventType] = {}
        self._pattern_cache: dict[tuple[EventType, ...], tuple[int, list[int]]] = {}
        self._session = 0
        self._processed = 0
        self._last_ts = 0
        self._pending: deque[_Session] = deque()
        self._pending_events = 0
        self._wake: asyncio.Event | None = None
        self._barriers: list[tuple[int, asyncio.Future[None]]] = []
        self._writer_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._started = False
        # events of one message: its size less the envelope, an array count and a flag
        self._max_event_bytes = config.max_message_size - common.ENVELOPE_RESERVE - 11
        self.registry = self._make_registry()

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def status(self) -> Status:
        return self._status

    @property
    def urls(self) -> list[str]:
        """Bound URLs (port 0 replaced by the real port)."""
        return [str(s.url) for s in self.servers]

    @property
    def clients(self) -> list[ClientInfo]:
        return list(self._clients.values())

    async def start(self) -> EventerServer:
        loop = asyncio.get_running_loop()
        self._writer_exec = ThreadPoolExecutor(1, thread_name_prefix="eventer-writer")
        self._checkpoint_exec = ThreadPoolExecutor(1, thread_name_prefix="eventer-checkpoint")
        self._reader_exec = (
            self._writer_exec
            if self._store.single_connection
            else ThreadPoolExecutor(2, thread_name_prefix="eventer-reader")
        )
        try:
            state = await loop.run_in_executor(self._writer_exec, self._store.open, self.server_id)
        except BaseException:
            self._shutdown_executors()
            raise
        self._type_list = list(state.types)
        self._type_ids = {t: i for i, t in state.types}
        self._session = self._processed = state.last_session
        self._last_ts = state.last_ts or 0
        self._wake = asyncio.Event()
        self._writer_task = loop.create_task(self._write_loop())
        self._started = True
        self._status = Status.OPERATIONAL
        try:
            if self.config.system_events:
                await self._register_system(("engine",), "STARTED")
            ctx = self._ssl
            if ctx is None and self.config.tls is not None:
                tls = self.config.tls
                ctx = server_ssl_context(tls.cert, tls.key, client_cafile=tls.client_ca)
            options = rpc.Options(
                max_concurrent=1 << 20,
                timeout=self.config.ack_timeout,
                max_size=self.config.max_message_size,
            )
            for url in self.config.listen:
                server = rpc.serve(
                    url,
                    registry=self.registry,
                    options=options,
                    ssl=ctx if rpc.parse_url(url).tls else None,
                    sbs_repo=common.peer_repository(),
                )
                await server.start()
                self.servers.append(server)
                log.info("eventer server %d listening on %s", self.server_id, server.url)
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """Announce STOPPING, commit what is queued (plus the STOPPED event), announce
        STANDBY, close every connection, then the database."""
        if self._closing or not self._started:
            return
        self._closing = True
        await self.set_status(Status.STOPPING)
        if self.config.system_events:
            with contextlib.suppress(Exception):
                await self._register_system(("engine",), "STOPPED", force=True)
        await self._wait_processed(self._session)
        await self.set_status(Status.STANDBY)
        flushed = [
            asyncio.ensure_future(c.sender.idle.wait())
            for c in self._clients.values()
            if c.sender is not None
        ]
        if flushed:
            await asyncio.wait(flushed, timeout=STOP_FLUSH_TIMEOUT)
            for waiter in flushed:
                waiter.cancel()
        for server in self.servers:
            await server.close(drain_timeout=STOP_FLUSH_TIMEOUT)
        for task in list(self._tasks):
            task.cancel()
        if self._writer_task is not None:
            self._writer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer_task
        if self._checkpoint is not None:
            with contextlib.suppress(Exception):
                await self._checkpoint
        # queries of cancelled handlers may still run on reader threads: let them end
        # before their connections close
        if self._reader_exec is not None and self._reader_exec is not self._writer_exec:
            await asyncio.to_thread(self._reader_exec.shutdown, True)
        loop = asyncio.get_running_loop()
        assert self._writer_exec is not None
        await loop.run_in_executor(self._writer_exec, self._store.close)
        self._shutdown_executors()

    def _shutdown_executors(self) -> None:
        for executor in {self._writer_exec, self._reader_exec, self._checkpoint_exec}:
            if executor is not None:
                executor.shutdown(wait=False)

    async def __aenter__(self) -> EventerServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def set_status(self, status: Status) -> None:
        """Change the status and notify every client. Registration fails unless
        OPERATIONAL."""
        if status == self._status:
            return
        self._status = status
        data = common.encode(MSG_STATUS_NOTIFY, common.status_to_sbs(status))
        for client in list(self._clients.values()):
            self._send(client, MSG_STATUS_NOTIFY, data)

    # --- in-process API --------------------------------------------------------------------

    async def register(self, events: Sequence[RegisterEvent]) -> list[Event] | None:
        """Register one session; its events once committed, or None on failure."""
        data = common.encode(MSG_REGISTER_REQ, [common.register_event_to_sbs(e) for e in events])
        try:
            session = self._submit(data, True)
        except InvalidMessage:
            return None
        if session is None:
            return None
        assert session.future is not None
        blobs = await session.future
        return None if blobs is None else [_decode_event(b) for b in blobs]

    async def query(self, params: QueryParams) -> QueryResult:
        """Raises :class:`~rpc.eventer.common.QueryError` for a latest result larger than
        ``max_message_size``."""
        try:
            blobs, more = await self._query(params)
        except ResultTooLarge as exc:
            raise common.QueryError(str(exc)) from None
        return QueryResult([_decode_event(b) for b in blobs], more)

    # --- handlers ----------------------------------------------------------------------

    def _make_registry(self) -> rpc.Registry:
        registry = rpc.Registry()
        registry.handle(MSG_INIT_REQ)(self._on_init)
        registry.handle(MSG_REGISTER_REQ)(self._on_register_request)
        registry.handle_notification(MSG_REGISTER_REQ)(self._on_register_notification)
        registry.handle(MSG_QUERY_REQ)(self._on_query)
        # messages only a server sends, or only inside a conversation: the reference
        # closes a connection that starts a conversation with one of them
        for msg_type in (
            common.MSG_INIT_RES,
            MSG_STATUS_NOTIFY,
            MSG_EVENTS_NOTIFY,
            common.MSG_EVENTS_ACK,
            MSG_REGISTER_RES,
            MSG_QUERY_RES,
        ):
            registry.handle(msg_type)(self._on_unexpected)
            registry.handle_notification(msg_type)(self._on_unexpected)
        return registry

    def _on_unexpected(self, data: bytes) -> None:
        self._drop(rpc.current_peer.get(), "unexpected message type")

    def _on_init(self, data: bytes) -> rpc.Reply:
        peer = rpc.current_peer.get()
        if _CLIENT in peer.state or _REFUSED in peer.state:
            self._drop(peer, "init sent twice")
            raise InvalidMessage("init sent twice")
        try:
            req = common.decode(MSG_INIT_REQ, data)
            subscription = Subscription(req["subscriptions"])
        except (InvalidMessage, ValueError) as exc:
            return self._refuse(peer, str(exc))
        token = common.optional_from_sbs(req["clientToken"])
        if token is not None and token != self.config.token:
            return self._refuse(peer, "invalid client token")
        if self._closing:
            return self._refuse(peer, "server is stopping")
        client = ClientInfo(
            id=next(self._conn_ids),
            name=req["clientName"],
            token=token,
            subscription=subscription,
            server_id=common.optional_from_sbs(req["serverId"]),
            persisted=req["persisted"],
            peer=peer,
        )
        if self.config.events_ack:
            client.sender = _AckSender(client, self.config.ack_timeout, self._spawn)
        if self.config.system_events:
            self._register_system_nowait(("eventer", client.name), "CONNECTED")
        client.since_session = self._session  # its own CONNECTED is not notified to it
        self._clients[peer] = client
        peer.state[_CLIENT] = client
        peer.closed.add_done_callback(lambda _: self._on_closed(peer))
        log.info(
            "eventer client %d %r connected from %s", client.id, client.name, peer.remote_address
        )
        res = ("success", common.status_to_sbs(self._status))
        return rpc.Reply(MSG_INIT_RES, common.encode(MSG_INIT_RES, res))

    def _refuse(self, peer: rpc.Peer, message: str) -> rpc.Reply:
        log.warning("eventer init from %s refused: %s", peer.remote_address, message)
        peer.state[_REFUSED] = True
        self._spawn(_close_later(peer, INIT_REFUSED_CLOSE_TIMEOUT))
        return rpc.Reply(MSG_INIT_RES, common.encode(MSG_INIT_RES, ("error", message)))

    def _on_closed(self, peer: rpc.Peer) -> None:
        client = self._clients.pop(peer, None)
        if client is None:
            return
        if client.sender is not None:
            client.sender.stop()
        log.info("eventer client %d %r disconnected", client.id, client.name)
        if self.config.system_events and not self._closing:
            self._register_system_nowait(("eventer", client.name), "DISCONNECTED")

    def _client(self) -> ClientInfo:
        """The calling connection's client; raises (after closing it) before an init."""
        client = self._client_or_drop()
        if client is None:
            raise InvalidMessage("message before a successful init")
        return client

    def _client_or_drop(self) -> ClientInfo | None:
        peer = rpc.current_peer.get()
        client = peer.state.get(_CLIENT)
        if client is None:
            self._drop(peer, "message before a successful init")
        return client

    def _drop(self, peer: rpc.Peer, reason: str) -> None:
        """The reference closes a connection that breaks the protocol; so do we."""
        log.warning("closing eventer connection from %s: %s", peer.remote_address, reason)
        peer.abort()

    def _on_register_request(self, data: bytes) -> Any:
        self._client()
        try:
            session = self._submit(data, True)
        except InvalidMessage as exc:
            log.warning("registration refused: %s", exc)
            session = None
        if session is None:
            return rpc.Reply(MSG_REGISTER_RES, common.encode_register_res(None))
        return self._register_reply(session)

    async def _register_reply(self, session: _Session) -> rpc.Reply:
        assert session.future is not None
        blobs = await session.future
        return rpc.Reply(MSG_REGISTER_RES, common.encode_register_res(blobs))

    def _on_register_notification(self, data: bytes) -> None:
        if self._client_or_drop() is None:
            return
        try:
            session = self._submit(data, False)
        except InvalidMessage as exc:
            log.warning("registration dropped: %s", exc)
            return
        if session is None:
            log.warning("registration without response dropped (status %s)", self._status.value)

    async def _on_query(self, data: bytes) -> rpc.Reply:
        self._client()
        peer = rpc.current_peer.get()
        try:
            params = common.query_params_from_sbs(common.decode(MSG_QUERY_REQ, data))
            blobs, more = await self._query(params)
        except ResultTooLarge as exc:
            # MsgQueryRes has no error field: an error reply; hat's client closes on it,
            # which fails its query instead of leaving it waiting forever
            log.warning("query from %s refused: %s", peer.remote_address, exc)
            raise common.QueryError(f"{exc} (max_message_size)") from None
        except (InvalidMessage, ValueError, KeyError) as exc:
            self._drop(peer, f"query failed: {exc}")
            raise
        return rpc.Reply(MSG_QUERY_RES, common.encode_query_result(blobs, more))

    # --- registration --------------------------------------------------------------------

    def _submit(self, data: bytes, respond: bool, force: bool = False) -> _Session | None:
        """Turn a MsgRegisterReq into a queued session (None: refused by status or load).

        Raises InvalidMessage for bytes that are not a valid MsgRegisterReq or hold a
        payload that is not JSON; nothing is registered then.
        """
        if (self._status is not Status.OPERATIONAL and not force) or not self._started:
            return None
        parts = common.split_register_req(data)
        if self._pending_events + len(parts) > MAX_PENDING_EVENTS:
            log.warning("registration refused: %d events wait for the disk", self._pending_events)
            return None
        for part in parts:
            if part.json is not None:
                common.check_json_text(part.json)
        session = _Session(self._session + 1)
        if not parts:
            if respond:
                session.future = asyncio.get_running_loop().create_future()
                session.future.set_result([])
            return session
        ts = max(common.now().to_us(), self._last_ts)  # never backwards: natural order
        s, us = divmod(ts, 1_000_000)
        ts_bytes = encode_integer(s) + encode_integer(us)
        server = self.server_id
        sid = session.id
        id_prefix = encode_integer(server) + encode_integer(sid)
        size = sum(len(p.type_bytes) + len(p.tail_bytes) for p in parts) + len(parts) * (
            len(id_prefix) + len(ts_bytes) + len(encode_integer(len(parts)))
        )
        if size > self._max_event_bytes:
            raise InvalidMessage(
                f"registration of {size} bytes of events exceeds max_message_size "
                f"{self.config.max_message_size}"
            )
        type_ids = self._type_ids
        blobs, rows, types = session.blobs, session.rows, session.types
        for instance, part in enumerate(parts, 1):
            event_type = part.type
            type_id = type_ids.get(event_type)
            if type_id is None:
                type_id = self._new_type(event_type)
            # Event = id, type, timestamp, sourceTimestamp, payload
            blob = (
                id_prefix + encode_integer(instance) + part.type_bytes + ts_bytes + part.tail_bytes
            )
            blobs.append(blob)
            rows.append((server, sid, instance, type_id, ts, part.source_key, blob))
            types.append(event_type)
        if respond:
            session.future = asyncio.get_running_loop().create_future()
        self._session = sid
        self._last_ts = ts
        self._pending.append(session)
        self._pending_events += len(rows)
        assert self._wake is not None
        self._wake.set()
        return session

    def _new_type(self, event_type: EventType) -> int:
        type_id = self._type_list[-1][0] + 1 if self._type_list else 1
        self._type_ids[event_type] = type_id
        self._type_list.append((type_id, event_type))
        self._unsaved_types[type_id] = event_type
        return type_id

    async def _register_system(self, suffix: EventType, status: str, force: bool = False) -> None:
        session = self._submit(self._system_event(suffix, status), True, force)
        if session is not None and session.future is not None:
            await session.future

    def _register_system_nowait(self, suffix: EventType, status: str) -> None:
        self._submit(self._system_event(suffix, status), False)

    def _system_event(self, suffix: EventType, status: str) -> bytes:
        event = RegisterEvent(
            ("event", str(self.server_id), *suffix), None, common.EventPayloadJson(status)
        )
        return common.encode(MSG_REGISTER_REQ, [common.register_event_to_sbs(event)])

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None and self._writer_exec is not None
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch: list[_Session] = []
            count = 0
            while self._pending and count < MAX_BATCH_EVENTS:
                session = self._pending.popleft()
                batch.append(session)
                count += len(session.rows)
            rows = [row for session in batch for row in session.rows]
            latest: dict[int, LatestRow] = {}
            for server, session_id, instance, type_id, ts, _, _ in rows:
                latest[type_id] = (type_id, server, session_id, instance, ts)
            types = list(self._unsaved_types.items())
            try:
                if count <= INLINE_COMMIT_ROWS and self.config.sync == "normal":
                    # no fsync: a tiny commit costs less than two thread hops
                    self._store.write(types, rows, list(latest.values()))
                else:
                    await loop.run_in_executor(
                        self._writer_exec, self._store.write, types, rows, list(latest.values())
                    )
            except Exception:
                log.exception("commit of %d events failed; their registrations fail", count)
                for session in batch:
                    if session.future is not None and not session.future.done():
                        session.future.set_result(None)
            else:
                self._rows_since_checkpoint += count
                if self._rows_since_checkpoint >= CHECKPOINT_ROWS and self._checkpoint is None:
                    self._start_checkpoint()
                for type_id, _ in types:
                    self._unsaved_types.pop(type_id, None)
                for session in batch:
                    self._notify(session)
                    if session.future is not None and not session.future.done():
                        session.future.set_result(session.blobs)
            finally:
                self._pending_events -= count
            self._processed = batch[-1].id
            if self._barriers:
                self._release_barriers()

    def _start_checkpoint(self) -> None:
        loop = asyncio.get_running_loop()
        self._rows_since_checkpoint = 0
        future = loop.run_in_executor(self._checkpoint_exec, self._store.checkpoint)
        self._checkpoint = future

        def done(f: asyncio.Future[None]) -> None:
            self._checkpoint = None
            if not f.cancelled() and f.exception() is not None:
                log.warning("WAL checkpoint failed: %s", f.exception())

        future.add_done_callback(done)

    def _release_barriers(self) -> None:
        waiting = []
        for target, future in self._barriers:
            if target <= self._processed:
                if not future.done():
                    future.set_result(None)
            else:
                waiting.append((target, future))
        self._barriers = waiting

    async def _wait_processed(self, session_id: int) -> None:
        if session_id <= self._processed:
            return
        future = asyncio.get_running_loop().create_future()
        self._barriers.append((session_id, future))
        await future

    # --- notification --------------------------------------------------------------------

    def _notify(self, session: _Session) -> None:
        """Send one committed session to every client whose filters select some of it."""
        full: bytes | None = None
        subsets: dict[tuple[int, ...], bytes] = {}
        types = session.types
        for client in list(self._clients.values()):
            if session.id <= client.since_session:
                continue
            if client.server_id is not None and client.server_id != self.server_id:
                continue
            sub = client.subscription
            if sub.matches_all:
                selected = None
            else:
                if not sub.query_types:
                    continue
                cache = client.matches
                chosen = []
                for i, event_type in enumerate(types):
                    hit = cache.get(event_type)
                    if hit is None:
                        if len(cache) >= MATCH_CACHE_SIZE:
                            cache.clear()
                        hit = cache[event_type] = sub.matches(event_type)
                    if hit:
                        chosen.append(i)
                if not chosen:
                    continue
                selected = None if len(chosen) == len(types) else tuple(chosen)
            if selected is None:
                if full is None:
                    full = common.encode_events(session.blobs)
                data = full
            else:
                data = subsets.get(selected)  # type: ignore[assignment]
                if data is None:
                    data = subsets[selected] = common.encode_events(
                        [session.blobs[i] for i in selected]
                    )
            self._send(client, MSG_EVENTS_NOTIFY, data)

    def _send(self, client: ClientInfo, msg_type: str, data: bytes) -> None:
        if client.sender is not None:
            client.sender.push(msg_type, data)
            return
        with contextlib.suppress(rpc.ConnectionClosed):
            client.peer.notify(msg_type, data)
            if client.peer.write_buffer_size > self.config.max_client_backlog:
                log.warning("client %s reads too slowly: closing it", client.name)
                client.peer.abort()

    # --- queries ---------------------------------------------------------------------------

    async def _query(self, params: QueryParams) -> tuple[list[bytes], bool]:
        await self._wait_processed(self._session)
        loop = asyncio.get_running_loop()
        assert self._reader_exec is not None
        cap = self.config.max_query_results
        max_bytes = self._max_event_bytes
        if isinstance(params, QueryLatestParams):
            type_ids = self._resolve_types(params.event_types)
            blobs = await loop.run_in_executor(
                self._reader_exec, self._store.query_latest, type_ids, max_bytes
            )
            return blobs, False
        if isinstance(params, QueryTimeseriesParams):
            by_source = params.order_by is common.OrderBy.SOURCE_TIMESTAMP
            query = TimeseriesQuery(
                by_source=by_source,
                descending=params.order is common.Order.DESCENDING,
                t_from=_bound_us(params.t_from, 0, 1_000_000),
                t_to=_bound_us(params.t_to, -1, 999_999),
                source_t_from=None if params.source_t_from is None else params.source_t_from.key(),
                source_t_to=None if params.source_t_to is None else params.source_t_to.key(),
                type_ids=self._resolve_types(params.event_types),
                last_event_id=params.last_event_id,
                limit=_limit(params.max_results, cap),
                max_bytes=max_bytes,
            )
            return await loop.run_in_executor(
                self._reader_exec, self._store.query_timeseries, query
            )
        if isinstance(params, QueryServerParams):
            last = params.last_event_id
            if last is not None and last.server != params.server_id:
                raise ValueError("invalid server id")
            return await loop.run_in_executor(
                self._reader_exec,
                self._store.query_server,
                params.server_id,
                last,
                _limit(params.max_results, cap),
                max_bytes,
            )
        raise InvalidMessage(f"unsupported query {params!r}")

    def _resolve_types(self, query_types: Sequence[EventType] | None) -> list[int] | None:
        """Type ids a query selects; None = every type."""
        if query_types is None:
            return None
        sub = Subscription(query_types)
        if sub.matches_all:
            return None
        if not common.has_wildcards(sub.query_types):
            ids = self._type_ids
            return [ids[t] for t in sub.query_types if t in ids]
        key = sub.query_types
        checked, found = self._pattern_cache.pop(key, (0, []))
        if checked < len(self._type_list):
            found = found + [i for i, t in self._type_list[checked:] if sub.matches(t)]
        if len(self._pattern_cache) >= 1024:
            self._pattern_cache.pop(next(iter(self._pattern_cache)))
        self._pattern_cache[key] = (len(self._type_list), found)
        return found

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


class _AckSender:
    """Per-client ordered sender for ``events_ack``: one events notification in flight,
    the next one only after the client's MsgEventsAck (status notifications keep their
    place in the queue and need no ack)."""

    def __init__(
        self, client: ClientInfo, timeout: float, spawn: Callable[[Any], asyncio.Task[Any]]
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._queue: deque[tuple[str, bytes]] = deque()
        self._ready = asyncio.Event()
        self.idle = asyncio.Event()
        """Set while nothing is queued or waiting for an ack."""
        self.idle.set()
        self._task = spawn(self._run())

    def push(self, msg_type: str, data: bytes) -> None:
        if len(self._queue) >= MAX_QUEUED_NOTIFICATIONS:
            log.warning(
                "eventer client %d %r does not keep up with acks; closing",
                self._client.id,
                self._client.name,
            )
            self._client.peer.abort()
            return
        self._queue.append((msg_type, data))
        self.idle.clear()
        self._ready.set()

    def stop(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        peer = self._client.peer
        while True:
            if not self._queue:
                self.idle.set()
                self._ready.clear()
                await self._ready.wait()
                continue
            msg_type, data = self._queue.popleft()
            try:
                if msg_type == MSG_EVENTS_NOTIFY:
                    await peer.request(msg_type, data, timeout=self._timeout, raw=True)
                else:
                    peer.notify(msg_type, data)
            except rpc.RequestTimeout:
                log.warning(
                    "eventer client %d sent no ack in %s s; closing", self._client.id, self._timeout
                )
                peer.abort()
                return
            except rpc.ConnectionClosed:
                return
            except rpc.RpcError as exc:  # answered something else than MsgEventsAck
                log.warning("eventer client %d: bad ack (%s); closing", self._client.id, exc)
                peer.abort()
                return


async def _close_later(peer: rpc.Peer, timeout: float) -> None:
    """Give a refused client ``timeout`` s to close, then close."""
    await asyncio.wait([peer.closed], timeout=timeout)
    peer.abort()


def _decode_event(blob: bytes) -> Event:
    return common.event_from_sbs(common.decode("HatEventer.Event", blob))


def _bound_us(t: common.Timestamp | None, lo: int, hi: int) -> int | None:
    """A bound on server timestamps (always 0 <= us < 1e6) in microseconds that selects what
    comparing (s, us) pairs selects, as the reference does, whatever the bound's ``us``:
    ``us`` is clamped to [0, 1e6] for a lower bound, to [-1, 1e6 - 1] for an upper one."""
    if t is None:
        return None
    return common.Timestamp(t.s, min(max(t.us, lo), hi)).to_us()


def _limit(requested: int | None, cap: int) -> int:
    if requested is None or requested >= cap:
        return cap
    return max(requested, 0)


async def serve_forever(config: ServerConfig, stop: asyncio.Event) -> None:
    """Run a server until ``stop`` is set (the CLI's main loop)."""
    async with EventerServer(config) as server:
        for url in server.urls:
            print(f"listening on {url}", flush=True)
        await stop.wait()
