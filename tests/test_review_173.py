"""Review 173 of the graceful close that turns away what a peer without retry results sends
during the drain (a333be4), and of 8696d14 / 6fcc4b3 / 8dd7f20. Real sockets on 127.0.0.1,
both loops; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import served, timing_registry, wait_until
from tests.test_close_turns_away import _gotalk_answers, _gotalk_request
from wire.metadata import timeout_ms

pytestmark = pytest.mark.both_loops

DRAIN = 2.0


@pytest.mark.parametrize("round_", range(3))
async def test_a_request_kept_in_the_tick_the_close_begins_in_is_answered(round_: int) -> None:
    """A request read before the close and kept (the one handler slot taken), when the
    close begins within the same clock reading (uvloop counts whole ms: the close's task
    starts in the loop iteration after the read): it was read before the close, so it runs
    and is answered, as docs/api.md and limits.md say. It was dropped unanswered on uvloop
    (``read_at >= _close_began``). Three rounds: one crossing a ms edge may pass."""
    closes: list[asyncio.Future[None]] = []
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(value: Any) -> Any:
        peer = rpc.current_peer.get()
        closes.append(asyncio.ensure_future(peer.close(drain_timeout=DRAIN)))
        async with asyncio.timeout(2):
            while peer.gave_up is None:  # the close began
                await asyncio.sleep(0)
        return value

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            # one read: "hold" takes the slot, "work" is kept behind it
            writer.write(_gotalk_request(1, b"hold", b"1") + _gotalk_request(2, b"work", b"2"))
            answers = await asyncio.wait_for(_gotalk_answers(reader), DRAIN + 3)
            await asyncio.wait_for(closes[0], DRAIN + 3)
        finally:
            writer.close()
    assert answers == {1: "R", 2: "R"}, answers


@pytest.mark.parametrize("kind", ["request", "notification"])
async def test_what_the_peer_sends_during_our_call_runs_even_when_kept_past_it(
    kind: str,
) -> None:
    """A handler read before the close calls the client back during it (the one handler
    slot is its own); the client's handler of that call sends a request (or notification)
    to the server, then answers. Sent while our call was in flight, it must run, as
    docs/api.md and limits.md say ("requests that come while calls of ours are in flight
    still run"). Kept behind the slot, it was dispatched once our call had ended, and
    ``turned_away`` (which asks whether a call is in flight *now*) dropped it unrun."""
    go = asyncio.Event()
    started = asyncio.Event()
    ran: list[Any] = []
    reg = rpc.Registry()

    @reg.handle("ask")
    async def ask(value: Any) -> Any:
        started.set()
        await go.wait()
        return await rpc.current_peer.get().request("answer", value, timeout=DRAIN)

    @reg.handle("work")
    def work(value: Any) -> Any:
        ran.append(value)
        return value

    @reg.handle_notification("note")
    def note(value: Any) -> None:
        ran.append(value)

    sent: list[asyncio.Future[Any]] = []
    client_reg = rpc.Registry()

    @client_reg.handle("answer")
    async def answer(value: Any) -> Any:
        peer = rpc.current_peer.get()
        if kind == "request":
            sent.append(asyncio.ensure_future(peer.request("work", "during", timeout=DRAIN)))
            await asyncio.sleep(0)  # the request goes out before our answer
        else:
            peer.notify("note", "during")
        return value * 2

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        async with rpc.connect(str(server.url), registry=client_reg, reconnect=False) as client:
            asked = asyncio.ensure_future(client.request("ask", 21, timeout=DRAIN + 2))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            async with asyncio.timeout(2):
                while served.gave_up is None:  # the close began
                    await asyncio.sleep(0)
            go.set()
            assert await asyncio.wait_for(asked, DRAIN + 3) == 42
            await asyncio.wait_for(closing, DRAIN + 3)
            if sent:
                await asyncio.wait(sent, timeout=DRAIN + 3)
    assert ran == ["during"], ran


async def test_parts_of_many_stream_requests_turned_away_do_not_break_the_close() -> None:
    """A busy Gotalk peer without retry results (gotalk.js) that opens more than
    ``ENDED_STREAMS`` (256) stream requests during the close, all turned away unanswered,
    and goes on sending their parts (it was told nothing): a part of the first is then a
    part of an unknown stream, a protocol violation, and the connection was aborted, the
    request read before the close (its handler still running) cut unanswered. Before
    a333be4 the peer was not read then; with retry results it is told to stop."""
    from wire.gotalk.encoding import encode
    from wire.gotalk.messages import Heartbeat, StreamRequest, StreamRequestPart

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
        return sum([p async for p in parts])

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(_gotalk_request(1, b"slow", b"1"))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            async with asyncio.timeout(2):
                while served.gave_up is None:  # the close began
                    await asyncio.sleep(0)
            ids = [(10 + i).to_bytes(4, "little") for i in range(300)]
            sent = [encode(StreamRequest(i, "total", b"1")) for i in ids]
            sent += [encode(StreamRequestPart(i, b"2")) for i in ids]
            sent += [encode(StreamRequestPart(i, b"")) for i in ids]  # their ends
            sent.append(encode(Heartbeat(0, 0)))  # (read last: the server counts it)
            writer.write(b"".join(sent))
            async with asyncio.timeout(2):
                while served.violation is None and not served.heartbeats_received:
                    await asyncio.sleep(0.005)
            assert served.violation is None, served.violation  # (the slow request: cut)
            go.set()
            answers = await asyncio.wait_for(_gotalk_answers(reader), DRAIN + 3)
            await asyncio.wait_for(closing, DRAIN + 3)
        finally:
            writer.close()
    assert answers == {1: "R"}, answers


async def test_a_chatter_flood_turned_away_does_not_abort_the_close() -> None:
    """A Chatter peer without retry results that opens more than the codec's 65,536
    conversations during the close: each request turned away leaves its conversation open
    (nothing answers it), so the one past the bound is a violation, the connection is
    aborted and the request read before the close, still running, is cut unanswered.
    Before a333be4 such a peer was not read during the close; outside a close, requests
    past its slots wait in the backlog (16,384 at most), reading paused, so its open
    conversations stay far below the bound. (A raw current-dialect client: a peerwire one
    refuses to open more than 65,536 itself; a Hat one does not.)"""
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

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    codec = ChatterConnection(Dialect.CURRENT, max_conversations=1 << 20)
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=reg, retry_results=False) as server:
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            codec.send("slow", b"1", last=False)
            writer.write(codec.data_to_send())
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            async with asyncio.timeout(2):
                while served.gave_up is None:  # the close began
                    await asyncio.sleep(0)
            for _ in range(65_537):
                codec.send("work", b"2", last=False)
            codec.send_ping()  # read last: a Ping counts as heard
            writer.write(codec.data_to_send())
            async with asyncio.timeout(5):
                while served.violation is None and not served.adapter.codec.pings_received:
                    await asyncio.sleep(0.005)
            assert served.violation is None, served.violation  # (the slow request: cut)
            go.set()
            await asyncio.wait_for(closing, DRAIN + 3)
        finally:
            writer.close()


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_call_with_minus_infinite_timeout_times_out_as_a_negative_one(
    flavour: str,
) -> None:
    """``timeout=-inf`` to a peer that takes the caller's timeout: none left, as for
    ``-1.0`` (RequestTimeout). 6fcc4b3 bounded ``inf`` in ``timeout_ms``; ``-inf`` still
    raised OverflowError converting to int, out of ``request``."""
    assert timeout_ms(float("-inf")) == 0
    async with served(flavour, timing_registry()) as (_, peer):
        await wait_until(lambda: peer.adapter.metadata)
        for timeout in (-1.0, float("-inf")):
            with pytest.raises(rpc.RequestTimeout):
                await peer.request("left", timeout=timeout)
