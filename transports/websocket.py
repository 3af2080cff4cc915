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
import collections
import gzip
import hashlib
import logging
import mimetypes
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
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from transports.stream import ByteSink

log = logging.getLogger("peerwire.transports.websocket")

SCRIPT_DIR = Path(__file__).parent / "web"
SCRIPT_NAMES = ("gotalk.js", "peerwire.js")
HIGH_WATER = 256
"""Queued outgoing frames above which the sink is asked to pause."""


class WebSocketTransport(asyncio.Transport):
    """One WebSocket connection as an asyncio-style transport; one writer task sends frames."""

    def __init__(self, ws: ServerConnection | ClientConnection, sink: ByteSink) -> None:
        super().__init__()
        self._ws = ws
        self._sink = sink
        self._frames: collections.deque[bytes] = collections.deque()
        self._wakeup = asyncio.Event()
        self._closing = False
        self._paused = False
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    # transport interface used by the RPC core
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        self._frames.append(bytes(data))
        self._after_queue()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        if self._closing:
            return
        self._frames.extend(bytes(d) for d in list_of_data)
        self._after_queue()

    def _after_queue(self) -> None:
        self._wakeup.set()
        if not self._paused and len(self._frames) > HIGH_WATER:
            self._paused = True
            self._sink.pause_writing()

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Send what is queued, then close the WebSocket normally."""
        self._closing = True
        self._wakeup.set()

    def abort(self) -> None:
        self._closing = True
        self._frames.clear()
        self._writer.cancel()
        self._ws.transport.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "message_framed":
            return True
        if name == "peername":
            return self._ws.remote_address
        if name == "request":
            return getattr(self._ws, "request", None)
        return self._ws.transport.get_extra_info(name, default)

    async def _write_loop(self) -> None:
        ws = self._ws
        try:
            while True:
                while self._frames:
                    await ws.send(self._frames.popleft())
                    if self._paused and len(self._frames) < HIGH_WATER // 2:
                        self._paused = False
                        self._sink.resume_writing()
                if self._closing:
                    await ws.close()
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
        except ConnectionClosed:
            pass

    async def run(self) -> None:
        """Feed received messages to the sink until the connection ends."""
        sink = self._sink
        error: BaseException | None = None
        try:
            async for message in self._ws:
                sink.data_received(message.encode() if isinstance(message, str) else message)
        except ConnectionClosed as exc:
            if exc.rcvd is None or exc.rcvd.code not in (1000, 1001):
                error = exc
        finally:
            self._closing = True
            self._wakeup.set()
            if not self._writer.done():
                try:
                    await asyncio.wait_for(asyncio.shield(self._writer), 1.0)
                except (TimeoutError, asyncio.CancelledError):
                    self._writer.cancel()
            sink.connection_lost(error)


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
) -> WsServer:
    """Serve the endpoint at ``http.mount`` (plus script and static files) on host:port."""
    http = http or HttpOptions()
    active: set[WebSocketTransport] = set()

    async def handler(ws: ServerConnection) -> None:
        sink = sink_factory()
        transport = WebSocketTransport(ws, sink)
        active.add(transport)
        try:
            sink.connection_made(transport)
            await transport.run()
        finally:
            active.discard(transport)

    return await ws_serve(
        handler,
        host,
        port,
        ssl=ssl_context,
        max_size=max_size,
        ping_interval=ping_interval,
        process_request=_process_request(http, lambda: len(active), max_connections),
        compression=None,
        server_header="peerwire",
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
    """Connect to a WebSocket endpoint and return the sink; reading runs in a task."""
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
    )
    sink = sink_factory()
    transport = WebSocketTransport(ws, sink)
    sink.connection_made(transport)
    task = asyncio.get_running_loop().create_task(transport.run())
    transport._reader = task  # type: ignore[attr-defined]  # keep a reference
    return sink
