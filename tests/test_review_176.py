"""Review 176 of ac76941 (what a graceful close turns away runs at once) and f12f32f
(Chatter: a turned-away request is forgotten by the codec only while we hold its token).
Real sockets on 127.0.0.1, both loops; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import wait_until
from wire.gotalk.encoding import encode
from wire.gotalk.messages import Notification, Request, StreamRequest, StreamRequestPart

pytestmark = pytest.mark.both_loops

DRAIN = 4.0
"""The close's drain bound: a defect below holds the close to it."""


def _rid(i: int) -> bytes:
    return i.to_bytes(4, "big")


async def _gotalk_answers(reader: asyncio.StreamReader) -> dict[bytes, tuple[str, bytes]]:
    """What a raw Gotalk v1 client reads up to EOF: each answer's kind and payload, by id."""
    buf = b""
    while data := await reader.read(1 << 20):
        buf += data
    answers: dict[bytes, tuple[str, bytes]] = {}
    while buf:
        if buf[:1] == b"h":  # a heartbeat
            buf = buf[13:]
            continue
        kind, rid = buf[:1], buf[1:5]
        assert kind in (b"R", b"S", b"E", b"e"), buf[:40]
        head = 13 if kind != b"e" else 21
        size = int(buf[head - 8 : head], 16)
        if kind == b"S":  # a stream result's chunks, an empty one its end
            if size:
                answers[rid] = ("S", answers.get(rid, ("S", b""))[1] + buf[head : head + size])
        else:
            answers[rid] = (kind.decode(), buf[head : head + size])
        buf = buf[head + size :]
    return answers


@pytest.mark.parametrize("flood", ["requests", "notifications", "stream requests"])
async def test_a_flood_during_the_close_does_not_stop_the_reading_of_a_running_stream(
    flood: str,
) -> None:
    """``max_concurrent=1``, a peer without retry results: a stream request's handler holds
    the slot, waiting for its parts; a request read before the close is kept behind it.
    During the close the peer floods (more than a turn's worth in one read: the rest of
    the read is kept for the next turn; more than a read's 256 KiB), then sends the stream's
    last part and end. The
    turn asks ``_runs_now`` of the kept request with the flood's read time
    (``Backlog.read_at`` is the last read's, not the message's): it "runs now", finds no
    slot (NoTaskSlot) and becomes ``Backlog.refused``, which pauses reading until it runs:
    the stream's parts are never read, and the close runs to ``drain_timeout``, the stream
    handler cut."""
    reg = rpc.Registry()

    @reg.handle_stream("total")
    async def total(values: Any) -> int:
        return sum([value async for value in values])

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    @reg.handle_notification("note")
    def note(value: Any) -> None:
        pass

    loop = asyncio.get_running_loop()
    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False, options=options
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(encode(StreamRequest(_rid(1), "total", b"1")))
            await wait_until(lambda: any(p.handlers_running for p in server.peers), 5)
            [served] = server.peers
            writer.write(encode(Request(_rid(2), "work", b"2")))
            await wait_until(lambda: len(served._backlog) == 1, 5)  # kept: the slot is taken
            began = loop.time()
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            if flood == "requests":
                many = [encode(Request(_rid(i), "work", b"0")) for i in range(10, 20_010)]
            elif flood == "notifications":
                many = [encode(Notification("note", b"0")) for _ in range(20_000)]
            else:  # each with a part and its end
                many = [
                    encode(StreamRequest(_rid(i), "total", b"0"))
                    + encode(StreamRequestPart(_rid(i), b"0"))
                    + encode(StreamRequestPart(_rid(i), b""))
                    for i in range(10, 12_010)
                ]
            writer.write(b"".join(many))
            writer.write(
                encode(StreamRequestPart(_rid(1), b"2")) + encode(StreamRequestPart(_rid(1), b""))
            )
            answers = await asyncio.wait_for(_gotalk_answers(reader), DRAIN + 3)
            await asyncio.wait_for(closing, DRAIN + 3)
            took = loop.time() - began
        finally:
            writer.close()
    assert answers == {_rid(1): ("S", b"3"), _rid(2): ("R", b"2")}, answers
    assert took < DRAIN / 2, f"the close took {took:.3f} s"


async def test_followers_of_stream_requests_turned_away_from_the_backlog_are_not_kept() -> None:
    """As above (a stream handler holds the one slot, a request read before the close kept
    behind it), with ``max_request_bytes`` 256 KiB: the close's flood is of stream requests,
    each with a part and its end. Those kept past a turn's 256 have their part and end set
    aside behind them (``Backlog._parked``); ``run_replies`` runs (drops) such a request
    without its followers, which stay set aside for good, counted in the backlog's bound
    (here its quarter of ``max_request_bytes``): it fills, reading pauses for good, and the
    stream's parts are never read, the close running to ``drain_timeout``."""
    reg = rpc.Registry()

    @reg.handle_stream("total")
    async def total(values: Any) -> int:
        return sum([value async for value in values])

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    loop = asyncio.get_running_loop()
    options = rpc.Options(max_concurrent=1, max_request_bytes=256 << 10)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False, options=options
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(encode(StreamRequest(_rid(1), "total", b"1")))
            await wait_until(lambda: any(p.handlers_running for p in server.peers), 5)
            [served] = server.peers
            writer.write(encode(Request(_rid(2), "work", b"2")))
            await wait_until(lambda: len(served._backlog) == 1, 5)  # kept: the slot is taken
            began = loop.time()
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            writer.write(
                b"".join(
                    encode(StreamRequest(_rid(i), "total", b"0"))
                    + encode(StreamRequestPart(_rid(i), b"0"))
                    + encode(StreamRequestPart(_rid(i), b""))
                    for i in range(10, 3_010)
                )
            )
            writer.write(
                encode(StreamRequestPart(_rid(1), b"2")) + encode(StreamRequestPart(_rid(1), b""))
            )
            answers = await asyncio.wait_for(_gotalk_answers(reader), DRAIN + 3)
            await asyncio.wait_for(closing, DRAIN + 3)
            took = loop.time() - began
        finally:
            writer.close()
    assert answers == {_rid(1): ("S", b"3"), _rid(2): ("R", b"2")}, answers
    assert took < DRAIN / 2, f"the close took {took:.3f} s"


@pytest.mark.parametrize("end", ["End", "token"])
async def test_chatter_streams_turned_away_and_ended_leave_no_conversation_open(end: str) -> None:
    """f12f32f keeps a turned-away Chatter stream request open in the codec while its
    requester holds the token (its parts come). Once the requester ends its parts and
    hands the token over (``PeerwireRpc.End``, or a bare token in the strict dialect),
    nothing answers the request, so the codec holds it open for good, counted toward its
    65,536 conversations: a peer sending that many such streams during one close is a
    violation (the connection aborted, the request read before the close cut). Before
    f12f32f they were abandoned, remembered at most 4,096 at a time. Here: 100 such
    streams, and the codec's open conversations must come back to the one read before
    the close."""
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
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            codec.send("slow", b"1", last=False)
            writer.write(codec.data_to_send())
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            streams = []
            for _ in range(100):
                conv = Conversation(True, codec.send("total", b"", token=False, last=False).first)
                codec.send("PeerwireRpc.Part", b"x", conversation=conv, token=False, last=False)
                streams.append(conv)
            codec.send_ping()  # read last: a Ping counts as heard
            writer.write(codec.data_to_send())
            await wait_until(lambda: served.adapter.codec.pings_received, 2)
            for conv in streams:  # in a later read than their requests
                if end == "End":
                    codec.send("PeerwireRpc.End", b"", conversation=conv, token=True, last=False)
                else:
                    codec.send("PeerwireRpc.Part", b"y", conversation=conv, token=True, last=False)
            codec.send_ping()
            writer.write(codec.data_to_send())
            await wait_until(lambda: served.adapter.codec.pings_received == 2, 2)
            assert served.violation is None, served.violation
            assert served.adapter.codec.open_conversations == 1  # "slow" alone
            go.set()
            await asyncio.wait_for(closing, DRAIN + 3)
        finally:
            writer.close()


async def test_parts_of_many_stream_requests_turned_away_do_not_fill_the_backlog() -> None:
    """As above (a stream handler holds the one slot, a request read before the close kept
    behind it, ``max_request_bytes`` 256 KiB): during the close the peer opens 400 stream
    requests (turned away at once), then sends their parts in later reads. The parts of
    those the responder no longer remembers (past its last 256 ended streams) do not run
    now (not ``takes_parts``) and are kept behind the slot: the backlog fills (its quarter
    of ``max_request_bytes``), reading pauses, the running stream's parts are never read
    and the close runs to ``drain_timeout``."""
    reg = rpc.Registry()

    @reg.handle_stream("total")
    async def total(values: Any) -> int:
        return sum([value async for value in values])

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    loop = asyncio.get_running_loop()
    options = rpc.Options(max_concurrent=1, max_request_bytes=256 << 10)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False, options=options
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(encode(StreamRequest(_rid(1), "total", b"1")))
            await wait_until(lambda: any(p.handlers_running for p in server.peers), 5)
            [served] = server.peers
            writer.write(encode(Request(_rid(2), "work", b"2")))
            await wait_until(lambda: len(served._backlog) == 1, 5)  # kept: the slot is taken
            began = loop.time()
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            ids = range(10, 410)
            writer.write(b"".join(encode(StreamRequest(_rid(i), "total", b"0")) for i in ids))
            await wait_until(lambda: len(served._ended) >= 256, 2)  # read and turned away
            part = b"0" * 100
            for _ in range(30):
                writer.write(b"".join(encode(StreamRequestPart(_rid(i), part)) for i in ids))
            writer.write(
                encode(StreamRequestPart(_rid(1), b"2")) + encode(StreamRequestPart(_rid(1), b""))
            )
            answers = await asyncio.wait_for(_gotalk_answers(reader), DRAIN + 3)
            await asyncio.wait_for(closing, DRAIN + 3)
            took = loop.time() - began
        finally:
            writer.close()
    assert answers == {_rid(1): ("S", b"3"), _rid(2): ("R", b"2")}, answers
    assert took < DRAIN / 2, f"the close took {took:.3f} s"
