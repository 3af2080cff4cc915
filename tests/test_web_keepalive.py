"""WebSocket keepalive counts silence from the peer's last read: the ping goes out
``ping_interval`` after it, not up to twice that (a timer tick that saw traffic used to
start a whole new interval from the tick)."""

from __future__ import annotations

import asyncio

import pytest
from websockets.frames import Opcode

from tests.test_web_hostile import RawClient, recorder_server

pytestmark = pytest.mark.both_loops

INTERVAL = 1.0


async def test_the_ping_comes_an_interval_after_the_last_data() -> None:
    server, _, port = await recorder_server(ping_interval=INTERVAL, ping_timeout=INTERVAL)
    client = await RawClient.open(port)
    try:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.05)  # the data lands early in the first interval
        client.ws.send_binary(b"x")
        client.flush()
        spoke = loop.time()
        while not any(f.opcode is Opcode.PING for f in client.frames):
            assert await client.read_once()
        waited = loop.time() - spoke
        # silence counted from the data: about INTERVAL; from the timer's tick that saw
        # it, it would be about 2 * INTERVAL - 0.05
        assert INTERVAL - 0.05 < waited < INTERVAL + 0.5, waited
    finally:
        client.writer.close()
        await client.writer.wait_closed()
        server.close()
        await server.wait_closed()
