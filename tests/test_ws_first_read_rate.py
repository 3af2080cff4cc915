"""The read that completes the opening handshake counts toward the least input rate like any
later read (transports.ws_input_rate): a peer that sends its HTTP head (the client's upgrade
request, the server's 101) and, in the same segment, part of a frame or the first fragment
of a message, then stalls, is sent close code 1008 once under ``min_rate`` past
``rate_grace``. Before, that read was fed to websockets before the rate check existed and
was never counted, so such a peer was cut only by the keepalive (20 s + 20 s by default;
after a whole first fragment, never, if it answered pings): the closing tests fail on
30b37a2, on both loops. A peer whose first read leaves nothing unfinished is not closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Close, CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from tests.rpc_helpers import wait_until
from tests.test_web_hostile import Recorder, recorder_server
from transports.stream import ClosedHere
from transports.websocket import open_websocket

pytestmark = pytest.mark.both_loops

RATE, GRACE, CLOSE_TIMEOUT = 1000.0, 0.3, 0.5
"""Closed after 0.3 s (+ one 0.05-s confirming look) under 1,000 bytes a second."""
BOUND = 1.5
"""Seconds from the stalling write to the close frame: the grace, the confirming look and
slack for a loaded machine (the keepalive would take 40 s)."""

QUIET = 3 * GRACE + 0.05
"""Seconds of silence past which a count begun at the handshake's read would have closed
the connection (the grace, the confirming look, and two graces more)."""

PARTIAL = "partial frame"
FRAGMENT = "first fragment"


def stalled_input(kind: str, *, mask: bool) -> bytes:
    """What follows the HTTP head in the same write: 10 bytes of a 1,000-byte frame, or a
    whole first fragment of a message whose rest never comes."""
    if kind == PARTIAL:
        frame = Frame(Opcode.BINARY, b"x" * 1000)
        return frame.serialize(mask=mask, extensions=[])[:10]
    return Frame(Opcode.BINARY, b"y" * 10, fin=False).serialize(mask=mask, extensions=[])


async def close_code_within(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    ws: ServerProtocol | ClientProtocol,
    bound: float,
    frames: list[Frame] | None = None,
) -> int | None:
    """Read the peer through ``ws`` (answering its close) until it closes; the close code
    it sent (1006 when it closed without one), or None when it did not within ``bound``
    seconds. Every frame read goes to ``frames``."""
    try:
        async with asyncio.timeout(bound):
            while data := await reader.read(65536):
                ws.receive_data(data)
                for event in ws.events_received():
                    if isinstance(event, Frame) and frames is not None:
                        frames.append(event)
                    if isinstance(event, Frame) and event.opcode is Opcode.CLOSE:
                        for chunk in ws.data_to_send():  # our close, in answer
                            if chunk:
                                writer.write(chunk)
                        return Close.parse(event.data).code
    except TimeoutError:
        return None
    return CloseCode.ABNORMAL_CLOSURE


class RawServer:
    """A WebSocket server on websockets' sans-I/O ServerProtocol over a plain socket: it
    answers the first upgrade request with its 101 and ``after`` in one write, then sends
    nothing more, and records the close code the client sent (None: none within ``wait``
    seconds)."""

    def __init__(self, after: bytes, wait: float) -> None:
        self.after = after
        self.wait = wait
        self.written_at = 0.0
        self.closed_at = 0.0
        self.frames: list[Frame] = []
        self.code: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ws = ServerProtocol()
        try:
            ws.receive_data(await reader.readuntil(b"\r\n\r\n"))
            (request,) = ws.events_received()
            assert isinstance(request, Request)
            ws.send_response(ws.accept(request))
            (head,) = ws.data_to_send()
            writer.write(head + self.after)  # one write: one segment on loopback
            loop = asyncio.get_running_loop()
            self.written_at = loop.time()
            code = await close_code_within(reader, writer, ws, self.wait, self.frames)
            self.closed_at = loop.time()
            self.code.set_result(code)
        finally:
            writer.transport.abort()


StartRaw = Callable[..., Awaitable[tuple[RawServer, int]]]
"""Starts a RawServer: ``(after, wait=...)`` to its port."""


@pytest.fixture
async def raw_server() -> AsyncIterator[StartRaw]:
    """Starts a :class:`RawServer` on 127.0.0.1 port 0; closes them all at the end."""
    servers: list[asyncio.Server] = []

    async def start(after: bytes, wait: float = BOUND + 1.5) -> tuple[RawServer, int]:
        raw = RawServer(after, wait)
        server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
        servers.append(server)
        return raw, server.sockets[0].getsockname()[1]

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def open_client(port: int) -> Recorder:
    sink = await open_websocket(
        f"ws://127.0.0.1:{port}/",
        Recorder,
        min_rate=RATE,
        rate_grace=GRACE,
        close_timeout=CLOSE_TIMEOUT,
    )
    assert isinstance(sink, Recorder)
    return sink


@pytest.mark.parametrize("kind", [PARTIAL, FRAGMENT])
async def test_a_server_stalling_in_the_read_of_its_101_is_closed(
    kind: str, raw_server: StartRaw
) -> None:
    """The client side: the 101 and a partial frame (or a first fragment) in one segment."""
    raw, port = await raw_server(stalled_input(kind, mask=False))
    sink = await open_client(port)
    assert await raw.code == CloseCode.POLICY_VIOLATION
    assert GRACE <= raw.closed_at - raw.written_at < BOUND
    if kind == FRAGMENT:
        assert sink.data == [b"y" * 10]  # the fragment reached the sink
    await wait_until(lambda: sink.lost)
    (error,) = sink.lost
    assert isinstance(error, ClosedHere) and error.code == CloseCode.POLICY_VIOLATION


@pytest.mark.parametrize("after", [b"", b"whole"], ids=["nothing", "a whole message"])
async def test_a_server_whose_101_read_ends_whole_is_not_closed(
    after: bytes, raw_server: StartRaw
) -> None:
    """The 101 alone, or with one whole message: nothing unfinished, so no count begins
    and the silence that follows (QUIET) is not taken for a slow frame."""
    frame = Frame(Opcode.BINARY, after).serialize(mask=False, extensions=[]) if after else b""
    raw, port = await raw_server(frame, QUIET)
    sink = await open_client(port)
    assert await raw.code is None  # not closed in the silence being tested
    assert sink.data == ([after] if after else [])
    assert not sink.lost
    sink.transport.abort()


class Greeter(Recorder):
    """A sink that says hello as soon as it is connected (a Gotalk client sends its version
    then)."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        transport.write(b"hello")


async def test_a_ping_in_the_read_of_the_101_does_not_displace_the_first_message(
    raw_server: StartRaw,
) -> None:
    """The 101 and a ping in one segment: the pong websockets queues for it goes out before
    the sink, opened within that read, writes its first message, which is not lost."""
    ping = Frame(Opcode.PING, b"ping").serialize(mask=False, extensions=[])
    raw, port = await raw_server(ping)
    sink = await open_websocket(f"ws://127.0.0.1:{port}/", Greeter, min_rate=RATE)
    assert isinstance(sink, Greeter)
    try:
        await wait_until(lambda: any(f.opcode is Opcode.BINARY for f in raw.frames))
        assert [(f.opcode, f.data) for f in raw.frames[:2]] == [
            (Opcode.PONG, b"ping"),
            (Opcode.BINARY, b"hello"),
        ]
    finally:
        sink.transport.abort()


async def upgrade_with(
    port: int, after: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, ClientProtocol]:
    """A raw client that writes its upgrade request and ``after`` in one write."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/gotalk/"))
    ws.send_request(ws.connect())
    (request,) = ws.data_to_send()
    writer.write(request + after)  # one write: one segment on loopback
    return reader, writer, ws


@pytest.mark.parametrize("kind", [PARTIAL, FRAGMENT])
async def test_a_client_stalling_in_the_read_of_its_request_is_closed(kind: str) -> None:
    """The server side: the upgrade request and a partial frame (or a first fragment) in
    one segment."""
    server, sinks, port = await recorder_server(
        min_rate=RATE, rate_grace=GRACE, close_timeout=CLOSE_TIMEOUT
    )
    try:
        loop = asyncio.get_running_loop()
        reader, writer, ws = await upgrade_with(port, stalled_input(kind, mask=True))
        written_at = loop.time()
        try:
            code = await close_code_within(reader, writer, ws, BOUND + 1.5)
            assert code == CloseCode.POLICY_VIOLATION, code
            assert GRACE <= loop.time() - written_at < BOUND
        finally:
            writer.transport.abort()
        (sink,) = sinks
        if kind == FRAGMENT:
            assert sink.data == [b"y" * 10]  # the fragment reached the sink
        await wait_until(lambda: sink.lost)
        (error,) = sink.lost
        assert isinstance(error, ClosedHere) and error.code == CloseCode.POLICY_VIOLATION
    finally:
        server.close()
        await server.wait_closed()
