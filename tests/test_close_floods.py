"""A graceful close under a flood from a peer without retry results: what it sends once the
close began is turned away (dropped unanswered), and however much of it comes, the close
still reads what it waits for (the parts of a running stream request), answers what was
read before it, keeps its memory within the backlog's and the codec's bounds, and ends
promptly, not at ``drain_timeout`` and not by a violation that cuts it. Each test is of a
defect found by reviews 173, 174 and 176 of the close (822903f and its fixes); each
docstring says what failed. Two scenes on real sockets on 127.0.0.1, both loops: a raw
Gotalk client whose stream request holds the server's one handler slot, and a raw Chatter
client whose slow request is in flight. The waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import wait_until
from wire.chatter import Conversation
from wire.chatter.connection import ChatterConnection
from wire.chatter.envelope import Dialect
from wire.gotalk.encoding import encode
from wire.gotalk.messages import Notification, Request, StreamRequest, StreamRequestPart

pytestmark = pytest.mark.both_loops

DRAIN = 4.0
"""The close's drain bound: a defect below holds the close to it."""


def _rid(i: int) -> bytes:
    return i.to_bytes(4, "big")


def _registry() -> rpc.Registry:
    """``total`` (a stream handler: the sum of its parts), ``work`` (an echo), ``note``."""
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

    return reg


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


@dataclass
class GotalkScene:
    served: rpc.Peer
    writer: asyncio.StreamWriter


@asynccontextmanager
async def _stream_holds_the_slot(options: rpc.Options) -> AsyncIterator[GotalkScene]:
    """A raw Gotalk client of a ``retry_results=False`` server (``max_concurrent=1``): its
    stream request 1 (``total``, part 1) holds the slot, waiting for its parts, its
    request 2 (``work``) is kept behind it, and the close has begun. The body floods; then
    stream 1 gets its last part (2) and its end, and the scene checks that both requests
    read before the close are answered, within half the drain's bound."""
    loop = asyncio.get_running_loop()
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=_registry(), retry_results=False, options=options
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
            yield GotalkScene(served, writer)
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


def _stream_requests(ids: range) -> bytes:
    """Stream requests of ``total``, each with a part and its end."""
    return b"".join(
        encode(StreamRequest(_rid(i), "total", b"0"))
        + encode(StreamRequestPart(_rid(i), b"0"))
        + encode(StreamRequestPart(_rid(i), b""))
        for i in ids
    )


@pytest.mark.parametrize("flood", ["requests", "notifications", "stream requests"])
async def test_a_flood_during_the_close_does_not_stop_the_reading_of_a_running_stream(
    flood: str,
) -> None:
    """During the close the peer floods in one read (more than a turn's worth: the rest is
    kept for the next turn; more than a read's 256 KiB). The turn asked ``_runs_now`` of
    the kept request 2 with the flood's read time (``Backlog.read_at`` was the last read's,
    not the message's): it "ran now", found no slot (NoTaskSlot) and became
    ``Backlog.refused``, which pauses reading until it runs: the stream's parts were never
    read, and the close ran to ``drain_timeout``, the stream handler cut (89709f7)."""
    async with _stream_holds_the_slot(rpc.Options(max_concurrent=1)) as scene:
        if flood == "requests":
            many = b"".join(encode(Request(_rid(i), "work", b"0")) for i in range(10, 20_010))
        elif flood == "notifications":
            many = b"".join(encode(Notification("note", b"0")) for _ in range(20_000))
        else:
            many = _stream_requests(range(10, 12_010))
        scene.writer.write(many)


async def test_followers_of_stream_requests_turned_away_from_the_backlog_are_not_kept() -> None:
    """With ``max_request_bytes`` 256 KiB the close's flood is of stream requests, each with
    a part and its end. Those kept past a turn's 256 have their part and end set aside
    behind them (``Backlog._parked``); ``run_replies`` dropped such a request without its
    followers, which stayed set aside for good, counted in the backlog's bound (here its
    quarter of ``max_request_bytes``): it filled, reading paused for good, and the stream's
    parts were never read, the close running to ``drain_timeout`` (89709f7)."""
    options = rpc.Options(max_concurrent=1, max_request_bytes=256 << 10)
    async with _stream_holds_the_slot(options) as scene:
        scene.writer.write(_stream_requests(range(10, 3_010)))


async def test_parts_of_many_stream_requests_turned_away_do_not_fill_the_backlog() -> None:
    """With ``max_request_bytes`` 256 KiB the peer opens 400 stream requests during the
    close (turned away at once), then sends their parts in later reads. The parts of those
    the responder no longer remembers (past its last 256 ended streams) did not run now
    (not ``takes_parts``) and were kept behind the slot: the backlog filled (its quarter of
    ``max_request_bytes``), reading paused, the running stream's parts were never read and
    the close ran to ``drain_timeout`` (628c2ae)."""
    options = rpc.Options(max_concurrent=1, max_request_bytes=256 << 10)
    async with _stream_holds_the_slot(options) as scene:
        ids = range(10, 410)
        scene.writer.write(b"".join(encode(StreamRequest(_rid(i), "total", b"0")) for i in ids))
        await wait_until(lambda: len(scene.served._ended) >= 256, 2)  # read and turned away
        part = b"0" * 100
        for _ in range(30):
            scene.writer.write(b"".join(encode(StreamRequestPart(_rid(i), part)) for i in ids))


@dataclass
class ChatterScene:
    served: rpc.Peer
    codec: ChatterConnection
    writer: asyncio.StreamWriter
    slow_id: int

    async def send_heard(self, timeout: float = 2.0) -> None:
        """Write what the codec queued, then a Ping, and wait until the server has read
        that Ping (the codec checks a read before it runs), or has found a violation."""
        codec: Any = self.served.adapter.codec
        pings = codec.pings_received
        self.codec.send_ping()
        self.writer.write(self.codec.data_to_send())
        served = self.served
        await wait_until(
            lambda: served.violation is not None or codec.pings_received != pings, timeout
        )


@asynccontextmanager
async def _slow_in_flight(drain: float = DRAIN) -> AsyncIterator[ChatterScene]:
    """A raw current-dialect Chatter client (a peerwire one refuses to open more than
    65,536 conversations itself; a Hat one does not) of a ``retry_results=False`` server:
    its ``slow`` request runs, and the close has begun (drain bound ``drain``). The body
    floods; then ``slow`` ends, and the scene checks that no violation cut the close and
    that ``slow``, read before it, is the one request answered."""
    go, started = asyncio.Event(), asyncio.Event()
    reg = _registry()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        started.set()
        await go.wait()
        return value

    codec = ChatterConnection(Dialect.CURRENT, max_conversations=1 << 20)
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=reg, retry_results=False) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            slow_id = codec.send("slow", b"1", last=False).id
            writer.write(codec.data_to_send())
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=drain))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            yield ChatterScene(served, codec, writer, slow_id)
            assert served.violation is None, served.violation
            go.set()
            await asyncio.wait_for(closing, 10)
            replies = codec.receive_data(await asyncio.wait_for(reader.read(), 10))
            assert [(m.first, m.type) for m in replies] == [(slow_id, "PeerwireRpc.Result")]
        finally:
            writer.close()


async def test_a_chatter_flood_turned_away_does_not_abort_the_close() -> None:
    """More than the codec's 65,536 conversations opened during the close: each request
    turned away is forgotten by the codec (``Adapter.drop_request``). Each one was left
    open (nothing answers it), so the one past the bound was a violation, the connection
    aborted and the request read before the close cut unanswered (5b69d42). The drain's
    bound is long: 65,537 requests take a loaded machine a while, and the close ends once
    the slow request is released."""
    async with _slow_in_flight(drain=60) as scene:
        for _ in range(65_537):
            scene.codec.send("work", b"2", last=False)
        await scene.send_heard(timeout=30)


@pytest.mark.parametrize("then", ["streams", "requests"])
async def test_a_part_of_a_chatter_stream_turned_away_does_not_break_the_close(then: str) -> None:
    """A stream request turned away, its requester told nothing, keeps the token and sends
    parts after 4,096 more turned away (streams or plain requests). 5b69d42 abandoned them
    in the codec, which remembered the last ``max_abandoned`` (4,096) of the peer's,
    single requests too: that part was then a message in an unknown conversation, a
    violation that aborted the connection and cut the request read before the close
    (f12f32f)."""
    async with _slow_in_flight() as scene:
        codec = scene.codec
        first = Conversation(True, codec.send("total", b"", token=False, last=False).first)
        for _ in range(4096):
            if then == "streams":
                codec.send("total", b"", token=False, last=False)
            else:
                codec.send("work", b"2", last=False)
        await scene.send_heard()
        codec.send("PeerwireRpc.Part", b"x", conversation=first, token=False, last=False)
        await scene.send_heard()


@pytest.mark.parametrize("end", ["End", "token"])
async def test_chatter_streams_turned_away_and_ended_leave_no_conversation_open(end: str) -> None:
    """100 stream requests turned away, ended in a later read (``PeerwireRpc.End``, or a
    part handing the token over): once the token is back nothing answers them, and the
    codec held each open for good, counted toward its 65,536 conversations, so a peer
    sending that many in one close was a violation again (35930e9). The codec's open
    conversations must come back to the one read before the close."""
    async with _slow_in_flight() as scene:
        codec = scene.codec
        streams = []
        for _ in range(100):
            conv = Conversation(True, codec.send("total", b"", token=False, last=False).first)
            codec.send("PeerwireRpc.Part", b"x", conversation=conv, token=False, last=False)
            streams.append(conv)
        await scene.send_heard()
        for conv in streams:
            if end == "End":
                codec.send("PeerwireRpc.End", b"", conversation=conv, token=True, last=False)
            else:
                codec.send("PeerwireRpc.Part", b"y", conversation=conv, token=True, last=False)
        await scene.send_heard()
        open_now = scene.served.adapter.codec.open_conversations  # type: ignore[attr-defined]
        assert open_now == 1  # "slow" alone
