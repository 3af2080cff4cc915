"""Found by a soak of hostile peers at scale (hundreds of idle, flooding, trickling and
vanished connections against one server), and by the review of its fixes (review 202: the
last two tests): each test is the least that shows one defect.
"""

from __future__ import annotations

import asyncio
import gc
import ssl
import struct

import pytest
from websockets.frames import Close, CloseCode, Opcode

import rpc
from tests.browser import eventually
from tests.certs import Pki
from tests.test_web_hostile import RawClient, Recorder, recorder_server
from transports.stream import server_ssl_context
from transports.ws_held import FRAMES_PER_TURN
from wire.chatter import ChatterConnection, Dialect

pytestmark = pytest.mark.both_loops

PING_INTERVAL = PING_TIMEOUT = 0.2


async def test_a_websocket_peer_that_vanished_is_cut_at_the_keepalive_limit() -> None:
    """A peer that vanished without a FIN (its host gone, its process stopped) answers
    neither the keepalive's ping nor the close frame that fails it: the connection is cut
    once that close frame is written, at ``ping_interval + ping_timeout``, not after
    ``close_timeout`` (10 s) more of waiting for its closing handshake. Before, 100
    stopped clients held their connections 50 s, not the 40 s of the keepalive."""
    server, sinks, port = await recorder_server(
        ping_interval=PING_INTERVAL, ping_timeout=PING_TIMEOUT
    )
    vanished = await RawClient.open(port)  # from now on reads nothing, sends nothing
    try:
        loop = asyncio.get_running_loop()
        opened = loop.time()
        await eventually(lambda: sinks and sinks[0].lost, "the vanished peer cut", 3.0)
        assert loop.time() - opened < PING_INTERVAL + PING_TIMEOUT + 1.0
        assert isinstance(sinks[0].lost[0], ConnectionError)
        # its last word still went out before the socket closed: ping, close frame, FIN
        async with asyncio.timeout(3.0):  # read without answering: it is still gone
            while data := await vanished.reader.read(65536):
                vanished.ws.receive_data(data)
        vanished.frames += [e for e in vanished.ws.events_received() if hasattr(e, "opcode")]
        [close] = [f for f in vanished.frames if f.opcode is Opcode.CLOSE]
        assert struct.unpack("!H", close.data[:2])[0] == 1011
        assert any(f.opcode is Opcode.PING for f in vanished.frames)
    finally:
        vanished.writer.close()
        server.close()
        await server.wait_closed()


async def test_a_websocket_read_of_many_messages_is_handed_over_a_turn_at_a_time() -> None:
    """A WebSocket message is one read of the sink's, so the RPC peer's own turn
    (``rpc.backlog.MESSAGES_PER_TURN`` messages a read, then the next iteration) never saw more
    than one: the connection handed all the frames of a socket read (256 KiB: thousands of
    small requests) over in one go. With 100 connections flooding so, a canary on another
    waited 5 to 8.7 s for an answer. Now the connection itself hands over that many frames
    a turn: a callback scheduled at the first frame runs before the rest come."""
    server, sinks, port = await recorder_server()
    client = await RawClient.open(port)
    try:
        loop = asyncio.get_running_loop()
        before_turn: list[int] = []

        def first(sink: Recorder) -> None:  # at the first frame: count those before a turn
            sink.on_data = None
            loop.call_soon(lambda: before_turn.append(len(sink.data)))

        await eventually(lambda: sinks and sinks[0].transport is not None, "connected")
        sinks[0].on_data = first
        frames = 4 * FRAMES_PER_TURN
        for i in range(frames):
            client.ws.send_binary(i.to_bytes(2, "big"))
        client.writer.write(b"".join(client.ws.data_to_send()))  # 8 KiB: one segment
        await eventually(lambda: len(sinks[0].data) == frames, "every frame handed over")
        assert before_turn and before_turn[0] <= FRAMES_PER_TURN, before_turn
        assert [int.from_bytes(d, "big") for d in sinks[0].data] == list(range(frames))
    finally:
        client.writer.close()
        server.close()
        await server.wait_closed()


async def test_a_closed_chatter_connection_frees_its_conversations_without_a_collection() -> None:
    """Each request a Chatter peer sends opens a conversation in the codec's table (about
    115 bytes), which stays until answered. The RPC peer lives in reference cycles, so a
    connection closed with thousands unanswered (a non-reader's kept requests, or running
    handlers' as here) leaves its table to the cyclic collector, which a steady server may
    not run for long: 100 non-readers' connections, closed, held 626 MB of RSS for 40 s (no
    collection ran) that one ``gc.collect()`` gave back. Everything else the backlog keeps
    is freed at ``connection_lost``, and so is the table now (``ChatterAdapter.stop``): the
    closed peer, kept alive here with the collector off, holds none of its 2,000 entries.
    (This test measured the table's memory with tracemalloc until 2026-11-28; CPython keeps
    up to 2,000 freed 2-tuples, the table's keys, on a free list that tracemalloc still
    counts where they were made, so what it saw depended on which tuples the free list
    held before.)"""
    never = asyncio.Event()
    registry = rpc.Registry()

    @registry.handle("wait")
    async def wait(_: object = None) -> None:
        await never.wait()

    requests = ChatterConnection(Dialect.CURRENT)
    for _ in range(2000):
        requests.send("wait", b"null", token=True, last=False, bounded=False)
    data = requests.data_to_send()
    gc.collect()
    gc.disable()
    try:
        options = rpc.Options(max_concurrent=4096)  # every request runs, none is answered
        async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry, options=options) as srv:
            _reader, writer = await asyncio.open_connection("127.0.0.1", srv.url.port)
            writer.write(data)
            await eventually(lambda: srv.peers and open_conversations(srv) >= 2000, "all open")
            [peer] = srv.peers
            writer.transport.abort()
            await eventually(lambda: not srv.peers, "the connection closed")
            assert peer.adapter.codec.open_conversations == 0
    finally:
        gc.enable()


def open_conversations(srv: rpc.Server) -> int:
    return sum(peer.adapter.codec.open_conversations for peer in srv.peers)


async def test_frames_read_with_a_close_over_tls_all_reach_the_sink(pki: Pki) -> None:
    """A wss client sends many small messages, then its close frame, in one read. The server
    answers the close and, TLS having no half-close, closes the socket at once: the TLS
    shutdown's connection_lost must not drop the frames still held for their turn (before
    7eca8ba all were handed over within the read)."""
    ctx = server_ssl_context(pki.server_cert, pki.server_key)
    server, sinks, port = await recorder_server(ssl_context=ctx)
    try:
        client_ctx = ssl.create_default_context(cafile=str(pki.ca))
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1"
        )
        client = RawClient(reader, writer, port)
        client.ws.send_request(client.ws.connect())
        client.flush()
        while not client.frames_or_open():
            await client.read_once()
        count = 4096  # 16 turns of frames of 2 bytes: 28 KiB, read at once
        for i in range(count):
            client.ws.send_binary(i.to_bytes(2, "big"))
        client.ws.send_close(CloseCode.NORMAL_CLOSURE)
        writer.write(b"".join(client.ws.data_to_send()))
        async with asyncio.timeout(5):
            await client.read_until_closed()
        await eventually(lambda: sinks and sinks[0].lost, "the server's side lost")
        got = [int.from_bytes(d, "big") for d in sinks[0].data]
        assert got == list(range(count)), f"{len(got)} of {count} frames handed over"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_flood_of_empty_frames_does_not_escape_the_input_rate() -> None:
    """A peer begins a fragmented message and then sends only empty continuation frames,
    as fast as we read: no payload, so it is under any rate and must be closed with 1008
    once the grace has passed. A read of them is thousands of frames, held for their turns
    almost all the time; frames held so must not count as input we held (the peer's bytes
    were all read and counted), else each check finds them held and starts the count
    again, and the peer is never closed."""
    grace = 0.2
    server, sinks, port = await recorder_server(min_rate=1000.0, rate_grace=grace)
    client = await RawClient.open(port)
    try:
        client.ws.send_binary(b"x", fin=False)
        client.writer.write(b"".join(client.ws.data_to_send()))
        for _ in range(8 * 1024):  # 6 bytes each (header and mask): 48 KiB a write
            client.ws.send_continuation(b"", fin=False)
        chunk = b"".join(client.ws.data_to_send())

        async def flood() -> None:
            while not client.writer.transport.is_closing():
                client.writer.write(chunk)
                await client.writer.drain()

        flooding = asyncio.ensure_future(flood())
        try:
            await eventually(
                lambda: sinks[0].transport.is_closing(), "the flood failed", grace + 1.0
            )
        finally:
            flooding.cancel()
            await asyncio.gather(flooding, return_exceptions=True)
        async with asyncio.timeout(5):  # its close frame, then its FIN
            await client.read_until_closed()
        closes = [Close.parse(f.data) for f in client.frames if f.opcode is Opcode.CLOSE]
        assert [c.code for c in closes] == [CloseCode.POLICY_VIOLATION]
    finally:
        client.writer.transport.abort()
        server.close()
        await server.wait_closed()
