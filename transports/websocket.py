"""WebSocket transport (the `websockets` library) presenting a byte sink's interface.

Each ``write()`` is one binary WebSocket message; ``writelines()`` sends one message per item
(Gotalk's browser peers need every header and every payload in a frame of its own). Received
text and binary messages are fed to the sink as bytes, so codecs see a byte stream and
merged or split frames from non-browser peers work too.

The server side mounts the endpoint at a path on an HTTP server that also serves the
browser script (``<mount>/gotalk.js`` and ``<mount>/peerwire.js``, with ETag, 304,
Cache-Control and gzip) and, optionally, a folder of static files. Origins are checked
against an allow-list, same-origin by default; a refused handshake says why.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import logging
import mimetypes
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.datastructures import Headers
from websockets.frames import DATA_OPCODES, Frame
from websockets.http11 import Request, Response
from websockets.protocol import State

from transports.stream import ByteSink

log = logging.getLogger("peerwire.transports.websocket")

SCRIPT_DIR = Path(__file__).parent / "web"
SCRIPT_NAMES = ("gotalk.js", "peerwire.js")
RETRY_FLAG = "peerwire-retry"
"""Query parameter peerwire's browser client sends: it understands Gotalk retry results."""
HIGH_WATER = 256 * 1024
"""Bytes buffered in the socket above which the sink is asked to pause writing."""


class _SinkFeeding:
    """Mixin for websockets connections: data frames go straight to a sink.

    websockets' asyncio API queues each message for a reader task to pick up; peerwire's
    codecs take a byte stream, so every data frame (text, binary or continuation) is handed
    to the sink from the protocol callback instead: no task wakes up per message. Frames
    that arrive before the sink is attached are held until then.
    """

    sink: ByteSink | None
    early: list[bytes]

    def process_event(self, event: Any) -> None:
        if isinstance(event, Frame) and event.opcode in DATA_OPCODES:
            data = bytes(event.data)
            if self.sink is not None:
                self.sink.data_received(data)
            else:
                self.early.append(data)
            return
        super().process_event(event)  # type: ignore[misc]


class _ServerConnection(_SinkFeeding, ServerConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sink, self.early = None, []


class _ClientConnection(_SinkFeeding, ClientConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sink, self.early = None, []


class WebSocketTransport(asyncio.Transport):
    """One WebSocket connection as an asyncio-style transport for a byte sink.

    Writes go through websockets' sans-I/O protocol object and reach the socket in one
    ``transport.write`` per call, keeping one WebSocket message per frame written.
    """

    def __init__(self, ws: _ServerConnection | _ClientConnection, sink: ByteSink) -> None:
        super().__init__()
        self._ws = ws
        self._sink = sink
        self._closing = False
        self._paused = False

    def attach(self) -> None:
        """Start feeding the sink (after its ``connection_made``)."""
        ws = self._ws
        ws.sink = self._sink
        early, ws.early = ws.early, []
        for data in early:
            self._sink.data_received(data)

    # transport interface used by the RPC core
    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writelines((data,))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        ws = self._ws
        if self._closing or ws.protocol.state is not State.OPEN:
            return
        protocol = ws.protocol
        for data in list_of_data:
            protocol.send_binary(data)
        out = protocol.data_to_send()
        ws.transport.write(out[0] if len(out) == 1 else b"".join(out))
        if not self._paused and ws.transport.get_write_buffer_size() > HIGH_WATER:
            self._paused = True
            self._sink.pause_writing()
            asyncio.get_running_loop().create_task(self._resume_when_drained())

    async def _resume_when_drained(self) -> None:
        try:
            await self._ws.drain()
        except Exception:  # closed meanwhile: connection_lost tells the sink
            return
        self._paused = False
        self._sink.resume_writing()

    def is_closing(self) -> bool:
        return self._closing

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._ws.transport.set_write_buffer_limits(high=high, low=low)

    def pause_reading(self) -> None:
        self._ws.transport.pause_reading()

    def resume_reading(self) -> None:
        self._ws.transport.resume_reading()

    def get_write_buffer_size(self) -> int:
        return self._ws.transport.get_write_buffer_size()

    def close(self) -> None:
        """Close the WebSocket normally (queued frames are already written)."""
        if not self._closing:
            self._closing = True
            asyncio.get_running_loop().create_task(self._ws.close())

    def abort(self) -> None:
        self._closing = True
        self._ws.transport.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "message_framed":
            return True
        if name == "peername":
            return self._ws.remote_address
        if name == "request":
            return getattr(self._ws, "request", None)
        if name == "peerwire_retry":  # the peer said it takes Gotalk "e" results
            request = getattr(self._ws, "request", None)
            query = request.path.partition("?")[2] if request else ""
            return RETRY_FLAG in urllib.parse.parse_qs(query)
        return self._ws.transport.get_extra_info(name, default)

    async def run(self) -> None:
        """Wait for the connection to end, then tell the sink."""
        await self._ws.wait_closed()
        self._closing = True
        rcvd = self._ws.protocol.close_rcvd
        error = None
        if rcvd is None or rcvd.code not in (1000, 1001):
            error = ConnectionError(f"WebSocket closed: {rcvd or 'no close frame'}")
        self._ws.sink = None
        self._sink.connection_lost(error)


# --- the HTTP side: script, static files, origin check ---------------------------------------


@dataclass(slots=True)
class _Asset:
    body: bytes
    gzipped: bytes
    etag: str
    content_type: str

    @classmethod
    def load(cls, path: Path) -> _Asset:
        body = path.read_bytes()
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        return cls(
            body, gzip.compress(body, mtime=0), '"' + hashlib.sha1(body).hexdigest() + '"', ctype
        )


@dataclass(slots=True)
class HttpOptions:
    """What the WebSocket server answers besides the endpoint itself."""

    mount: str = "/gotalk/"
    origins: Sequence[str] | None = None
    """Allowed Origin values; None = same origin as the Host header; ["*"] = any."""
    allow_missing_origin: bool = False
    """Non-browser clients may omit Origin (the Go server refuses that with 403)."""
    static_dir: Path | None = None
    cache_control: str = "public,max-age=300"
    _assets: dict[str, _Asset] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.mount.startswith("/"):
            self.mount = "/" + self.mount
        if not self.mount.endswith("/"):
            self.mount += "/"
        script = _Asset.load(SCRIPT_DIR / "gotalk.js")
        for name in SCRIPT_NAMES:
            self._assets[self.mount + name] = script


def _origin_refusal(request: Request, options: HttpOptions) -> str | None:
    origin = request.headers.get("Origin")
    if origin is None:
        return None if options.allow_missing_origin else "missing Origin header"
    if options.origins is None:
        host = request.headers.get("Host", "")
        if origin.split("://", 1)[-1] != host:
            return f"origin {origin} is not the same origin as {host}"
        return None
    if "*" in options.origins or origin in options.origins:
        return None
    return f"origin {origin} is not allowed"


def _serve_asset(request: Request, asset: _Asset, cache_control: str) -> Response:
    headers = Headers(
        {
            "Content-Type": asset.content_type,
            "ETag": asset.etag,
            "Cache-Control": cache_control,
            "Vary": "Accept-Encoding",
        }
    )
    if request.headers.get("If-None-Match") == asset.etag:
        return Response(304, "Not Modified", headers, b"")
    body = asset.body
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        body = asset.gzipped
        headers["Content-Encoding"] = "gzip"
    headers["Content-Length"] = str(len(body))
    return Response(200, "OK", headers, body)


def _static_file(options: HttpOptions, path: str) -> _Asset | None:
    if options.static_dir is None:
        return None
    relative = path.split("?", 1)[0].lstrip("/") or "index.html"
    root = options.static_dir.resolve()
    target = (root / relative).resolve()
    if root not in target.parents or not target.is_file():
        return None
    return _Asset.load(target)


def _process_request(options: HttpOptions, counter: Callable[[], int], max_connections: int):
    def process(connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        asset = options._assets.get(path)
        if asset is not None:
            return _serve_asset(request, asset, options.cache_control)
        if path in (options.mount, options.mount.rstrip("/")):
            if request.headers.get("Upgrade", "").lower() != "websocket":
                return connection.respond(426, "this is a WebSocket endpoint\n")
            reason = _origin_refusal(request, options)
            if reason is not None:
                log.info("refused WebSocket handshake: %s", reason)
                return connection.respond(403, f"Forbidden: {reason}\n")
            if counter() >= max_connections:
                return connection.respond(503, "Service Unavailable: too many connections\n")
            return None
        static = _static_file(options, path)
        if static is not None:
            return _serve_asset(request, static, "no-cache")
        return connection.respond(404, "Not Found\n")

    return process


async def start_websocket_server(
    host: str,
    port: int,
    sink_factory: Callable[[], ByteSink],
    *,
    http: HttpOptions | None = None,
    ssl_context: ssl.SSLContext | None = None,
    max_size: int = 16 * 1024 * 1024,
    ping_interval: float | None = 20.0,
    max_connections: int = 10_000,
    sock: socket.socket | None = None,
) -> WsServer:
    """Serve the endpoint at ``http.mount`` (plus script and static files) on host:port, or
    on ``sock`` (an already bound TCP socket) when given."""
    http = http or HttpOptions()
    active: set[WebSocketTransport] = set()

    async def handler(ws: ServerConnection) -> None:
        sink = sink_factory()
        transport = WebSocketTransport(ws, sink)  # type: ignore[arg-type]
        active.add(transport)
        try:
            sink.connection_made(transport)
            transport.attach()
            await transport.run()
        finally:
            active.discard(transport)

    return await ws_serve(
        handler,
        None if sock else host,
        None if sock else port,
        sock=sock,
        ssl=ssl_context,
        max_size=max_size,
        ping_interval=ping_interval,
        process_request=_process_request(http, lambda: len(active), max_connections),
        compression=None,
        server_header="peerwire",
        create_connection=_ServerConnection,
    )


async def open_websocket(
    uri: str,
    sink_factory: Callable[[], ByteSink],
    *,
    ssl_context: ssl.SSLContext | None = None,
    origin: str | None = None,
    max_size: int = 16 * 1024 * 1024,
    ping_interval: float | None = 20.0,
    connect_timeout: float = 10.0,
) -> ByteSink:
    """Connect to a WebSocket endpoint and return the sink (fed from the connection)."""
    if origin is None:  # a non-browser client presents the server's own origin
        parts = urllib.parse.urlsplit(uri)
        origin = f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}"
    ws = await ws_connect(
        uri,
        ssl=ssl_context,
        origin=origin,
        max_size=max_size,  # type: ignore[arg-type]
        ping_interval=ping_interval,
        open_timeout=connect_timeout,
        compression=None,
        create_connection=_ClientConnection,
    )
    sink = sink_factory()
    transport = WebSocketTransport(ws, sink)  # type: ignore[arg-type]
    sink.connection_made(transport)
    transport.attach()
    _watchers.add(task := asyncio.get_running_loop().create_task(transport.run()))
    task.add_done_callback(_watchers.discard)
    return sink


_watchers: set[asyncio.Task[None]] = set()
"""Tasks waiting for client connections to end (kept referenced until they do)."""
