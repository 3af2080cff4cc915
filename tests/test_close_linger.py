"""How long closing a connection waits for a peer that does not answer our close: a TLS
server that never answers close_notify, a WebSocket server that never answers the close
frame. ``abort()`` (a violation, a liveness or handshake limit) does not wait for them at
all; ``close()`` waits at most ``rpc.closing.LINGER`` (5 s). Before, TLS waited for the TLS
layer's own shutdown timeout (30 s), WebSocket for ``close_timeout`` (10 s), and a
``close()`` after an ``abort()`` over TLS raised AttributeError on asyncio."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ssl

import pytest

import rpc
from rpc.reconnect import ConnectionState, Transition
from tests.certs import Pki
from transports.stream import client_ssl_context, server_ssl_context

FAST = rpc.Reconnect(backoff=rpc.Backoff(base=0.01, cap=0.02))
GIVEN_UP = 8.0
"""A connection given up on (abort) is gone well within this; before: 11 s (WebSocket),
31 s (TLS)."""

pytestmark = pytest.mark.both_loops


class DeafTls(asyncio.Protocol):
    """The server side of TLS done by hand (``ssl.MemoryBIO``): it completes the handshake,
    sends ``greeting`` and then ignores whatever comes, our close_notify included."""

    def __init__(self, ctx: ssl.SSLContext, greeting: bytes, held: list[asyncio.Transport]):
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._in, self._out, server_side=True)
        self._greeting = greeting
        self._held = held
        self._done = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._held.append(self._transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        if self._done or self._transport is None:
            return  # deaf from now on
        self._in.write(data)
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        else:
            self._done = True
            self._tls.write(self._greeting)
        self._transport.write(self._out.read())


class DeafWebSocket(asyncio.Protocol):
    """Accepts a WebSocket upgrade, sends ``greeting`` (a binary message, if any) and then
    ignores whatever comes, our close frame included."""

    def __init__(self, greeting: bytes, held: list[asyncio.Transport]):
        self._head = b""
        self._greeting = greeting
        self._held = held
        self._done = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._held.append(self._transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        if self._done or self._transport is None:
            return
        self._head += data
        if b"\r\n\r\n" not in self._head:
            return
        self._done = True
        key = next(
            line.split(b":", 1)[1].strip()
            for line in self._head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        magic = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        accept = base64.b64encode(hashlib.sha1(key + magic).digest())
        self._transport.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        if self._greeting:  # one unmasked binary frame (payloads under 126 bytes)
            self._transport.write(bytes((0x82, len(self._greeting))) + self._greeting)


class DeafServer:
    """A server on 127.0.0.1 whose connections never answer our close; ``url`` to reach
    it. Its connections are aborted when the block ends."""

    def __init__(self, scheme: str, greeting: bytes, pki: Pki | None = None) -> None:
        self.scheme = scheme
        self.greeting = greeting
        self.ctx = server_ssl_context(pki.server_cert, pki.server_key) if pki else None
        self.held: list[asyncio.Transport] = []
        self.server: asyncio.Server | None = None
        self.url = ""

    def _protocol(self) -> asyncio.Protocol:
        if self.ctx is not None:
            return DeafTls(self.ctx, self.greeting, self.held)
        return DeafWebSocket(self.greeting, self.held)

    async def __aenter__(self) -> DeafServer:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self._protocol, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"{self.scheme}://127.0.0.1:{port}/"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for transport in self.held:
            transport.abort()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def tls_client(pki: Pki) -> ssl.SSLContext:
    return client_ssl_context(cafile=pki.ca)


async def test_close_after_abort_over_tls_returns_at_once(pki: Pki) -> None:
    """``close()`` after ``abort()`` (what a violation or a limit does) over TLS: it raised
    AttributeError on asyncio (a second ``close()`` of its TLS transport) and took 30 s on
    uvloop (the wait for the peer's close_notify)."""
    async with DeafServer("ssl+gotalk", b"01", pki) as server:
        peer = await rpc.connect(server.url, ssl=tls_client(pki), reconnect=False)
        loop = asyncio.get_running_loop()
        start = loop.time()
        peer.abort()
        async with asyncio.timeout(GIVEN_UP):
            await peer.close()
        assert peer.closed.done()
        assert loop.time() - start < GIVEN_UP


async def test_a_reconnecting_tls_client_closes_after_its_connection_was_aborted(
    pki: Pki,
) -> None:
    """The reconnecting client's ``close()`` after its connection's ``abort()``: it raised
    AttributeError on asyncio and left the client open, its ``closed`` never resolved."""
    async with DeafServer("ssl+gotalk", b"01", pki) as server:
        client = await rpc.connect(server.url, ssl=tls_client(pki), reconnect=FAST)
        connection = client.connection
        assert connection is not None
        connection.abort()
        async with asyncio.timeout(GIVEN_UP):
            await client.close()
        assert client.connection_state is ConnectionState.CLOSED
        assert client.closed.done()


@pytest.mark.parametrize("scheme", ["ssl+gotalk", "ws+gotalk"])
async def test_a_handshake_limit_reconnects_without_waiting_for_the_server(
    pki: Pki, scheme: str
) -> None:
    """A server that never completes the Gotalk version (half of it over TLS, none over
    WebSocket) is left at the handshake limit (1 s), and the client reconnects then: before,
    only once the server had not answered our close for 30 s (TLS) or 10 s (WebSocket)."""
    tls = scheme.startswith("ssl")
    async with DeafServer(scheme, b"0" if tls else b"", pki if tls else None) as server:
        loop = asyncio.get_running_loop()
        reconnecting = asyncio.Event()

        def on_state(transition: Transition) -> None:
            if transition.state is ConnectionState.RECONNECTING:
                reconnecting.set()

        start = loop.time()
        client = await rpc.connect(
            server.url,
            ssl=tls_client(pki) if tls else None,
            options=rpc.Options(handshake_timeout=1.0),
            reconnect=FAST,
            on_state=on_state,
        )
        try:
            async with asyncio.timeout(GIVEN_UP):
                await reconnecting.wait()
            assert loop.time() - start < GIVEN_UP
        finally:
            async with asyncio.timeout(GIVEN_UP):
                await client.close()
