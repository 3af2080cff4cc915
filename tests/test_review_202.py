"""Review 202 of 7eca8ba (a socket read's frames handed to the sink a turn at a time, the rest
held): what the hold does to frames that came before a close, and to the input-rate check.
Real sockets, asyncio and uvloop."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from websockets.frames import Close, CloseCode, Opcode

from tests.browser import eventually
from tests.certs import Pki
from tests.test_web_hostile import RawClient, recorder_server
from transports.stream import server_ssl_context

pytestmark = pytest.mark.both_loops


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
