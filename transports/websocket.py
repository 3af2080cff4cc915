"""WebSocket transport presenting a byte sink's interface, on any asyncio loop (or uvloop).

Built on the ``websockets`` library's public sans-I/O layer (``ServerProtocol`` /
``ClientProtocol``) under our own protocol (:mod:`transports.ws_connection`).
Each ``write()`` is one binary WebSocket message; ``writelines()`` sends one message per item
(Gotalk's browser peers need every header and every payload in a frame of its own). Received
text and binary messages are fed to the sink as bytes, so codecs see a byte stream and
merged or split frames from non-browser peers work too.

The server mounts the endpoint at a path on an HTTP server that also serves the browser
script and, optionally, static files (:mod:`transports.web_http`). Connections count toward
``max_connections`` from accept, TLS and WebSocket handshakes included; those past it get 503
once their request is in (at most :data:`MAX_REFUSING` at a time; beyond that they are
closed at once, and on TLS listeners before any TLS). A connection that has not upgraded within
``handshake_timeout`` or whose request head passes ``max_request_head`` bytes is closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import urllib.parse
from collections.abc import Callable

from websockets.client import ClientProtocol
from websockets.frames import CloseCode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Origin
from websockets.uri import parse_uri

from transports.logs import websocket_violations as violations
from transports.stream import TLS_SHUTDOWN_TIMEOUT, ByteSink, start_stream_server
from transports.web_http import HostCheck, HttpOptions, Responder, refuse
from transports.ws_connection import Connection
from transports.ws_settings import Settings
from transports.ws_transport import WebSocketTransport

log = logging.getLogger("peerwire.transports.websocket")

HIGH_WATER = 256 * 1024
"""Bytes buffered in the socket above which the sink is asked to pause writing."""
MAX_REFUSING = 1024
"""Connections past ``max_connections`` whose request is read to answer 503 (bounded as any
pending handshake); more are reset at once."""


class WebSocketServer:
    """A listening WebSocket (and small HTTP) server; ``asyncio.Server``-like.

    Owns every connection from accept to close: ``connections`` holds those counted toward
    ``max_connections`` (handshakes in progress and open WebSockets).
    """

    def __init__(
        self,
        sink_factory: Callable[[], ByteSink],
        http: HttpOptions,
        settings: Settings,
        max_connections: int,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self._sink_factory = sink_factory
        self.http = http
        self.settings = settings
        self.max_connections = max_connections
        self._ssl = ssl_context
        self._loop = asyncio.get_running_loop()
        self.connections: set[Connection] = set()
        self._refusing: set[Connection] = set()
        self._empty = asyncio.Event()
        self._empty.set()
        self._closing = False
        self._listener: asyncio.Server | None = None
        self._responder: Responder | None = None

    async def listen(
        self, host: str | None, port: int, backlog: int, sock: socket.socket | None = None
    ) -> None:
        """Bind and start accepting (once); on ``sock`` when given (already bound)."""
        if self._listener is not None:
            raise RuntimeError("the server is already listening")
        listener: asyncio.Server
        if self._ssl is not None:  # admission before any TLS, as for the other TLS servers
            listener = await start_stream_server(
                host or "0.0.0.0",
                port,
                self._admit_tls,
                ssl_context=self._ssl,
                backlog=backlog,
                handshake_timeout=self.settings.handshake_timeout,
                sock=sock,
            )
        elif sock is not None:
            listener = await self._loop.create_server(
                self._new_connection, sock=sock, backlog=backlog
            )
        else:
            listener = await self._loop.create_server(
                self._new_connection, host, port, backlog=backlog, reuse_address=True
            )
        hosts = (
            HostCheck(self.http.allowed_hosts)
            if self.http.allowed_hosts is not None
            else HostCheck.default(host, [s.getsockname()[0] for s in listener.sockets])
        )
        self._responder = Responder(self.http, hosts)
        self._listener = listener

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._listener.sockets) if self._listener is not None else ()

    @property
    def responder(self) -> Responder:
        if self._responder is None:
            raise RuntimeError("the server is not listening")
        return self._responder

    def _admit_tls(self) -> Connection | None:
        """The TLS listener's factory: past ``max_connections`` (or closing) None, and the
        socket is closed before any TLS, holding no TLS buffers."""
        if self._closing or len(self.connections) >= self.max_connections:
            log.info("refused a TLS connection: max_connections reached")
            return None
        return self._new_connection()

    def _new_connection(self) -> Connection:
        """Called at accept, before any TLS handshake: the connection counts from here."""
        ws = ServerProtocol(max_size=self.settings.max_size)
        conn = Connection(ws, self, self.settings, max_head=self.http.max_request_head)
        if not self._closing:
            if len(self.connections) < self.max_connections:
                self.connections.add(conn)
                self._empty.clear()
            elif self._ssl is None and len(self._refusing) < MAX_REFUSING:
                self._refusing.add(conn)  # its request is read (bounded), then 503
        conn.arm_handshake_deadline(lambda: self._handshake_timed_out(conn))
        return conn

    # --- Opening: the server side of every connection -------------------------------------

    def started(self, conn: Connection) -> None:
        if conn in self._refusing:
            log.info("refusing connection from %s: max_connections reached", conn.peername)
        elif conn not in self.connections and conn.raw is not None:
            log.info("closed connection from %s: max_connections reached", conn.peername)
            conn.raw.abort()

    def _handshake_timed_out(self, conn: Connection) -> None:
        if conn.raw is None:  # TLS handshake still running: the loop aborts it (same timeout)
            self.lost(conn, None)
        elif conn.ws.state is State.CONNECTING:
            log.info(
                "closed %s: no WebSocket upgrade within %s s",
                conn.peername,
                self.settings.handshake_timeout,
            )
            conn.raw.abort()

    def handshake(self, conn: Connection, event: Request | Response) -> None:
        if not isinstance(event, Request) or not isinstance(conn.ws, ServerProtocol):
            return
        response: Response | asyncio.Future[Response]
        try:
            if conn in self._refusing:
                response = refuse(conn.ws, 503, "Service Unavailable: too many connections\n")
            else:
                response = self.responder.respond(event, conn.ws)
            if isinstance(response, asyncio.Future):  # a static file loads
                conn.pause_reading()  # nothing more is read from the peer until it is sent
                response.add_done_callback(lambda done: self._answer(conn, event, done))
                return
            conn.respond(response)
        except Exception as exc:
            self._failed(conn, event, exc)
            return
        if conn.ws.state is State.OPEN and not self._closing:  # the 101 went out
            sink = self._sink_factory()
            if sink is None and conn.raw is not None:  # the application refused it
                conn.raw.abort()
            elif sink is not None:
                conn.open(sink)

    def _answer(self, conn: Connection, request: Request, done: asyncio.Future[Response]) -> None:
        """A response that waited for its static file (never a 101): send it, read again."""
        if conn.lost or conn.raw is None or conn.raw.is_closing() or done.cancelled():
            return
        try:
            conn.respond(done.result())
        except Exception as exc:
            self._failed(conn, request, exc)
            return
        conn.resume_reading()

    def _failed(self, conn: Connection, request: Request, exc: Exception) -> None:
        """A request we did not foresee: its connection is aborted, not the loop's reading."""
        violations.warning(
            "WebSocket peer %s: request for %.200r failed (%r): connection aborted",
            conn.peername,
            request.path,
            exc,
        )
        log.debug("the request that failed", exc_info=True)
        if conn.raw is not None:
            conn.raw.abort()

    def lost(self, conn: Connection, exc: BaseException | None) -> None:
        self._refusing.discard(conn)
        self.connections.discard(conn)
        if not self.connections:
            self._empty.set()

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def pending_handshakes(self) -> int:
        """Connections accepted that have not upgraded yet (TLS handshakes included)."""
        return sum(1 for c in self.connections if c.ws.state is State.CONNECTING)

    def close(self, close_connections: bool = True) -> None:
        """Stop listening and drop handshakes in progress; with ``close_connections``, also
        close open WebSockets (code 1001, going away)."""
        self._closing = True
        if self._listener is not None:
            self._listener.close()
        if self._responder is not None:
            self._responder.close()
        for conn in list(self.connections) + list(self._refusing):
            if conn.raw is None:  # in its TLS handshake (the loop closes it with the listener)
                self.lost(conn, None)
            elif conn.ws.state is State.CONNECTING:
                conn.raw.abort()
            elif close_connections:
                conn.close(CloseCode.GOING_AWAY)

    async def wait_closed(self) -> None:
        """Wait until the listener is closed and every connection has ended."""
        if self._listener is not None:
            await self._listener.wait_closed()
        await self._empty.wait()

    async def __aenter__(self) -> WebSocketServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()


async def start_websocket_server(
    host: str | None,
    port: int,
    sink_factory: Callable[[], ByteSink],
    *,
    http: HttpOptions | None = None,
    ssl_context: ssl.SSLContext | None = None,
    max_size: int = 16 * 1024 * 1024,
    ping_interval: float | None = 20.0,
    ping_timeout: float | None = 20.0,
    close_timeout: float = 10.0,
    max_connections: int = 10_000,
    high_water: int = HIGH_WATER,
    backlog: int = 1024,
    sock: socket.socket | None = None,
    min_rate: float | None = 1024.0,
    rate_grace: float = 10.0,
) -> WebSocketServer:
    """Serve the endpoint at ``http.mount`` (plus script and static files) on host:port.

    ``max_size`` bounds one incoming message (bigger: closed with 1009); input that ends
    inside a frame, a fragmented message or a message the sink holds part of must bring
    ``min_rate`` bytes of payload a second on average once it has for ``rate_grace``
    seconds (else closed with 1008; see :class:`Settings`). Handshake timeout, request head
    cap and allowed hosts are in ``http`` (:class:`HttpOptions`).
    """
    http = http or HttpOptions()
    settings = Settings(
        max_size=max_size,
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        close_timeout=close_timeout,
        handshake_timeout=http.handshake_timeout,
        high_water=high_water,
        min_rate=min_rate,
        rate_grace=rate_grace,
    )
    server = WebSocketServer(sink_factory, http, settings, max_connections, ssl_context)
    await server.listen(host, port, backlog, sock)
    return server


class _ClientOpening:
    """The client side: send the request, open the sink on a 101, fail ``opened`` else."""

    def __init__(self, sink_factory: Callable[[], ByteSink]) -> None:
        self._sink_factory = sink_factory
        self.opened: asyncio.Future[ByteSink] = asyncio.get_running_loop().create_future()

    def started(self, conn: Connection) -> None:
        ws = conn.ws
        if isinstance(ws, ClientProtocol):
            request = ws.connect()
            conn.handshake_events["request"] = request
            ws.send_request(request)
            conn.flush()

    def handshake(self, conn: Connection, event: Request | Response) -> None:
        if self.opened.done():
            return
        if conn.ws.handshake_exc is not None:
            self.opened.set_exception(conn.ws.handshake_exc)
            return
        self.opened.set_result(sink := self._sink_factory())
        conn.open(sink)

    def lost(self, conn: Connection, exc: BaseException | None) -> None:
        if not self.opened.done():
            failure = conn.ws.handshake_exc or ConnectionError(
                f"connection closed during the WebSocket handshake: {exc or 'EOF'}"
            )
            self.opened.set_exception(failure)


async def open_websocket(
    uri: str,
    sink_factory: Callable[[], ByteSink],
    *,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    origin: str | None = None,
    max_size: int = 16 * 1024 * 1024,
    ping_interval: float | None = 20.0,
    ping_timeout: float | None = 20.0,
    close_timeout: float = 10.0,
    connect_timeout: float = 10.0,
    high_water: int = HIGH_WATER,
    min_rate: float | None = 1024.0,
    rate_grace: float = 10.0,
) -> ByteSink:
    """Connect to a WebSocket endpoint and return the sink (fed from the connection).

    ``wss``: the certificate is checked against ``server_hostname`` when given (e.g. a
    server reached by IP address), else against the URI's host. ``min_rate`` and
    ``rate_grace``: the least rate of the server's unfinished input, as the server's.

    Raises ``TimeoutError`` after ``connect_timeout`` (TCP, TLS and upgrade together),
    ``OSError`` for refused connections and websockets' ``InvalidHandshake`` (e.g.
    ``InvalidStatus`` with the response) for a refused upgrade.
    """
    target = parse_uri(uri)
    if origin is None:  # a non-browser client presents the server's own origin
        parts = urllib.parse.urlsplit(uri)
        origin = f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}"
    if target.secure and ssl_context is None:
        ssl_context = ssl.create_default_context()
    settings = Settings(
        max_size=max_size,
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        close_timeout=close_timeout,
        handshake_timeout=connect_timeout,
        high_water=high_water,
        min_rate=min_rate,
        rate_grace=rate_grace,
    )
    opening = _ClientOpening(sink_factory)
    conns: list[Connection] = []

    def new_connection() -> Connection:
        ws = ClientProtocol(target, origin=Origin(origin), max_size=max_size)
        conns.append(Connection(ws, opening, settings))
        return conns[-1]

    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(connect_timeout):
            await loop.create_connection(
                new_connection,
                target.host,
                target.port,
                ssl=ssl_context if target.secure else None,
                server_hostname=(server_hostname or target.host) if target.secure else None,
                ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT if target.secure else None,
            )
            return await opening.opened
    except BaseException:
        opening.opened.cancel()
        for conn in conns:  # the caller gets no sink: none may stay connected, even one
            if conn.raw is not None:  # opened just as the timeout cancelled the wait
                conn.raw.abort()
        raise


__all__ = [
    "HttpOptions",
    "WebSocketServer",
    "WebSocketTransport",
    "open_websocket",
    "start_websocket_server",
]
