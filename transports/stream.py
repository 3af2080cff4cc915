"""TCP and TLS transports: the loop drives the RPC core's protocol objects directly.

A protocol here is any ``asyncio.Protocol`` (the RPC core's Peer is one); this module knows
nothing of any wire format. It listens and connects, bounds TLS handshakes and builds TLS
contexts. TCP_NODELAY is set by asyncio and uvloop on every TCP transport they create.

Servers take a factory that may refuse a connection by returning None: the socket is then
closed at once, before any TLS work. For TLS the handshake runs only after the factory
admitted the connection, bounded by ``handshake_timeout``; a connection whose handshake
fails or times out is closed and its protocol told so (``connection_lost``) without ever
seeing ``connection_made``. So a server counting its connections from the factory counts
handshakes in progress too, and a flood of silent TLS clients holds at most that many.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

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
        transport.abort()


class _TlsAcceptor(asyncio.Protocol):
    """Holds an admitted plain connection while its TLS handshake runs, then hands the TLS
    transport to the real protocol. Reading stays paused until the handshake takes over.

    ``loop.start_tls`` may deliver application data (a TLS 1.3 client writes right after its
    Finished) before it returns; that data is held here (one read at most) and given to the
    protocol right after its ``connection_made``.
    """

    def __init__(self, protocol: asyncio.Protocol, context: ssl.SSLContext, timeout: float) -> None:
        self._protocol = protocol
        self._context = context
        self._timeout = timeout
        self._task: asyncio.Task[None] | None = None
        self._early: list[bytes] = []
        self._lost: tuple[Exception | None] | None = None
        self._handed_over = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.Transport):  # a listening socket gives Transports
            transport.abort()
            return
        transport.pause_reading()
        self._task = asyncio.get_running_loop().create_task(self._handshake(transport))

    async def _handshake(self, transport: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                transport,
                self,
                self._context,
                server_side=True,
                ssl_handshake_timeout=self._timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            reason = str(exc) or type(exc).__name__
            log.info(
                "TLS handshake with %s failed: %s", transport.get_extra_info("peername"), reason
            )
            transport.abort()
            self._protocol.connection_lost(exc)
            return
        protocol = self._protocol
        if tls is None or self._lost is not None:
            protocol.connection_lost(self._lost[0] if self._lost else None)
            return
        self._handed_over = True
        tls.set_protocol(protocol)
        protocol.connection_made(tls)
        early, self._early = self._early, []
        for data in early:
            protocol.data_received(data)

    def data_received(self, data: bytes) -> None:
        self._early.append(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handed_over:
            return
        if self._task is not None and not self._task.done():
            # Gone during the handshake, or before start_tls returned to us.
            self._lost = (exc,)
            return
        self._protocol.connection_lost(exc)


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
        if protocol is None:
            return _Refused()
        if ssl_context is None:
            return protocol
        return _TlsAcceptor(protocol, ssl_context, handshake_timeout)

    if sock is not None:
        return await loop.create_server(accept, sock=sock, backlog=backlog)
    return await loop.create_server(
        accept,
        host,
        port,
        backlog=backlog,
        reuse_address=True,
        reuse_port=reuse_port or None,
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
