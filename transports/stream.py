"""TCP and TLS transports: the loop drives the RPC core's protocol objects directly.

A protocol here is any asyncio protocol that takes bytes (the RPC core's Peer, a
``BufferedProtocol`` that reads into :mod:`transports.read_buffer`, is one); this module
knows nothing of any wire format. It listens and connects, bounds TLS handshakes and builds TLS
contexts. TCP_NODELAY is set by asyncio and uvloop on every TCP transport they create.

Servers take a factory, called when a connection is accepted (before any TLS handshake),
that may refuse it by returning None: the connection is then closed at once, before any TLS
(:class:`TlsServer`). An admitted TLS connection's handshake is bounded by
``handshake_timeout`` (default 10 s); a server counting its connections from the factory
therefore counts handshakes in progress too. A protocol whose TLS handshake fails (the peer
closed, sent no TLS, or ran out of time) gets ``connection_lost(exc)`` without
``connection_made``, so its owner frees its place at once; one whose handshake ``close()``
gives up hears nothing (its owner closes it with the server). A closing TLS connection, on
either side, waits at most ``TLS_SHUTDOWN_TIMEOUT`` (5 s) for the peer's close_notify.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

log = logging.getLogger("peerwire.transports")

TLS_SHUTDOWN_TIMEOUT = 5.0
"""Seconds a closing TLS connection waits for the peer's close_notify before it is cut, on
both sides (``ssl_shutdown_timeout``; asyncio's and uvloop's default is 30 s): a peer that
never answers held a closed connection, and whoever awaited its end, that long. As the RPC
core's linger after a close (``rpc.closing.LINGER``)."""


class ByteSink(Protocol):
    """What a transport drives: the asyncio protocol callbacks, ``data_received`` included
    (the RPC core's Peer, a buffered protocol that also takes bytes handed to it)."""

    def connection_made(self, transport: Any) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def eof_received(self) -> bool | None: ...
    def connection_lost(self, exc: BaseException | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


ProtocolFactory = Callable[[], asyncio.BaseProtocol | None]
"""Makes the protocol of an accepted connection, or returns None to refuse it."""


class TlsFailure(ConnectionError):
    """A TLS connection could not be set up; ``kind`` says why (see :func:`tls_failure`)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


class ClosedBeforeReply(ConnectionError):
    """The peer closed the connection before its first byte."""


class ClosedHere(ConnectionError):
    """This side's transport closed the connection on a limit of its own (a WebSocket close
    code it sent: input too slow, keepalive ping timeout, a message too large): what the
    protocol above hears in ``connection_lost``, so that it is not taken for the peer's.
    ``code``: the close code sent; ``too_large``: it was for an incoming message over the
    size limit (WebSocket's 1009)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    @property
    def too_large(self) -> bool:
        return self.code == 1009


_UNKNOWN_CA_CODES = frozenset({2, 18, 19, 20, 21})
"""OpenSSL verify codes meaning "signed by no CA we trust" (X509_V_ERR_...)."""
_NAME_MISMATCHES = frozenset({62, 64})
"""OpenSSL's verify codes for a certificate not valid for the host: the name (62), or the IP
address of a URL that names the host by its address (64)."""
_NOT_TLS = frozenset(
    {"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST", "RECORD_LAYER_FAILURE"}
)
_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": (
        "certificate-required",
        "it requires a client certificate and we sent none",
    ),
    "TLSV1_ALERT_UNKNOWN_CA": ("unknown-ca", "it does not trust the CA of our client certificate"),
    "SSLV3_ALERT_BAD_CERTIFICATE": ("rejected", "it refused our client certificate"),
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": ("rejected", "it refused our client certificate"),
}


def tls_failure(exc: BaseException, *, handshake_done: bool) -> TlsFailure | None:
    """Why a TLS client connection failed, or None when ``exc`` says nothing of TLS.

    Kinds: ``hostname-mismatch`` and ``unknown-ca`` (our check of the server's certificate,
    or the server's alert about ours), ``certificate-required`` (the server's alert),
    ``rejected`` (the server closed without a word right after the handshake: TLS 1.3
    servers check client certificates then, and Python's servers send no alert),
    ``not-tls`` (the server answered in plain bytes, or closed during the handshake) and
    ``tls`` (anything else).
    """
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = f"{exc.verify_message or exc} ({exc.reason})"
        if exc.verify_code in _NAME_MISMATCHES:
            return TlsFailure("hostname-mismatch", f"hostname mismatch: {detail}")
        if exc.verify_code in _UNKNOWN_CA_CODES:
            return TlsFailure(
                "unknown-ca", f"the server's certificate is signed by an unknown CA: {detail}"
            )
        return TlsFailure("tls", f"the server's certificate failed verification: {detail}")
    if isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLEOFError):
        reason = exc.reason or ""
        if reason in _ALERTS:
            kind, why = _ALERTS[reason]
            return TlsFailure(kind, f"the server refused the TLS connection: {why} ({reason})")
        if reason in _NOT_TLS:
            return TlsFailure(
                "not-tls",
                f"the server does not speak TLS on this port ({reason}): use a "
                "plain URL (tcp+, ws+) or the server's TLS port",
            )
        return TlsFailure("tls", f"TLS failed: {exc}")
    if isinstance(exc, ssl.SSLEOFError | ConnectionResetError | ClosedBeforeReply | EOFError):
        if handshake_done:
            return TlsFailure(
                "rejected",
                "the server closed the connection right after the TLS handshake, "
                "before a word: it did not accept this client (it requires a client "
                "certificate, or does not trust ours)",
            )
        return TlsFailure(
            "not-tls",
            "the server closed the connection during the TLS handshake: it does "
            "not speak TLS on this port (a plain tcp+/ws+ port?) or refused the connection",
        )
    return None


class _FirstReply(asyncio.Protocol):
    """Stands in for ``protocol`` until the peer's first byte, passing every event on; then
    hands the transport over (``set_protocol``) and costs nothing more. ``heard`` resolves
    on that byte, or fails with the connection's end."""

    def __init__(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = cast(ByteSink, protocol)  # the peers open_stream is given take bytes
        self.heard: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.heard.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self.protocol.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._transport.set_protocol(self.protocol)  # a buffered one reads buffered from now
        if not self.heard.done():
            self.heard.set_result(None)
        self.protocol.data_received(data)

    def eof_received(self) -> bool | None:
        return self.protocol.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.heard.done():
            self.heard.set_exception(exc or ClosedBeforeReply("closed before a byte"))
        self.protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()


class _Refused(asyncio.Protocol):
    """Closes a connection the server did not admit."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream connection's transport: uvloop's are not asyncio.Transport subclasses
        cast(asyncio.Transport, transport).abort()


async def open_stream(
    host: str,
    port: int,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    *,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    connect_timeout: float = 10.0,
    first_reply: Callable[[Any], object] | None = None,
) -> asyncio.BaseProtocol:
    """Connect over TCP (TLS when ``ssl_context`` is given) and return the protocol;
    ``connect_timeout`` bounds the TCP connect, the TLS handshake and the first reply.

    With ``first_reply``, it is called with the protocol once connected (to make the peer
    answer, if the protocol's start does not), and we return only after the peer's first
    byte: a server that refuses us after the TLS 1.3 handshake (when client certificates
    are checked) fails here, not on the first request. TLS failures raise
    :class:`TlsFailure` (its ``kind`` says why); a close before that byte
    :class:`ClosedBeforeReply`.
    """
    loop = asyncio.get_running_loop()
    factory: Callable[[], asyncio.BaseProtocol] = protocol_factory
    if first_reply is not None:
        factory = lambda: _FirstReply(protocol_factory())  # noqa: E731
    transport: Any = None
    try:
        async with asyncio.timeout(connect_timeout):
            transport, protocol = await loop.create_connection(
                factory,
                host,
                port,
                ssl=ssl_context,
                server_hostname=server_hostname if ssl_context else None,
                ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT if ssl_context else None,
            )
            if isinstance(protocol, _FirstReply):
                first_reply(protocol.protocol)  # type: ignore[misc]
                await protocol.heard
                protocol = cast(asyncio.BaseProtocol, protocol.protocol)
    except BaseException as exc:
        if transport is not None:
            transport.abort()
        failure = None
        if ssl_context and isinstance(exc, OSError | EOFError):
            failure = tls_failure(exc, handshake_done=transport is not None)
        if failure is not None:
            raise failure from exc
        raise
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
    if ssl_context is not None:
        if sock is None:
            sock = socket.create_server(
                (host, port), backlog=backlog, reuse_port=reuse_port, family=_family(host)
            )
        else:
            sock.listen(backlog)
        server = TlsServer(sock, protocol_factory, ssl_context, handshake_timeout)
        server.start()
        return server  # type: ignore[return-value]

    def accept() -> asyncio.BaseProtocol:
        protocol = protocol_factory()
        return _Refused() if protocol is None else protocol

    if sock is not None:
        return await loop.create_server(accept, sock=sock, backlog=backlog)
    return await loop.create_server(
        accept, host, port, backlog=backlog, reuse_address=True, reuse_port=reuse_port or None
    )


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class TlsServer:
    """A TLS listener that admits before any TLS: each accepted socket goes to the factory
    first, and only an admitted one gets its TLS handshake (``connect_accepted_socket``,
    at most ``handshake_timeout`` s); a refused one is closed at once and costs no TLS
    state. (asyncio's and uvloop's TLS servers start the handshake before the protocol
    hears of the connection, so a refused connection held ~50-300 KB of TLS buffers until
    the handshake limit.) Offers what callers use of ``asyncio.Server``: ``sockets``,
    ``close()``, ``wait_closed()``, ``is_serving()``."""

    def __init__(
        self,
        sock: socket.socket,
        factory: ProtocolFactory,
        ctx: ssl.SSLContext,
        handshake_timeout: float,
    ) -> None:
        self.sockets = [sock]
        self._factory = factory
        self._ctx = ctx
        self._timeout = handshake_timeout
        self._handshakes: set[asyncio.Task[None]] = set()  # each ends within the timeout
        self._accepting: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.sockets[0].setblocking(False)
        self._accepting = asyncio.get_running_loop().create_task(self._accept_loop())

    def is_serving(self) -> bool:
        return self._accepting is not None and not self._accepting.done()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        listener = self.sockets[0]
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except ConnectionAbortedError:  # reset before it was accepted (BSD): as asyncio
                continue
            except OSError as exc:  # out of descriptors or memory: as asyncio, retry in 1 s
                if listener.fileno() < 0:
                    return
                log.error("accepting a TLS connection failed: %s; retrying in 1 s", exc)
                await asyncio.sleep(1.0)
                continue
            protocol = self._factory()
            if protocol is None:
                conn.close()
                continue
            task = loop.create_task(self._handshake(conn, protocol))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, protocol: asyncio.BaseProtocol) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: protocol,
                conn,
                ssl=self._ctx,
                ssl_handshake_timeout=self._timeout,
                ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT,
            )
        except (OSError, ssl.SSLError, EOFError) as exc:  # the transport closed the socket
            log.debug("TLS handshake failed: %s", exc)
            conn.close()
            protocol.connection_lost(exc)  # never opened: its owner frees its place now

    def close(self) -> None:
        """Stop listening and give up the handshakes in progress (admitted connections
        stay open, as with asyncio.Server)."""
        if self._accepting is not None:
            self._accepting.cancel()
        for task in self._handshakes:
            task.cancel()
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        pending = [t for t in (self._accepting, *self._handshakes) if t is not None]
        await asyncio.gather(*pending, return_exceptions=True)


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
    password: Callable[[], str | bytes] | None = None,
) -> ssl.SSLContext:
    """A server context; ``client_cafile`` requires and verifies client certificates;
    ``password``, as ``SSLContext.load_cert_chain`` takes it, for an encrypted key. TLS 1.2
    renegotiation is refused (OpenSSL 3 refuses a client's by default, 1.1.1 does not: a
    peer could make the server redo handshakes at will)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    ctx.load_cert_chain(str(certfile), str(keyfile) if keyfile else None, password=password)
    if client_cafile:
        ctx.load_verify_locations(str(client_cafile))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def server_address(server: Any) -> tuple[str, int]:
    """The (host, port) a server is bound to (the first socket's)."""
    host, port = server.sockets[0].getsockname()[:2]
    return host, port


__all__ = [
    "TLS_SHUTDOWN_TIMEOUT",
    "ByteSink",
    "ClosedBeforeReply",
    "ClosedHere",
    "ProtocolFactory",
    "TlsFailure",
    "TlsServer",
    "client_ssl_context",
    "open_stream",
    "server_address",
    "server_ssl_context",
    "start_stream_server",
    "tls_failure",
]
