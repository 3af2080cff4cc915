"""Eventer server on peerwire's Chatter core, persisting to SQLite.

Peers use :func:`~rpc.eventer.codec.peer_repository`, so HatEventer payloads arrive and
leave as SBS bytes the package encodes itself. What each message does is
:mod:`rpc.eventer.handlers`'s; the parts a started server runs are
:class:`~rpc.eventer.service.Service`'s: the registrar (:mod:`~rpc.eventer.sessions`), the
group-commit writer (:mod:`~rpc.eventer.writer`), the fan-out to clients
(:mod:`~rpc.eventer.fanout`) and the queries (:mod:`~rpc.eventer.queries`).

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
import logging
import ssl as ssl_module
from collections.abc import Sequence

import rpc
from rpc.eventer.codec import (
    decode,
    encode,
    event_from_sbs,
    eventer_repository,
    peer_repository,
    register_event_to_sbs,
)
from rpc.eventer.config import ConfigError, ServerConfig, TlsConfig
from rpc.eventer.fanout import ClientInfo
from rpc.eventer.service import Service
from rpc.eventer.store import ResultTooLarge, Store
from rpc.eventer.values import (
    MSG_REGISTER_REQ,
    Event,
    InvalidMessage,
    QueryError,
    QueryParams,
    QueryResult,
    RegisterEvent,
    Status,
)
from transports.stream import server_ssl_context

__all__ = ["ClientInfo", "EventerServer", "ListenError", "serve_forever"]

log = logging.getLogger("peerwire.eventer.server")

STOP_FLUSH_TIMEOUT = 1.0
"""Seconds ``close`` waits, in all, for ack-paced clients to ack their way to STANDBY (see
:meth:`~rpc.eventer.fanout.Fanout.finish`); an ack still awaited then is given up."""
CLOSE_DRAIN_TIMEOUT = 1.0
"""Seconds a closing server gives the requests in flight on a connection to be answered
before it is cut (queries, one at a time: each waits for the client to read the last)."""


class ListenError(OSError):
    """An address the server cannot listen on; the message names its URL and the reason
    (``cannot listen on URL: reason``), the original error is its ``__cause__``."""


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
        self._store = Store(config.database, sync=config.sync, max_wal_bytes=config.max_wal_bytes)
        self._service: Service | None = None
        """Set once by :meth:`start`, when the database is open."""

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def status(self) -> Status:
        """STANDBY until started, then OPERATIONAL until :meth:`close` or
        :meth:`set_status`."""
        return Status.STANDBY if self._service is None else self._service.status

    @property
    def urls(self) -> list[str]:
        """Bound URLs (port 0 replaced by the real port)."""
        return [str(s.url) for s in self.servers]

    @property
    def clients(self) -> list[ClientInfo]:
        return [] if self._service is None else list(self._service.fanout.clients.values())

    @property
    def registry(self) -> rpc.Registry:
        """The handlers of every HatEventer message (exists once started)."""
        return self._started().registry

    async def start(self) -> EventerServer:
        """Load the TLS files, open the database, register STARTED, then listen. Raises
        :class:`~rpc.eventer.config.ConfigError` for TLS files it cannot load,
        :class:`~rpc.eventer.store.StoreError` for a database it cannot use,
        :class:`ListenError` (an OSError) for an address it cannot listen on."""
        if self._service is not None:
            raise RuntimeError("EventerServer.start: already started")
        ctx = self._ssl
        if ctx is None and self.config.tls is not None:
            ctx = tls_context(self.config.tls)  # before the database: nothing to undo
        eventer_repository()  # the schemas, read now (~0.15 s), not in a first client's turn
        service = self._service = await Service.open(self.config, self._store)
        try:
            if self.config.system_events:
                await service.register_system(("engine",), "STARTED")
            options = rpc.Options(  # max_concurrent: the default, 1,024 per connection
                timeout=self.config.ack_timeout, max_size=self.config.max_message_size
            )
            for url in self.config.listen:
                server = rpc.serve(
                    url,
                    registry=service.registry,
                    options=options,
                    ssl=ctx if rpc.parse_url(url).tls else None,
                    sbs_repo=peer_repository(),
                    retry_results=False,  # Hat clients cannot decode PeerwireRpc.Retry
                )
                try:
                    await server.start()
                except OSError as exc:
                    raise ListenError(f"cannot listen on {url}: {exc.strerror or exc}") from exc
                self.servers.append(server)
                log.info("eventer server %d listening on %s", self.server_id, server.url)
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """Announce STOPPING, commit what is queued (plus the STOPPED event), announce
        STANDBY, close every connection, then the database.

        From the start, registrations fail (``failure``, as the reference answers while
        not operational) and queries are answered. Ack-paced clients get up to
        :data:`STOP_FLUSH_TIMEOUT` to take STANDBY (none when nothing waits behind an
        unacked notification). Then the connections close gracefully: the requests in
        flight are answered (up to :data:`CLOSE_DRAIN_TIMEOUT`),
        requests that come meanwhile are not run (the core drops them for a peer that takes
        no retry results: the client sees the connection close, as when hat's server
        closes), and each connection closes as soon as its requests in flight are
        answered."""
        service = self._service
        if service is None or service.closing:
            return
        service.closing = True
        service.set_status(Status.STOPPING)
        if self.config.system_events:
            await service.register_system(("engine",), "STOPPED", force=True)
        await service.wait_committed()
        service.set_status(Status.STANDBY)
        await service.fanout.finish(STOP_FLUSH_TIMEOUT)
        await asyncio.gather(*(s.close(drain_timeout=CLOSE_DRAIN_TIMEOUT) for s in self.servers))
        await service.close()

    async def __aenter__(self) -> EventerServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def set_status(self, status: Status) -> None:
        """Change the status and notify every client. Registration fails unless
        OPERATIONAL. Raises RuntimeError before :meth:`start`."""
        self._started().set_status(status)

    # --- in-process API --------------------------------------------------------------------

    async def register(self, events: Sequence[RegisterEvent]) -> list[Event] | None:
        """Register one session; its events once committed, or None on failure (and
        before :meth:`start`)."""
        if self._service is None:
            return None
        data = encode(MSG_REGISTER_REQ, [register_event_to_sbs(e) for e in events])
        try:
            future = self._service.submit_request(data)
        except InvalidMessage:
            return None
        if future is None:
            return None
        blobs = await future
        return None if blobs is None else [_decode_event(b) for b in blobs]

    async def query(self, params: QueryParams) -> QueryResult:
        """Raises :class:`~rpc.eventer.common.QueryError` for a latest result larger than
        ``max_message_size``, RuntimeError before :meth:`start`."""
        try:
            blobs, more = await self._started().query(params)
        except ResultTooLarge as exc:
            raise QueryError(str(exc)) from None
        return QueryResult([_decode_event(b) for b in blobs], more)

    def _started(self) -> Service:
        if self._service is None:
            raise RuntimeError("the EventerServer is not started")
        return self._service


def tls_context(tls: TlsConfig) -> ssl_module.SSLContext:
    """The server context of ``tls`` (``transports.stream.server_ssl_context``), each file
    checked on its own so that :class:`ConfigError` names the one that cannot be loaded.
    An encrypted key is refused (no passphrase prompt)."""

    def failure(key: str, path: str, exc: OSError, pem: str) -> ConfigError:
        if not isinstance(exc, ssl_module.SSLError):
            reason = exc.strerror or str(exc)
        elif exc.reason in (None, "NO_CERTIFICATE_OR_CRL_FOUND"):  # None: "PEM lib"
            reason = pem
        elif exc.reason == "KEY_VALUES_MISMATCH":
            reason = f"it does not match the certificate {tls.cert}"
        else:
            reason = exc.reason.lower().replace("_", " ")
        return ConfigError(f"tls.{key}: cannot load {path}: {reason}")

    def no_passphrase() -> str:
        key = "tls.key" if tls.key else "tls.cert"
        raise ConfigError(f"{key}: cannot load {tls.key or tls.cert}: it is encrypted")

    try:  # certificates only: a failure past these is the key's
        ssl_module.create_default_context().load_verify_locations(tls.cert)
    except OSError as exc:
        raise failure("cert", tls.cert, exc, "no PEM certificate in it") from None
    if tls.client_ca:
        try:
            ssl_module.create_default_context().load_verify_locations(tls.client_ca)
        except OSError as exc:
            raise failure("client_ca", tls.client_ca, exc, "no PEM certificate in it") from None
    try:
        return server_ssl_context(
            tls.cert, tls.key, client_cafile=tls.client_ca, password=no_passphrase
        )
    except OSError as exc:
        if tls.key:
            raise failure("key", tls.key, exc, "no PEM private key in it") from None
        raise failure("cert", tls.cert, exc, "no PEM private key in it (or give tls.key)") from None


def _decode_event(blob: bytes) -> Event:
    return event_from_sbs(decode("HatEventer.Event", blob))


async def serve_forever(config: ServerConfig, stop: asyncio.Event) -> None:
    """Run a server until ``stop`` is set (the CLI's main loop)."""
    async with EventerServer(config) as server:
        for url in server.urls:
            print(f"listening on {url}", flush=True)
        await stop.wait()
