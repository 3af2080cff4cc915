"""Found by a soak of hostile peers at scale (hundreds of idle, flooding, trickling and
vanished connections against one server): each test is the least that shows one defect.
"""

from __future__ import annotations

import asyncio
import struct

import pytest
from websockets.frames import Opcode

from tests.browser import eventually
from tests.test_web_hostile import RawClient, recorder_server

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
