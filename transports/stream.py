"""TCP and TLS transports: asyncio.Protocol callbacks straight into a byte sink.

A sink is any object with ``connection_made(transport)``, ``data_received(bytes)``,
``connection_lost(exc)``, ``pause_writing()`` and ``resume_writing()``; the RPC core's Peer is
one. No protocol knowledge lives here: this module moves bytes, sets TCP_NODELAY and builds
TLS contexts.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class ByteSink(Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def connection_lost(self, exc: BaseException | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


class StreamProtocol(asyncio.Protocol):
    """Adapts asyncio's stream callbacks to a sink, creating the sink on connect."""

    def __init__(self, sink_factory: Callable[[], ByteSink]) -> None:
        self._factory = sink_factory
        self.sink: ByteSink | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sink = self._factory()
        self.sink.connection_made(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.sink is not None:
            self.sink.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.sink is not None:
            self.sink.pause_writing()

    def resume_writing(self) -> None:
        if self.sink is not None:
            self.sink.resume_writing()


async def open_stream(
    host: str,
    port: int,
    sink_factory: Callable[[], ByteSink],
    *,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    connect_timeout: float = 10.0,
) -> ByteSink:
    """Connect over TCP (TLS when ``ssl_context`` is given) and return the sink."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(connect_timeout):
        _, protocol = await loop.create_connection(
            lambda: StreamProtocol(sink_factory),
            host,
            port,
            ssl=ssl_context,
            server_hostname=server_hostname if ssl_context else None,
        )
    assert protocol.sink is not None
    return protocol.sink


async def start_stream_server(
    host: str,
    port: int,
    sink_factory: Callable[[], ByteSink],
    *,
    ssl_context: ssl.SSLContext | None = None,
    backlog: int = 1024,
) -> asyncio.Server:
    """Listen on ``host:port`` (port 0 picks one); every connection gets a fresh sink."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: StreamProtocol(sink_factory),
        host,
        port,
        ssl=ssl_context,
        backlog=backlog,
        reuse_address=True,
    )


def client_ssl_context(
    *,
    cafile: str | Path | None = None,
    certfile: str | Path | None = None,
    keyfile: str | Path | None = None,
    verify: bool = True,
) -> ssl.SSLContext:
    """A client context: verification and hostname checks on unless ``verify=False``;
    ``certfile``/``keyfile`` present a client certificate (mutual TLS)."""
    ctx = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=str(cafile) if cafile else None
    )
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if certfile:
        ctx.load_cert_chain(str(certfile), str(keyfile) if keyfile else None)
    return ctx


def server_ssl_context(
    certfile: str | Path,
    keyfile: str | Path | None = None,
    *,
    client_cafile: str | Path | None = None,
) -> ssl.SSLContext:
    """A server context; ``client_cafile`` requires and verifies client certificates."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(certfile), str(keyfile) if keyfile else None)
    if client_cafile:
        ctx.load_verify_locations(str(client_cafile))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def server_address(server: asyncio.Server) -> tuple[str, int]:
    """The (host, port) a server is bound to (the first socket's)."""
    host, port = server.sockets[0].getsockname()[:2]
    return host, port


__all__: list[Any] = [
    "ByteSink",
    "StreamProtocol",
    "client_ssl_context",
    "open_stream",
    "server_address",
    "server_ssl_context",
    "start_stream_server",
]
