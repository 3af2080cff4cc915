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
from typing import cast

import pytest

import rpc
import rpc.closing
import transports.stream
import transports.websocket
from rpc.reconnect import ConnectionState, Transition
from tests.certs import Pki
from transports.stream import (
    client_ssl_context,
    open_stream,
    server_ssl_context,
    start_stream_server,
)

FAST = rpc.Reconnect(backoff=rpc.Backoff(base=0.01, cap=0.02))
LINGER = 1.0
"""The linger and the TLS shutdown timeout here (5 s by default; shortened for the
tests, see ``short_waits``)."""
GIVEN_UP = 4.0
"""A connection given up on (abort) is gone well within this; before: 11 s (WebSocket),
31 s (TLS). A graceful close against a peer that does not answer takes the linger: within
this too; before: 10 s (WebSocket), 30 s (TLS)."""

pytestmark = pytest.mark.both_loops


@pytest.fixture(autouse=True)
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The linger and TLS shutdown timeout at ``LINGER`` s, so that each test waits for
    them in a second, not five; the waits they replaced (10 s, 30 s) still fail them."""
    monkeypatch.setattr(rpc.closing, "LINGER", LINGER)
    monkeypatch.setattr(transports.stream, "TLS_SHUTDOWN_TIMEOUT", LINGER)
    monkeypatch.setattr(transports.websocket, "TLS_SHUTDOWN_TIMEOUT", LINGER)


class Deaf:
    """What a deaf protocol (``DeafTls``, ``DeafWebSocket``) keeps of its connection: the
    transport, put in ``held`` once made (whoever made ``held`` aborts them at the end),
    the ``greeting`` to send, and ``done``: said all it will, deaf from then on."""

    def __init__(self, greeting: bytes, held: list[asyncio.Transport]) -> None:
        self.greeting = greeting
        self.held = held
        self.done = False
        self.transport: asyncio.Transport | None = None

    def made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.held.append(self.transport)


class DeafTls(asyncio.Protocol):
    """TLS done by hand (``ssl.MemoryBIO``), server or client side: it completes the
    handshake, sends ``greeting`` and then ignores whatever comes, our close_notify
    included."""

    def __init__(
        self,
        ctx: ssl.SSLContext,
        greeting: bytes,
        held: list[asyncio.Transport],
        *,
        server_hostname: str | None = None,
    ) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        side = {"server_hostname": server_hostname} if server_hostname else {"server_side": True}
        self._tls = ctx.wrap_bio(self._in, self._out, **side)  # type: ignore[arg-type]
        self._deaf = Deaf(greeting, held)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._deaf.made(transport)
        if not self._tls.server_side:
            self.data_received(b"")  # the client speaks first

    def data_received(self, data: bytes) -> None:
        deaf = self._deaf
        if deaf.done or deaf.transport is None:
            return  # deaf from now on
        self._in.write(data)
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        else:
            deaf.done = True
            if deaf.greeting:
                self._tls.write(deaf.greeting)
        deaf.transport.write(self._out.read())


class DeafWebSocket(asyncio.Protocol):
    """Accepts a WebSocket upgrade, sends ``greeting`` (a binary message, if any) and then
    ignores whatever comes, our close frame included."""

    def __init__(self, greeting: bytes, held: list[asyncio.Transport]):
        self._head = b""
        self._deaf = Deaf(greeting, held)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._deaf.made(transport)

    def data_received(self, data: bytes) -> None:
        deaf = self._deaf
        if deaf.done or deaf.transport is None:
            return
        self._head += data
        if b"\r\n\r\n" not in self._head:
            return
        deaf.done = True
        key = next(
            line.split(b":", 1)[1].strip()
            for line in self._head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        magic = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        accept = base64.b64encode(hashlib.sha1(key + magic).digest())
        deaf.transport.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        if deaf.greeting:  # one unmasked binary frame (payloads under 126 bytes)
            deaf.transport.write(bytes((0x82, len(deaf.greeting))) + deaf.greeting)


class DeafServer:
    """A server on 127.0.0.1 whose connections never answer our close; ``url`` to reach
    it. Its connections are aborted when the block ends."""

    def __init__(self, scheme: str, greeting: bytes, pki: Pki | None = None) -> None:
        self.scheme = scheme
        self.greeting = greeting
        self.ctx = server_ssl_context(pki.server_cert, pki.server_key) if pki else None
        self.held: list[asyncio.Transport] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self.url = ""

    def _protocol(self) -> asyncio.Protocol:
        if self.ctx is not None:
            return DeafTls(self.ctx, self.greeting, self.held)
        return DeafWebSocket(self.greeting, self.held)

    async def __aenter__(self) -> DeafServer:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self._protocol, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"{self.scheme}://127.0.0.1:{self.port}/"
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


@pytest.mark.parametrize("scheme", ["ssl+gotalk", "ws+gotalk"])
async def test_close_waits_the_linger_for_a_peer_that_does_not_answer(
    pki: Pki, scheme: str
) -> None:
    """A graceful ``close()`` sends TLS's close_notify or WebSocket's close frame and waits
    for the answer at most the linger (5 s by default): before, 30 s (the TLS layer's own shutdown
    timeout: the linger was armed only while bytes were unsent) or 10 s (``close_timeout``)."""
    tls = scheme.startswith("ssl")
    async with DeafServer(scheme, b"01", pki if tls else None) as server:
        peer = await rpc.connect(server.url, ssl=tls_client(pki) if tls else None, reconnect=False)
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with asyncio.timeout(GIVEN_UP):
            await peer.close()
        took = loop.time() - start
        assert LINGER - 0.5 < took < GIVEN_UP, took  # the handshake was waited for, bounded


class Ends(asyncio.Protocol):
    """A plain protocol: ``made`` resolves with its transport (a TLS one once its handshake
    is done), ``lost`` when its connection ends."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.made: asyncio.Future[asyncio.Transport] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.made.set_result(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


async def test_a_tls_client_transport_waits_at_most_its_shutdown_timeout_for_close_notify(
    pki: Pki,
) -> None:
    """Below the RPC core: ``open_stream``'s TLS transport, closed, is cut after
    ``TLS_SHUTDOWN_TIMEOUT`` (5 s by default) when the server never answers close_notify;
    was 30 s."""
    async with DeafServer("ssl+gotalk", b"", pki) as server:
        ends = Ends()
        await open_stream(
            "127.0.0.1",
            server.port,
            lambda: ends,
            ssl_context=tls_client(pki),
            server_hostname="localhost",
        )
        assert ends.transport is not None
        loop = asyncio.get_running_loop()
        start = loop.time()
        ends.transport.close()
        async with asyncio.timeout(GIVEN_UP):
            await ends.lost
        assert loop.time() - start < GIVEN_UP


async def test_a_tls_server_transport_waits_at_most_its_shutdown_timeout_for_close_notify(
    pki: Pki,
) -> None:
    """The server side (``TlsServer``): a connection it closes is cut after
    ``TLS_SHUTDOWN_TIMEOUT`` when the client never answers close_notify; was 30 s."""
    accepted: asyncio.Queue[Ends] = asyncio.Queue()

    def admit() -> Ends:
        ends = Ends()
        accepted.put_nowait(ends)
        return ends

    server = await start_stream_server(
        "127.0.0.1", 0, admit, ssl_context=server_ssl_context(pki.server_cert, pki.server_key)
    )
    held: list[asyncio.Transport] = []
    try:
        loop = asyncio.get_running_loop()
        port = server.sockets[0].getsockname()[1]
        ctx = tls_client(pki)
        await loop.create_connection(
            lambda: DeafTls(ctx, b"", held, server_hostname="localhost"), "127.0.0.1", port
        )
        ends = await accepted.get()
        async with asyncio.timeout(GIVEN_UP):
            transport = await ends.made
        start = loop.time()
        transport.close()
        async with asyncio.timeout(GIVEN_UP):
            await ends.lost
        assert loop.time() - start < GIVEN_UP
    finally:
        for transport in held:
            transport.abort()
        server.close()
        await server.wait_closed()
