"""Review of 1dfa56d and d7d59a1 (transports.ws_input_rate) by helper-105: the least rate of
a WebSocket peer's unfinished input, as it stood at 0f7e81a (both tests failed there). The
connection now asks the sink again when it hands over held frames, and counts payloads,
not a header size guessed from them.

1. A count left running on frames the sink never saw: when the sink pauses reading in the
   middle of a read, the frames after it are held by the connection, but the check asks the
   sink ``input_unfinished`` at once, before it has them. A read whose held frames finish
   the RPC message the sink holds part of begins (or keeps) a count that nothing ends: the
   frames are released later without a word to the check, and a peer that then waits for
   its replies, sending nothing (it owes nothing), is closed with 1008 after twice the grace.
2. Header arithmetic from the payload size alone: a frame's length may be sent in more
   bytes than it needs (websockets takes a 64-bit length for an empty frame), so each such
   frame of a fragmented message that never grows counts 8 bytes of progress.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from websockets.frames import Close, CloseCode, Opcode

import rpc
from tests.test_web_hostile import RawClient, recorder_server
from tests.test_ws_slow_input import ws_client
from tests.test_ws_slow_input_review import closed_while_dripping
from wire import gotalk

pytestmark = pytest.mark.both_loops

RATE, GRACE = 1000.0, 0.3
"""The least rate (bytes a second) and its grace: a peer under it is closed after 0.3 s."""


def _request(rid: bytes, payload: bytes) -> bytes:
    return gotalk.request_header(gotalk.MessageType.REQUEST, rid, "work", len(payload)) + payload


async def _closed_within(client: RawClient, bound: float) -> bool:
    """Whether the server closes the connection within ``bound`` seconds (the client reads
    meanwhile and answers pings; it sends nothing else)."""
    try:
        async with asyncio.timeout(bound):
            await client.read_until_closed()
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def test_a_peer_waiting_for_its_replies_after_held_frames_is_not_closed() -> None:
    """One TCP write of two WebSocket messages: the first holds 300 requests and the header
    of one more; the second, that request's payload. The server handles 256 messages a
    turn, so it pauses reading in the first message (the last header buffered: the sink
    says its input is unfinished), and the second is held. The read's check begins on the
    sink's word; the last request is whole once the held message is released, the peer gets
    its 301 results and sends nothing more, yet it is closed after 2 x 0.3 s + 0.05 s. (A
    peer whose messages do not follow the RPC messages: the codec takes them as a stream.)"""
    reg = rpc.Registry()
    reg.handle("work")(lambda value: value)
    async with ws_client(reg) as client:
        many = b"".join(_request(b"%04d" % i, b'"a"') for i in range(300))
        last = _request(b"9999", b'"z"')
        client.ws.send_binary(many + last[:-3])
        client.ws.send_binary(last[-3:])
        client.writer.write(b"".join(client.ws.data_to_send()))  # one write, one read
        results = await client.gotalk_results(301)
        assert len({r.id for r in results}) == 301
        assert not await _closed_within(client, 1.5), (
            "a peer that owes nothing was closed as too slow"
        )


def _empty_continuation_long_length() -> bytes:
    """An empty, masked continuation frame (not the last) whose length is sent in the 8-byte
    form: 14 bytes, where the shortest form takes 6 (RFC 6455 asks for the shortest;
    websockets takes either)."""
    return bytes([0x00, 0x80 | 127]) + (0).to_bytes(8, "big") + os.urandom(4)


async def test_a_fragmented_message_that_never_grows_in_long_length_frames_is_closed() -> None:
    """The first fragment of a message, then ten empty continuation frames every 0.05 s,
    each with its length in 8 bytes (2,800 bytes a second on the socket): the message gets
    no byte past its first, but each frame counts 14 - 6 = 8 bytes of progress (1,600 a
    second, over the least rate of 1,000), so the peer is never closed."""
    server, _sinks, port = await recorder_server(min_rate=RATE, rate_grace=GRACE)
    client = await RawClient.open(port)
    try:
        client.ws.send_binary(b"a", fin=False)
        client.flush()
        drip = [b"".join(_empty_continuation_long_length() for _ in range(10)) for _ in range(60)]
        assert await closed_while_dripping(client, drip, 2.0), (
            "a fragmented message kept unfinished by long-length empty frames held its connection"
        )
        closes = [Close.parse(f.data) for f in client.frames if f.opcode is Opcode.CLOSE]
        assert [c.code for c in closes] == [CloseCode.POLICY_VIOLATION]
    finally:
        client.writer.transport.abort()  # the server may have closed it already
        server.close()
        await server.wait_closed()
