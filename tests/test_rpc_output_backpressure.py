"""While our output waits, replies to our calls are still read (rpc.peer, rpc.outbox).

A peer whose output backs up holds the input that would add to it (requests, notifications,
pings), but not replies to its own calls: held too, two peerwire peers sending each other
more than the socket buffers take each waited for the other to read, until every call timed
out. Senders waiting for the output to drain are woken one at a time, in order. (That
requests are still held while the output waits: tests/test_hostile_core.py, a peer that
never reads.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

import rpc
from rpc.errors import ConnectionClosed
from rpc.outbox import Outbox
from tests.browser import eventually
from tests.rpc_helpers import TCP_URLS, echo_registry
from tests.test_web_hostile import RawClient, recorder_server, unread

pytestmark = [pytest.mark.both_loops, pytest.mark.timeout(60)]


@pytest.mark.parametrize("protocol", sorted(TCP_URLS))
async def test_pipelined_requests_larger_than_the_buffers_all_complete(protocol: str) -> None:
    """300 requests of 100 kB at once, echoed: 30 MB each way, far past what the socket
    buffers and the high-water marks hold. Before, the client stopped reading the results
    once its own output backed up, the server's output then backed up and it stopped
    reading the requests: nearly every call ended at its timeout."""
    options = rpc.Options(timeout=5)
    async with rpc.serve(TCP_URLS[protocol], registry=echo_registry(), options=options) as server:
        async with rpc.connect(str(server.url), registry=rpc.Registry(), options=options) as peer:
            values = [f"{i:06d}" + "x" * 100_000 for i in range(300)]
            results = await asyncio.gather(*(peer.request("echo", v) for v in values))
            assert results == values


class Sink:
    """A stand-in transport: keeps nothing; the test drives pause and resume itself."""

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, list_of_data: Iterable[bytes]) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


async def test_waiting_senders_are_woken_one_at_a_time_in_order() -> None:
    """Each resume wakes the longest-waiting sender, and the next once that one has run,
    while the transport takes more; one that blocks it again stops the wakes there. Before,
    every waiter woke at every resume (thousands of senders each found the buffer full
    again and waited again: a resume cost grew with the senders waiting)."""
    outbox = Outbox(asyncio.get_running_loop())
    outbox.attach(Sink(), high_water=1024, low_water=256)
    outbox.pause()
    order: list[int] = []

    async def sender(i: int) -> None:
        await outbox.wait_writable()
        order.append(i)
        if i == 2:
            outbox.pause()  # its write backed the transport up again

    tasks = [asyncio.create_task(sender(i)) for i in range(6)]
    cancelled = tasks[1]
    await eventually(lambda: len(outbox._waiters) == 6, "six senders waiting")
    cancelled.cancel()
    outbox.resume()
    await eventually(lambda: order == [0, 2], "the first senders, in order")
    for _ in range(5):  # turns of the loop: no one else wakes while it is blocked
        await asyncio.sleep(0)
    assert order == [0, 2]
    outbox.resume()
    await asyncio.gather(*tasks[2:])
    assert order == [0, 2, 3, 4, 5] and cancelled.cancelled()


async def test_senders_that_give_up_leave_no_waiters_behind() -> None:
    """Waits cancelled (a call's timeout) while the output stays blocked do not pile up:
    before, each left its waiter queued until the next resume (10,000 here)."""
    outbox = Outbox(asyncio.get_running_loop())
    outbox.attach(Sink(), high_water=1024, low_water=256)
    outbox.pause()
    for _ in range(10):
        tasks = [asyncio.create_task(outbox.wait_writable()) for _ in range(1000)]
        await asyncio.sleep(0)  # each task starts its wait
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert len(outbox._waiters) < 1000
    still = asyncio.create_task(outbox.wait_writable())  # one that keeps waiting is woken
    await asyncio.sleep(0)
    outbox.resume()
    await asyncio.wait_for(still, 5)


async def test_losing_the_connection_fails_every_waiting_sender() -> None:
    outbox = Outbox(asyncio.get_running_loop())
    outbox.attach(Sink(), high_water=1024, low_water=256)
    outbox.pause()
    tasks = [asyncio.create_task(outbox.wait_writable()) for _ in range(3)]
    await eventually(lambda: len(outbox._waiters) == 3, "three senders waiting")
    outbox.lost(ConnectionClosed("gone"))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionClosed] * 3


async def test_a_websocket_peer_that_pings_and_never_reads_stops_being_read() -> None:
    """The socket is read while our output waits (for replies), but a ping then stops the
    reading until the output drains: each ping's pong would otherwise grow our buffer."""
    server, sinks, port = await recorder_server(high_water=64 * 1024)
    try:
        client = await RawClient.open(port)  # reads only when told
        await eventually(lambda: sinks and sinks[0].transport is not None, "connected")
        sink = sinks[0]
        while not sink.paused:  # our output backs up: the client does not read
            sink.transport.write(b"z" * 65536)
            await asyncio.sleep(0)
        buffered = sink.transport.get_write_buffer_size()
        pings = 20_000  # 20,000 pongs of 100 bytes: 2 MB if every ping were answered
        for i in range(pings):
            client.ws.send_ping(b"%05d" % i + b"p" * 95)
        client.flush()
        raw = sink.transport._raw  # the socket's transport under the WebSocket
        bound = buffered + 300_000  # what it had, plus pongs for about one read of pings
        await eventually(
            lambda: not raw.is_reading() or raw.get_write_buffer_size() > bound,
            "reading stopped, or the pongs piling up",
        )
        assert not raw.is_reading() and raw.get_write_buffer_size() < bound
        await eventually(lambda: unread(raw.get_extra_info("socket")) > 16384, "pings unread")
        while not any(f.opcode.name == "PONG" and f.data[:5] == b"19999" for f in client.frames):
            assert await client.read_once()  # the client reads: every ping gets its pong
        assert sum(f.opcode.name == "PONG" for f in client.frames) == pings
        client.writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_chatter_peer_that_pings_and_never_reads_stops_being_read() -> None:
    """The Chatter codec answers each Ping with a Pong as it decodes: while our output
    waits, a read with Pings stops reading until the output drains. Before (since replies
    are read while output waits), every Ping added its Pong to our buffer: 20,000 Pings
    added 1.8 MB, with no limit."""
    registry = rpc.Registry()

    @registry.handle("big")
    def big(size: int) -> str:
        return "x" * size

    url = "tcp+sbs://127.0.0.1:0?dialect=HatChatter"
    options = rpc.Options(timeout=60)
    async with rpc.serve(url, registry=registry, options=options) as server:
        peer = await rpc.connect(str(server.url), reconnect=False, options=options)
        try:
            assert await peer.request("big", 1) == "x"
            [served] = server.peers
            peer.transport.pause_reading()  # the client never reads again
            call = asyncio.ensure_future(peer.request("big", 8_000_000))
            await eventually(lambda: served.outbox.blocked, "the server's output backed up")
            before = served.write_buffer_size
            for _ in range(20_000):
                peer.adapter.codec.send_ping(b"p" * 64)
            peer.adapter._take_codec_output()
            peer.outbox.flush()
            await eventually(lambda: not served.reading, "the server stopped reading")
            assert served.write_buffer_size < before + 300_000  # one read's Pongs at most
            call.cancel()
        finally:
            peer.abort()
