"""Review of 1dfa56d (transports.slow_input over WebSocket): peers that trickle input yet
escape the least-rate check.

1. An RPC message split over many whole, unfragmented WebSocket messages: the RPC codec
   takes the frames' payloads as one byte stream, so a Gotalk request's header may come in
   one message and its payload a byte a message. The connection's check sees every read end
   a whole message (nothing unfinished), and rpc.message_stall turns its own check off over
   WebSocket, so the request stays unfinished for good.
2. A fragmented message that never grows: the connection counts every byte of the socket,
   so control frames (pings, answered by pongs) or empty continuation frames sent between
   the fragments keep the rate up while the message gets no byte.

Both expect the server to close the peer within 2 s (grace 0.3 s); both fail on 1dfa56d
(found in review by helper-103). The connection now counts only data frames' payloads, and
also while the sink says a message of its own is unfinished (transports.ws_input_rate).
"""

from __future__ import annotations

import asyncio

import pytest
from websockets.frames import Close, CloseCode, Opcode

from tests.test_web_hostile import RawClient, recorder_server
from tests.test_ws_slow_input import ws_client
from wire import gotalk

pytestmark = pytest.mark.both_loops

RATE, GRACE = 1000.0, 0.3
"""The least rate (bytes a second) and its grace: a peer under it is closed after 0.3 s."""


async def closed_while_dripping(client: RawClient, drip: list[bytes], bound: float) -> bool:
    """Write ``drip`` a piece every 0.05 s, reading meanwhile (pongs answer the server's
    pings); whether the server closed the connection within ``bound`` seconds."""

    async def dripping() -> None:
        for piece in drip:
            if client.writer.transport.is_closing():
                return
            try:
                client.writer.write(piece)
            except (ConnectionError, RuntimeError):  # closed under us (uvloop raises)
                return
            await asyncio.sleep(0.05)  # the attacker's pace, not a wait for anything

    task = asyncio.ensure_future(dripping())
    try:
        async with asyncio.timeout(bound):
            await client.read_until_closed()
        return True
    except ConnectionError:  # reset by the server, or a write into its reset
        return True
    except TimeoutError:
        return False
    finally:
        task.cancel()


async def test_an_rpc_message_trickled_a_byte_per_websocket_message_is_closed() -> None:
    """A Gotalk request's header in one WebSocket message, then its 1,000-byte payload a
    byte a message, a message every 0.05 s (140 bytes a second on the socket, 20 of
    payload): the request stays unfinished, under the least rate, and must be closed."""
    async with ws_client() as client:
        header = gotalk.request_header(gotalk.MessageType.REQUEST, b"0001", "echo", 1000)
        client.ws.send_binary(header)
        client.flush()
        for _ in range(100):  # each a whole, unfragmented message of one byte
            client.ws.send_binary(b"y")
        drip = client.ws.data_to_send()
        assert await closed_while_dripping(client, drip, 2.0), (
            "a request trickled a byte per WebSocket message held its connection"
        )


def _ping(i: int) -> bytes:
    return i.to_bytes(2, "big") * 62  # 124 bytes: a ping frame of 130 bytes from a client


@pytest.mark.parametrize("filler", ["pings", "empty fragments"])
async def test_a_fragmented_message_that_never_grows_is_closed(filler: str) -> None:
    """The first fragment of a message, then only ``filler`` every 0.05 s: pings of 124
    bytes (about 2,600 bytes a second) or ten empty continuation frames (about 1,200 bytes
    a second), for 2 s. The message gets no byte past its first, yet the socket's bytes
    keep over the least rate of 1,000 bytes a second, so the peer is never closed."""
    server, _sinks, port = await recorder_server(min_rate=RATE, rate_grace=GRACE)
    client = await RawClient.open(port)
    try:
        client.ws.send_binary(b"a", fin=False)
        client.flush()
        drip = []
        for i in range(60):
            if filler == "pings":
                client.ws.send_ping(_ping(i))
            else:
                for _ in range(10):
                    client.ws.send_continuation(b"", fin=False)
            drip.append(b"".join(client.ws.data_to_send()))
        assert await closed_while_dripping(client, drip, 2.0), (
            f"a fragmented message kept unfinished by {filler} held its connection"
        )
        closes = [Close.parse(f.data) for f in client.frames if f.opcode is Opcode.CLOSE]
        assert [c.code for c in closes] == [CloseCode.POLICY_VIOLATION]
    finally:
        client.writer.transport.abort()  # the server may have closed it already
        server.close()
        await server.wait_closed()
