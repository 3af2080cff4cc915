"""Hostile and faulty peers against the WebSocket transport, on asyncio and uvloop.

Slowloris handshakes, pending handshakes past ``max_connections``, oversize request heads,
bad Host headers and DNS rebinding, peers that never read or never answer pings. Each test
measures what the server holds (its connection table, tracemalloc), checks that a canary
client of another server on the same loop keeps getting answers during the attack, and that
the attacked server itself still serves a legitimate client afterwards. No fixed sleeps:
conditions are polled with a deadline (tests.browser.eventually) or awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import ssl
import struct
import termios
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.uri import parse_uri

import rpc
from tests.browser import eventually
from tests.certs import Pki
from tests.rpc_helpers import gotalk_peer_registry
from transports.stream import server_ssl_context
from transports.web_http import HttpOptions
from transports.websocket import WebSocketServer, start_websocket_server
from wire import gotalk

pytestmark = pytest.mark.both_loops


class Recorder:
    """A byte sink that records what the transport does to it."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.data: list[bytes] = []
        self.lost: list[BaseException | None] = []
        self.paused = 0
        self.resumed = 0
        self.on_data: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data.append(bytes(data))
        if self.on_data is not None:
            self.on_data(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost.append(exc)

    def pause_writing(self) -> None:
        self.paused += 1

    def resume_writing(self) -> None:
        self.resumed += 1


async def recorder_server(**kwargs: Any) -> tuple[WebSocketServer, list[Recorder], int]:
    sinks: list[Recorder] = []

    def factory() -> Recorder:
        sinks.append(Recorder())
        return sinks[-1]

    http = kwargs.pop("http", HttpOptions(allow_missing_origin=True))
    server = await start_websocket_server("127.0.0.1", 0, factory, http=http, **kwargs)
    return server, sinks, server.sockets[0].getsockname()[1]


class RawClient:
    """A WebSocket client on websockets' sans-I/O ClientProtocol over plain asyncio streams:
    it reads (or not) when the test says, and records every frame, pings included."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int):
        self.reader, self.writer = reader, writer
        self.ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/gotalk/"), max_size=None)
        self.frames: list[Any] = []

    @classmethod
    async def open(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer, port)
        client.ws.send_request(client.ws.connect())
        client.flush()
        while not client.frames_or_open():
            await client.read_once()
        return client

    def frames_or_open(self) -> bool:
        return self.ws.state.name != "CONNECTING"

    def flush(self) -> None:
        for chunk in self.ws.data_to_send():
            if chunk:
                self.writer.write(chunk)
            else:  # websockets' SEND_EOF
                self.writer.close()

    async def read_once(self) -> bool:
        data = await asyncio.wait_for(self.reader.read(65536), 10)
        if not data:
            self.ws.receive_eof()
            self.flush()
            return False
        self.ws.receive_data(data)
        self.frames += [e for e in self.ws.events_received() if hasattr(e, "opcode")]
        self.flush()  # pongs
        return True

    async def read_until_closed(self) -> None:
        while await self.read_once():
            pass

    async def gotalk_results(self, count: int = 1) -> list[Any]:
        """Read (within 5 s) until the frames' payloads, decoded as Gotalk, bring ``count``
        results; the results. Fails if the server closes first."""
        codec = gotalk.GotalkConnection()
        answers: list[Any] = []
        seen = 0
        async with asyncio.timeout(5):
            while sum(isinstance(m, gotalk.Result) for m in answers) < count:
                assert await self.read_once(), "the server closed the connection"
                for frame in self.frames[seen:]:
                    if frame.opcode is Opcode.BINARY or frame.opcode is Opcode.TEXT:
                        answers += codec.receive_data(frame.data)
                seen = len(self.frames)
        return [m for m in answers if isinstance(m, gotalk.Result)]


@pytest.fixture
async def canary() -> AsyncIterator[rpc.Peer]:
    """A ws+gotalk server with a connected client; the test checks it keeps answering."""
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=gotalk_peer_registry()
    ) as server:
        async with rpc.connect(str(server.url)) as peer:
            yield peer


async def answers(peer: rpc.Peer) -> None:
    assert await asyncio.wait_for(peer.request("echo", b"alive", raw=True), 5) == b"alive"


async def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close our end and wait for it (the server may have reset the connection first)."""
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def serves_a_websocket(port: int, sinks: list[Recorder]) -> None:
    """The attacked server still serves: a new WebSocket client gets its 101 and a message
    goes each way between it and the server's sink."""
    before = len(sinks)
    client = await RawClient.open(port)
    try:
        assert client.ws.state.name == "OPEN"
        await eventually(lambda: len(sinks) == before + 1, "the new client's sink")
        sink = sinks[-1]
        client.ws.send_binary(b"legitimate")
        client.flush()
        await eventually(lambda: sink.data == [b"legitimate"], "the client's message")
        sink.transport.write(b"served")
        while not client.frames:
            assert await client.read_once()
        assert [bytes(f.data) for f in client.frames] == [b"served"]
    finally:
        await close_writer(client.writer)


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded in time)."""
    chunks = []
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


async def test_slowloris_handshake_is_closed_by_the_handshake_timeout(canary) -> None:
    http = HttpOptions(allow_missing_origin=True, handshake_timeout=0.5)
    server, sinks, port = await recorder_server(http=http)
    writer = None
    try:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /gotalk/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = loop.time()
        trickle = loop.create_task(_trickle(writer))  # one header byte at a time, never done
        await answers(canary)
        assert await closed_by_server(reader) == b""
        trickle.cancel()
        assert loop.time() - started < 5  # the deadline, not the trickle, ended it
        await eventually(lambda: not server.connections, "connection table emptied")
        await answers(canary)
        await serves_a_websocket(port, sinks)
    finally:
        if writer is not None:
            await close_writer(writer)
        server.close()
        await server.wait_closed()


async def _trickle(writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            writer.write(b"X")
            await writer.drain()
            await asyncio.sleep(0.05)  # the attack's pace, not synchronisation
    except (ConnectionError, asyncio.CancelledError):
        pass


async def test_pending_handshakes_count_toward_max_connections(canary) -> None:
    pending = 30
    http = HttpOptions(allow_missing_origin=True, handshake_timeout=3.0)
    server, sinks, port = await recorder_server(http=http, max_connections=pending + 1)
    try:
        open_client = await RawClient.open(port)  # a legitimate WebSocket: 1 slot
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        silent = []
        for _ in range(pending):  # TCP connected, request head started, never finished
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /gotalk/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 8000)
            silent.append(writer)
        await eventually(lambda: server.pending_handshakes == pending, "all handshakes pending")
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        # each pending handshake holds its head (<= max_request_head) and small objects
        print(f"pending handshake: {held / pending:.0f} bytes each")
        assert held / pending < http.max_request_head + 16 * 1024, held / pending
        # past the limit: refused at once with 503, the table does not grow
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /gotalk/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await closed_by_server(reader)).startswith(b"HTTP/1.1 503")
        assert len(server.connections) == pending + 1
        await answers(canary)
        # the deadline frees the slots: a new WebSocket connects again
        await eventually(lambda: server.pending_handshakes == 0, "deadline passed", 10)
        again = await RawClient.open(port)
        assert again.ws.state.name == "OPEN" and open_client.ws.state.name == "OPEN"
        for w in [*silent, writer, open_client.writer, again.writer]:
            w.close()
        assert len(sinks) == 2
    finally:
        server.close()
        await server.wait_closed()


async def test_tls_connections_past_max_connections_are_closed_before_tls(canary, pki: Pki) -> None:
    """wss: silent TCP connections to the TLS port hold the slots; those past the limit are
    closed at accept, before any TLS (no TLS buffers held); the handshake limit frees the
    slots and a real wss client gets in."""
    http = HttpOptions(allow_missing_origin=True, handshake_timeout=3.0)
    ctx = server_ssl_context(pki.server_cert, pki.server_key)
    server, sinks, port = await recorder_server(http=http, max_connections=10, ssl_context=ctx)
    try:
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
        await eventually(lambda: len(server.connections) == 10, "10 slots taken")
        reads = [asyncio.ensure_future(reader.read(1)) for reader, _ in silent]
        # 30 are closed at once, without a byte of TLS; the 10 admitted wait in their TLS
        # handshake (the limit is 3 s, this window 1 s)
        done, pending = await asyncio.wait(reads, timeout=1.0)
        assert all(read.result() == b"" for read in done)
        closed = len(done)
        for read in pending:
            read.cancel()
        assert closed == 30 and len(server.connections) == 10
        await answers(canary)
        await eventually(lambda: not server.connections, "handshake limit passed", 10)
        client_ctx = ssl.create_default_context(cafile=str(pki.ca))
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1"
        )
        writer.write(
            b"GET /gotalk/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
        await eventually(lambda: len(sinks) == 1, "the wss client's sink")
        for w in [writer, *(w for _, w in silent)]:
            w.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_oversize_request_head_gets_431(canary) -> None:
    http = HttpOptions(allow_missing_origin=True, max_request_head=4096)
    server, sinks, port = await recorder_server(http=http)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /gotalk/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(64):  # 64 KiB of short header lines, far past the 4 KiB cap
            writer.write(b"X-Filler: " + b"b" * 1000 + b"\r\n")
        reply = await closed_by_server(reader)
        assert reply.startswith(b"HTTP/1.1 431"), reply[:80]
        # the server half-closed after its answer and waits for ours
        await close_writer(writer)
        await answers(canary)
        await eventually(lambda: not server.connections, "connection table emptied")
        await serves_a_websocket(port, sinks)
    finally:
        server.close()
        await server.wait_closed()


async def http_request(port: int, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    if b"Upgrade" in head:  # a 101 leaves the connection open: read the response head
        reply = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.close()
        return reply
    reply = await closed_by_server(reader)
    writer.close()
    return reply


UPGRADE = (
    b"GET /gotalk/ HTTP/1.1\r\nHost: %s\r\nOrigin: %s\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)


async def test_bad_host_and_dns_rebinding_are_refused(canary) -> None:
    server, _, port = await recorder_server(http=HttpOptions())
    try:
        evil = b"evil.example:%d" % port
        reply = await http_request(
            port, b"GET /gotalk/gotalk.js HTTP/1.1\r\nHost: %s\r\n\r\n" % evil
        )
        assert reply.startswith(b"HTTP/1.1 400") and b"not an allowed host" in reply
        # a DNS-rebound page: Host and Origin agree, but name a host we are not
        reply = await http_request(port, UPGRADE % (evil, b"http://" + evil))
        assert reply.startswith(b"HTTP/1.1 400"), reply[:60]
        # the same page on an allowed name: accepted, scheme/host case and "/" ignored
        for host, origin in (
            (b"127.0.0.1:%d" % port, b"HTTP://127.0.0.1:%d/" % port),
            (b"LOCALHOST:%d" % port, b"http://localhost:%d" % port),
        ):
            reply = await http_request(port, UPGRADE % (host, origin))
            assert reply.startswith(b"HTTP/1.1 101"), reply[:60]
        # same origin means the same port too
        reply = await http_request(port, UPGRADE % (b"127.0.0.1:%d" % port, b"http://127.0.0.1:1"))
        assert reply.startswith(b"HTTP/1.1 403"), reply[:60]
        await answers(canary)
    finally:
        server.close()
        await server.wait_closed()
    # allowed_hosts names the hosts, origins entries are normalised
    http = HttpOptions(allowed_hosts=["app.example"], origins=["HTTPS://App.Example/"])
    server, _, port = await recorder_server(http=http)
    try:
        reply = await http_request(port, UPGRADE % (b"app.example", b"https://app.example"))
        assert reply.startswith(b"HTTP/1.1 101"), reply[:60]
        reply = await http_request(port, UPGRADE % (b"127.0.0.1:%d" % port, b"https://app.example"))
        assert reply.startswith(b"HTTP/1.1 400"), reply[:60]
    finally:
        server.close()
        await server.wait_closed()


async def test_pause_reading_stops_reading_the_socket() -> None:
    server, sinks, port = await recorder_server()
    try:
        client = await RawClient.open(port)
        await eventually(lambda: sinks and sinks[0].transport is not None, "connected")
        sink = sinks[0]
        sink.on_data = lambda s: s.transport.pause_reading() if len(s.data) == 3 else None
        count = 4000  # 4000 x 4 KiB: more than the socket buffers hold
        for i in range(count):
            client.ws.send_binary(b"%04d" % i + b"x" * 4092)
        client.flush()
        drained = asyncio.get_running_loop().create_task(client.writer.drain())
        await eventually(lambda: len(sink.data) >= 3, "first messages")
        assert not sink.transport.is_reading()
        # the bytes pile up unread in the server's socket, none reach the sink
        server_socket = sink.transport.get_extra_info("socket")
        await eventually(lambda: unread(server_socket) > 16384, "data waiting in the socket")
        assert len(sink.data) == 3 and not drained.done()
        assert client.writer.transport.get_write_buffer_size() > 1_000_000
        sink.on_data = None
        sink.transport.resume_reading()
        await eventually(lambda: len(sink.data) == count, "all messages after resume")
        assert [d[:4] for d in sink.data] == [b"%04d" % i for i in range(count)]
        await drained
        client.writer.close()
    finally:
        server.close()
        await server.wait_closed()


def unread(sock: Any) -> int:
    """Bytes waiting in a socket's receive queue (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]


async def test_a_peer_that_does_not_read_pauses_writing() -> None:
    server, sinks, port = await recorder_server(high_water=64 * 1024)
    try:
        client = await RawClient.open(port)  # then never reads
        await eventually(lambda: sinks and sinks[0].transport is not None, "connected")
        sink, chunk = sinks[0], b"y" * 65536
        written = 0
        while not sink.paused and written < 512:
            sink.transport.write(chunk)
            written += 1
            await asyncio.sleep(0)  # let the loop flush to the kernel
        assert sink.paused == 1 and sink.transport.get_write_buffer_size() > 64 * 1024
        assert written < 512  # bounded by socket buffers, then paused
        while sink.resumed == 0:  # the client reads: the buffer drains, writing resumes
            assert await client.read_once()
        assert sum(len(f.data) for f in client.frames) > 0
        client.writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_keepalive_pings_and_closes_a_silent_peer() -> None:
    server, sinks, port = await recorder_server(
        ping_interval=0.1, ping_timeout=0.2, close_timeout=0.5
    )
    try:
        answering = await RawClient.open(port)  # answers pings (sans-I/O pongs)
        while sum(f.opcode is Opcode.PING for f in answering.frames) < 3:
            assert await answering.read_once()

        async def answer_on() -> None:  # it reads (and so answers) all along, not only
            while await answering.read_once():  # until its third ping: a peer that stops
                pass  # answering is closed too, in a race with the silent one

        answers = asyncio.ensure_future(answer_on())
        silent = await RawClient.open(port)  # reads nothing, answers nothing
        await eventually(lambda: len(sinks) == 2 and sinks[1].lost, "silent peer closed", 5)
        assert isinstance(sinks[1].lost[0], ConnectionError)
        assert not sinks[0].lost  # the answering peer is still connected
        assert not answers.done()
        answers.cancel()
        silent.writer.close()
        answering.writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_transport_interface_close_and_server_close() -> None:
    server, sinks, port = await recorder_server()
    try:
        client = await RawClient.open(port)
        await eventually(lambda: sinks and sinks[0].transport is not None, "connected")
        transport = sinks[0].transport
        assert transport.get_extra_info("message_framed") is True
        assert transport.get_extra_info("peername")[0] == "127.0.0.1"
        assert transport.get_extra_info("sockname")[1] == port
        assert transport.get_extra_info("request").path == "/gotalk/"
        assert transport.get_extra_info("sslcontext") is None
        transport.writelines([b"one", b"two"])
        transport.write(b"three")
        while len(client.frames) < 3:
            assert await client.read_once()
        assert [bytes(f.data) for f in client.frames] == [b"one", b"two", b"three"]
        transport.close()  # close handshake: 1000 to the peer, then TCP close
        assert transport.is_closing()
        await client.read_until_closed()
        assert client.ws.close_rcvd is not None and client.ws.close_rcvd.code == 1000
        await eventually(lambda: sinks[0].lost, "close reported")
        assert sinks[0].lost == [None]
        second = await RawClient.open(port)
        server.close()  # open connections get 1001 (going away)
        await second.read_until_closed()
        assert second.ws.close_rcvd is not None and second.ws.close_rcvd.code == 1001
        await asyncio.wait_for(server.wait_closed(), 5)
        assert not server.connections
    finally:
        server.close()
        await server.wait_closed()
