"""Review 174 (of 53b4c97, 5b69d42, e86fa11, 0e76601): defects found, each test failing on
the code it names. Real sockets on 127.0.0.1, both loops; waits bounded, no fixed sleeps."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import rpc

pytestmark = pytest.mark.both_loops

DRAIN = 2.0


@pytest.mark.parametrize("then", ["streams", "requests"])
async def test_a_part_of_a_chatter_stream_turned_away_does_not_break_the_close(then: str) -> None:
    """5b69d42: a Chatter request turned away during the close is abandoned in the codec,
    which remembers the last ``max_abandoned`` (4,096) of the peer's, single requests too
    (whose token we hold: nothing of theirs can come late). A stream request's requester,
    told nothing, keeps the token and sends parts: after 4,096 more turned away (streams or
    plain requests) the first stream's part is a message in an unknown conversation, a
    violation: the connection is aborted and the request read before the close (its
    handler running) is cut unanswered. Before, the conversation stayed open (65,536
    allowed) and its parts were dropped."""
    from wire.chatter import Conversation
    from wire.chatter.connection import ChatterConnection
    from wire.chatter.envelope import Dialect

    go = asyncio.Event()
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        started.set()
        await go.wait()
        return value

    @reg.handle_stream("total")
    async def total(parts: Any) -> Any:
        return len([p async for p in parts])

    codec = ChatterConnection(Dialect.CURRENT)
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=reg, retry_results=False) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            codec.send("slow", b"1", last=False)
            writer.write(codec.data_to_send())
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            async with asyncio.timeout(2):
                while served.gave_up is None:  # the close began
                    await asyncio.sleep(0)
            streams = [codec.send("total", b"", token=False, last=False)]
            for _ in range(4096):
                if then == "streams":
                    codec.send("total", b"", token=False, last=False)
                else:
                    codec.send("slow", b"2", last=False)
            codec.send_ping()  # read last: a Ping counts as heard
            writer.write(codec.data_to_send())
            async with asyncio.timeout(2):  # (the codec checks a read before it runs)
                while served.violation is None and not served.adapter.codec.pings_received:
                    await asyncio.sleep(0.005)
            first = Conversation(True, streams[0].first)  # the first stream's part
            codec.send("PeerwireRpc.Part", b"x", conversation=first, token=False, last=False)
            codec.send_ping()
            writer.write(codec.data_to_send())
            async with asyncio.timeout(2):
                while served.violation is None and served.adapter.codec.pings_received < 2:
                    await asyncio.sleep(0.005)
            assert served.violation is None, served.violation  # (the slow request: cut)
            go.set()
            await asyncio.wait_for(closing, DRAIN + 3)
        finally:
            writer.close()
    del reader


async def test_a_close_from_a_handler_does_not_count_that_handler_as_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """0e76601's ``_tell_cut`` counts every job of the runner as a handler cut, the one
    that called ``close()`` too, which the drain itself does not wait for (``drain``
    leaves the closers out): one handler left running past the drain was told as two."""
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(_value: object) -> None:
        started.set()
        await asyncio.Event().wait()  # never ends by itself

    @reg.handle("shutdown")
    async def shutdown(_value: object) -> None:
        await rpc.current_peer.get().close(drain_timeout=0.2)

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            held = asyncio.ensure_future(client.request("hold", None, timeout=30))
            await asyncio.wait_for(started.wait(), 5)
            with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
                with pytest.raises(rpc.ConnectionClosed):
                    await asyncio.wait_for(client.request("shutdown", None, timeout=30), 5)
            with pytest.raises(rpc.ConnectionClosed):
                await asyncio.wait_for(held, 5)
    [cut] = [r.getMessage() for r in caplog.records if "drain are cut" in r.getMessage()]
    assert "1 handler(s) and 0 call(s) of ours still running after the 0.2-s drain" in cut
