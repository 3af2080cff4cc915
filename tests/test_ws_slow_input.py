"""A WebSocket peer that begins a frame, or a fragmented message, and sends the rest a byte
now and then is closed with 1008 once it falls under ``min_receive_rate`` past
``receive_grace`` (transports.slow_input on the socket's bytes). Before, every byte reset the
keepalive's silence, so no ping ever went out, and such a peer held its connection and up to
``max_size`` bytes for good (both closing tests fail on 62035c3). A peer that keeps up, or
whose input we hold ourselves, is not closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from websockets.frames import Close, CloseCode, Opcode

import rpc
from tests.rpc_helpers import wait_until
from tests.test_web_hostile import RawClient, close_writer, recorder_server
from transports.web_http import HttpOptions
from wire import gotalk

pytestmark = pytest.mark.both_loops

STRICT = rpc.Options(min_receive_rate=1000.0, receive_grace=0.3)
"""Closed after 0.3 s under 1,000 bytes a second (the default grace is 10 s)."""


@contextlib.asynccontextmanager
async def ws_client(reg: rpc.Registry | None = None) -> AsyncIterator[RawClient]:
    """A raw WebSocket client, its Gotalk version sent, of a ws+gotalk server of ``reg``
    (default: ``echo``) with ``STRICT`` options. Aborted at the end: the server may have
    closed or reset it (a close could raise BrokenPipeError then)."""
    if reg is None:
        reg = rpc.Registry()
        reg.handle("echo")(lambda value: value)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=reg,
        options=STRICT,
        web=HttpOptions(allow_missing_origin=True),
    ) as server:
        client = await RawClient.open(server.url.port)
        try:
            client.ws.send_binary(b"01")  # the Gotalk version
            client.flush()
            yield client
        finally:
            client.writer.transport.abort()


async def closed_with(client: RawClient, drip: list[bytes]) -> int:
    """Send ``drip`` a piece every 0.05 s, reading meanwhile (pongs answer the server's
    pings), until the server closes; the close code it sent."""

    async def dripping() -> None:
        for piece in drip:
            if client.writer.transport.is_closing():
                return
            client.writer.write(piece)
            await asyncio.sleep(0.05)  # the attacker's pace, not a wait for anything

    task = asyncio.ensure_future(dripping())
    try:
        async with asyncio.timeout(5):
            await client.read_until_closed()
    finally:
        task.cancel()
    closes = [Close.parse(f.data) for f in client.frames if f.opcode is Opcode.CLOSE]
    assert closes, "closed without a close frame"
    return closes[0].code


async def test_a_peer_trickling_one_frame_is_closed() -> None:
    """A byte every 0.05 s of one frame: 20 bytes a second."""
    async with ws_client() as client:
        client.ws.send_binary(b"x" * 1000)
        frame = b"".join(client.ws.data_to_send())
        drip = [frame[i : i + 1] for i in range(len(frame))]
        assert await closed_with(client, drip) == CloseCode.POLICY_VIOLATION


async def test_a_peer_trickling_a_fragmented_message_is_closed() -> None:
    """A Gotalk request whose payload comes a byte a fragment, a fragment every 0.05 s
    (about 140 bytes a second). Each fragment is a whole frame, so the peer could answer
    pings between them; the message stays unfinished."""
    async with ws_client() as client:
        header = gotalk.request_header(gotalk.MessageType.REQUEST, b"0001", "echo", 1000)
        client.ws.send_binary(header + b'"', fin=False)
        for _ in range(100):
            client.ws.send_continuation(b"y", fin=False)
        frames = client.ws.data_to_send()
        assert await closed_with(client, frames) == CloseCode.POLICY_VIOLATION


async def test_a_fragmented_message_that_keeps_up_is_taken() -> None:
    """A Gotalk request whose payload comes in 20 fragments of 3 kB, one every 0.05 s
    (about 60 kB a second, over about a second: past the 0.3-s grace)."""
    async with ws_client() as client:
        payload = b'"' + b"y" * 59_998 + b'"'
        header = gotalk.request_header(gotalk.MessageType.REQUEST, b"0001", "echo", len(payload))
        client.ws.send_binary(header)
        client.flush()
        parts = [payload[i : i + 3000] for i in range(0, len(payload), 3000)]
        client.ws.send_binary(parts[0], fin=False)
        for i, part in enumerate(parts[1:], 2):
            client.ws.send_continuation(part, fin=i == len(parts))
        for frame in client.ws.data_to_send():
            client.writer.write(frame)
            await asyncio.sleep(0.05)  # the pace of a slow link, not a wait for anything
        assert await client.gotalk_results() == [gotalk.Result(b"0001", payload)]


async def test_a_frame_begun_while_we_hold_the_input_is_not_blamed_on_the_peer() -> None:
    """100 bytes of a frame are read (the check began), then the sink pauses reading for
    1 s, past the 0.3-s grace: counted, that is 100 bytes in 0.3 s, under the least rate.
    The rest, sent when reading resumes, is taken and the connection stays open."""
    server, sinks, port = await recorder_server(min_rate=1000.0, rate_grace=0.3)
    client = await RawClient.open(port)
    try:
        (conn,) = server.connections
        client.ws.send_binary(b"z" * 1000)
        frame = b"".join(client.ws.data_to_send())
        client.writer.write(frame[:100])
        # the server read them: its count began (no event says so)
        rate = conn.input_rate
        await wait_until(lambda: rate is not None and rate.check.begun is not None)
        sink = sinks[0]
        sink.transport.pause_reading()
        await asyncio.sleep(1.0)  # the hold being tested: we do not read for 1 s
        sink.transport.resume_reading()
        client.writer.write(frame[100:])
        await wait_until(lambda: b"".join(sink.data) == b"z" * 1000)
        assert not sink.lost
        assert not any(f.opcode is Opcode.CLOSE for f in client.frames)
    finally:
        await close_writer(client.writer)
        server.close()
        await server.wait_closed()
