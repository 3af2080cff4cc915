"""WebSocket keepalive counts silence from the peer's last read: the ping goes out
``ping_interval`` after it, not up to twice that (a timer tick that saw traffic used to
start a whole new interval from the tick)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from websockets.frames import Opcode

from tests.browser import eventually
from tests.test_web_hostile import RawClient, recorder_server

pytestmark = pytest.mark.both_loops

INTERVAL = 1.0


async def test_the_ping_comes_an_interval_after_the_last_data() -> None:
    server, _, port = await recorder_server(ping_interval=INTERVAL, ping_timeout=INTERVAL)
    client = await RawClient.open(port)
    try:
        loop = asyncio.get_running_loop()
        client.ws.send_binary(b"x")  # early in the first interval: right after the upgrade
        client.flush()
        spoke = loop.time()
        while not any(f.opcode is Opcode.PING for f in client.frames):
            assert await client.read_once()
        waited = loop.time() - spoke
        # silence counted from the data: about INTERVAL; from the timer's tick that saw
        # it, it would be about 2 * INTERVAL
        assert INTERVAL - 0.05 < waited < INTERVAL + 0.5, waited
    finally:
        client.writer.close()
        await client.writer.wait_closed()
        server.close()
        await server.wait_closed()


async def test_a_peer_whose_input_we_hold_is_not_failed_for_an_unread_pong() -> None:
    """The sink paused our reading (its handlers are busy): the peer's pong waits unread,
    which is not silence. Once reading resumes the pong is read and keepalive goes on."""
    server, sinks, port = await recorder_server(ping_interval=0.2, ping_timeout=0.2)
    client = await RawClient.open(port)
    try:
        await eventually(lambda: sinks and sinks[0].transport is not None, "connected")
        sink = sinks[0]
        sink.transport.pause_reading()
        loop = asyncio.get_running_loop()
        held_until = loop.time() + 1.0  # five times the ping timeout
        while (left := held_until - loop.time()) > 0:  # answering pings meanwhile
            with contextlib.suppress(TimeoutError):
                assert await asyncio.wait_for(client.read_once(), left)
        assert not sink.lost
        sink.transport.resume_reading()
        pings = sum(f.opcode is Opcode.PING for f in client.frames)
        while sum(f.opcode is Opcode.PING for f in client.frames) < pings + 2:
            assert await client.read_once()  # keepalive goes on, answered
        assert not sink.lost
    finally:
        client.writer.close()
        await client.writer.wait_closed()
        server.close()
        await server.wait_closed()
