"""TCP and TLS transports: the loop drives the RPC core's protocol objects directly.

A protocol here is any ``asyncio.Protocol`` (the RPC core's Peer is one); this module knows
nothing of any wire format. It listens and connects, bounds TLS handshakes and builds TLS
contexts. TCP_NODELAY is set by asyncio and uvloop on every TCP transport they create.

Servers take a factory, called when a connection is accepted (before any TLS handshake),
that may refuse it by returning None: the connection is then closed at once (after its
handshake for TLS, which ``handshake_timeout`` bounds, default 10 s). A server counting its
connections from the factory therefore counts handshakes in progress too. A protocol whose
TLS handshake fails never sees ``connection_made`` nor ``connection_lost`` (asyncio and
uvloop alike): its owner must forget it after the handshake limit.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

log = logging.getLogger("peerwire.transports")


class ByteSink(Protocol):
    """What a transport drives: the asyncio.Protocol callbacks (the RPC core's Peer)."""

    def connection_made(self, transport: Any) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def connection_lost(self, exc: BaseException | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


ProtocolFactory = Callable[[], asyncio.Protocol | None]
"""Makes the protocol of an accepted connection, or returns None to refuse it."""


class _Refused(asyncio.Protocol):
    """Closes a connection the server did not admit."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream connection's transport: uvloop's are not asyncio.Transport subclasses
        cast(asyncio.Transport, transport).abort()


async def open_stream(
    host: str,
    port: int,
    protocol_factory: Callable[[], asyncio.Protocol],
    *,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    connect_timeout: float = 10.0,
) -> asyncio.Protocol:
    """Connect over TCP (TLS when ``ssl_context`` is given) and return the protocol;
    ``connect_timeout`` bounds the TCP connect and the TLS handshake together."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(connect_timeout):
        _, protocol = await loop.create_connection(
            protocol_factory,
            host,
            port,
            ssl=ssl_context,
            server_hostname=server_hostname if ssl_context else None,
        )
    return protocol


async def start_stream_server(
    host: str,
    port: int,
    protocol_factory: ProtocolFactory,
    *,
    ssl_context: ssl.SSLContext | None = None,
    backlog: int = 1024,
    handshake_timeout: float = 10.0,
    reuse_port: bool = False,
    sock: Any = None,
) -> asyncio.Server:
    """Listen on ``host:port`` (port 0 picks one; or on an already bound ``sock``).

    Every accepted connection gets ``protocol_factory()``; None refuses it. With
    ``ssl_context`` the TLS handshake (at most ``handshake_timeout`` s, default 10 s) runs
    after admission.
    """
    loop = asyncio.get_running_loop()

    def accept() -> asyncio.Protocol:
        protocol = protocol_factory()
        return _Refused() if protocol is None else protocol

    tls: dict[str, Any] = {}
    if ssl_context is not None:
        tls = {"ssl": ssl_context, "ssl_handshake_timeout": handshake_timeout}
    if sock is not None:
        return await loop.create_server(accept, sock=sock, backlog=backlog, **tls)
    return await loop.create_server(
        accept,
        host,
        port,
        backlog=backlog,
        reuse_address=True,
        reuse_port=reuse_port or None,
        **tls,
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


def server_address(server: Any) -> tuple[str, int]:
    """The (host, port) a server is bound to (the first socket's)."""
    host, port = server.sockets[0].getsockname()[:2]
    return host, port


__all__ = [
    "ByteSink",
    "ProtocolFactory",
    "client_ssl_context",
    "open_stream",
    "server_address",
    "server_ssl_context",
    "start_stream_server",
]
