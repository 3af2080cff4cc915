"""Backpressure for streams (rpc.stream_hold): a stream whose reader falls behind pauses the
connection's reading instead of failing; a reader that stops fails its stream alone at its
stall limit; a reader that goes away ends the hold at once. Both directions: results of a
stream of ours, parts of a stream request to our handler."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import FLAVOURS, served
from tests.rpc_helpers import wait_until as until
from wire import gotalk

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_loops]

RID = b"\x00\x00\x00\x01"


def registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    @reg.handle("count")
    async def count(n: int) -> Any:
        for i in range(n):
            yield i

    return reg


@contextlib.asynccontextmanager
async def raw_gotalk(
    reg: rpc.Registry, options: rpc.Options
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A Gotalk server and a raw connection to it that has sent its version."""
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, options=options) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.url.port)
        writer.write(b"01")
        try:
            yield reader, writer
        finally:
            writer.transport.abort()


def stream_request(parts: int, then_echo: bool = True) -> bytes:
    """A stream request of ``parts`` + 1 parts of ``1`` in one write, its end, and an echo
    request (id 2) behind it."""
    out = [gotalk.encode(gotalk.StreamRequest(RID, "sum", b"1"))]
    out += [gotalk.encode(gotalk.StreamRequestPart(RID, b"1")) for _ in range(parts)]
    out.append(gotalk.encode(gotalk.StreamRequestPart(RID, b"")))
    if then_echo:
        out.append(gotalk.encode(gotalk.Request(b"\x00\x00\x00\x02", "echo", b'"still here"')))
    return b"".join(out)


async def read_until(
    reader: asyncio.StreamReader, done: Any, codec: gotalk.GotalkConnection | None = None
) -> list[Any]:
    """Messages read until ``done(messages)``; ``codec``: one that has read the version."""
    codec = codec or gotalk.GotalkConnection()
    seen: list[Any] = []
    async with asyncio.timeout(10):
        while not done(seen):
            data = await reader.read(65536)
            if not data:
                break
            seen += codec.receive_data(data)
    return seen


def results(seen: list[Any]) -> dict[bytes, bytes]:
    """Each request's result: a Result, or a stream request's one StreamResult part."""
    kinds = gotalk.Result | gotalk.StreamResult
    return {m.id: m.payload for m in seen if isinstance(m, kinds) and m.payload}


async def test_a_stream_request_outrunning_its_handler_waits_for_it() -> None:
    """51 parts in one read for a handler that takes them one loop turn at a time, with
    room for 4: the handler gets every part (the connection stops reading while its queue
    is full) and the request behind them is answered. Before, the stream failed ("parts
    arrive faster than handled")."""
    reg = registry()

    @reg.handle_stream("sum")
    async def total(parts: Any) -> int:
        result = 0
        async for part in parts:
            await asyncio.sleep(0)
            result += part
        return result

    async with raw_gotalk(reg, rpc.Options(max_stream_queue=4)) as (reader, writer):
        writer.write(stream_request(50))
        seen = await read_until(reader, lambda seen: len(results(seen)) == 2)
        assert results(seen) == {RID: b"51", b"\x00\x00\x00\x02": b'"still here"'}
        assert not [m for m in seen if isinstance(m, gotalk.ErrorResult | gotalk.Fault)]


async def test_a_stream_handler_that_stops_reading_fails_alone_at_the_timeout() -> None:
    """A handler that takes one part and then waits on something else: once its queue is
    full for the connection's request timeout (0.3 s), its stream fails alone, what was
    held is read (the echo behind it is answered) and the handler, reading again, gets the
    error."""
    reg = registry()
    release = asyncio.Event()

    @reg.handle_stream("sum")
    async def stuck(parts: Any) -> int:
        result = 0
        async for part in parts:
            await release.wait()
            result += part
        return result

    options = rpc.Options(max_stream_queue=4, timeout=0.3)
    async with raw_gotalk(reg, options) as (reader, writer):
        writer.write(stream_request(50))
        codec = gotalk.GotalkConnection()
        seen = await read_until(reader, lambda seen: b"\x00\x00\x00\x02" in results(seen), codec)
        assert results(seen) == {b"\x00\x00\x00\x02": b'"still here"'}
        release.set()
        seen += await read_until(
            reader, lambda more: any(isinstance(m, gotalk.ErrorResult) for m in more), codec
        )
        [error] = [m for m in seen if isinstance(m, gotalk.ErrorResult)]
        assert error.id == RID  # parts waiting: 3 or 4, as the handler took its first
        waiting = rb"[34] stream request parts waiting, none taken for 0\.3 s"
        assert re.fullmatch(waiting, error.payload), error.payload


async def test_a_stream_queue_holds_at_most_max_size_bytes() -> None:
    """Parts of 20 kB for a handler that takes one and waits, with ``max_size`` 64 kB: the
    connection stops reading once its queue holds 64 kB (4 parts), not at 256 parts, so
    large parts cannot make one stream hold ``max_stream_queue`` x ``max_size`` bytes (4 GiB
    at the defaults). Before, all 40 waited in the queue (800 kB)."""
    reg = registry()
    release = asyncio.Event()
    peers: list[rpc.Peer] = []

    @reg.handle_stream("sum")
    async def total(parts: Any) -> int:
        result = 0
        async for part in parts:
            peers.append(rpc.current_peer.get())
            await release.wait()
            result += len(part)
        return result

    part = b'"' + b"x" * 20_000 + b'"'
    out = [gotalk.encode(gotalk.StreamRequest(RID, "sum", part))]
    out += [gotalk.encode(gotalk.StreamRequestPart(RID, part)) for _ in range(40)]
    out.append(gotalk.encode(gotalk.StreamRequestPart(RID, b"")))
    options = rpc.Options(max_size=64 * 1024, timeout=30)
    async with raw_gotalk(reg, options) as (reader, writer):
        writer.write(b"".join(out))
        await until(lambda: bool(peers) and peers[0]._stream_hold.active)
        [queue] = peers[0]._streams.values()
        assert queue.bytes < 64 * 1024 + len(part) and len(queue) <= 4
        release.set()
        seen = await read_until(reader, lambda seen: RID in results(seen))
        assert results(seen)[RID] == str(41 * 20_000).encode()


async def test_a_stream_handler_that_ends_early_ends_the_hold_at_once() -> None:
    """A handler that returns after its first part while its queue is full: reading
    resumes then, not at the 30-s stall limit."""
    reg = registry()

    @reg.handle_stream("sum")
    async def first_only(parts: Any) -> int:
        peer = rpc.current_peer.get()
        async for part in parts:
            await until(lambda: peer._stream_hold.active)  # the other parts fill the queue
            return int(part)
        return 0

    options = rpc.Options(max_stream_queue=4, timeout=30)
    async with raw_gotalk(reg, options) as (reader, writer):
        writer.write(stream_request(50))
        seen = await read_until(reader, lambda seen: len(results(seen)) == 2)
        assert results(seen) == {RID: b"1", b"\x00\x00\x00\x02": b'"still here"'}


async def test_a_stream_handler_reading_slowly_but_steadily_is_never_failed() -> None:
    """A handler that takes a part every 10 ms, with room for 64 and a request timeout of
    0.2 s: taking half its queue takes 0.32 s, longer than the limit, but it never goes
    0.2 s without taking one, so its stream goes on. Before, the limit counted from the
    hold's start, and the stream failed."""
    reg = registry()

    @reg.handle_stream("sum")
    async def total(parts: Any) -> int:
        result = 0
        async for part in parts:
            await asyncio.sleep(0.01)  # a slow handler (its pace, not a synchronisation)
            result += part
        return result

    options = rpc.Options(max_stream_queue=64, timeout=0.2)
    async with raw_gotalk(reg, options) as (reader, writer):
        writer.write(stream_request(120))
        seen = await read_until(reader, lambda seen: len(results(seen)) == 2)
        assert results(seen) == {RID: b"121", b"\x00\x00\x00\x02": b'"still here"'}


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_our_stream_with_a_slow_but_steady_reader_outlasts_its_item_timeout(
    flavour: str,
) -> None:
    """A reader that takes a result every 10 ms, with room for 64 and an ``item_timeout``
    of 0.2 s: half the queue takes it 0.32 s, but it never goes 0.2 s without taking one,
    so it gets every result. Before, the stream failed at 0.2 s into the hold."""
    options = rpc.Options(max_stream_queue=64)
    async with served(flavour, registry(), client_options=options) as (_srv, peer):
        got = []
        async for item in peer.stream("count", value=120, item_timeout=0.2):
            got.append(item)
            await asyncio.sleep(0.01)  # a slow reader (its pace, not a synchronisation)
        assert got == list(range(120))


@pytest.mark.parametrize("flavour", list(FLAVOURS))
async def test_our_stream_with_a_slow_reader_gets_every_result(flavour: str) -> None:
    """3,000 results from a handler that sends them as fast as it can, read by a reader
    that pauses every 100, with room for 16: every result arrives, in order. Before, the
    stream failed with StreamOverflow."""
    options = rpc.Options(max_stream_queue=16)
    async with served(flavour, registry(), client_options=options) as (_srv, peer):
        got = []
        async for item in peer.stream("count", value=3000, item_timeout=5):
            got.append(item)
            if len(got) % 100 == 0:
                await asyncio.sleep(0.002)  # the reader's pause (its pace, not a wait)
        assert got == list(range(3000))
        assert await peer.request("echo", "after", timeout=5) == "after"


@pytest.mark.parametrize(
    ("scheme", "query", "told"),
    [("tcp+gotalk", "", True), ("tcp+sbs", "?dialect=HatChatter", True), ("tcp+sbs", "", False)],
)
async def test_our_stream_whose_reader_stops_fails_alone(
    scheme: str, query: str, told: bool
) -> None:
    """A reader that stops while its stream's queue is full: at its ``item_timeout`` the
    stream fails with StreamOverflow (after the results before it), the connection goes on,
    and a peer that speaks the extension (not legacy Hat Chatter, which has no room for it)
    is told and cancels its handler. (Results of 1 kB: 20 MB, more than the sockets'
    buffers hold, so the handler cannot send them all before the limit.)"""
    reg = registry()
    produced: list[int] = []
    stopped = asyncio.Event()

    @reg.handle("flood")
    async def flood(count: int) -> Any:
        try:
            for i in range(count):
                produced.append(i)
                yield [i, "x" * 1000]
                await asyncio.sleep(0)
        finally:
            stopped.set()

    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=reg) as srv:
        options = rpc.Options(max_stream_queue=16)
        url = str(srv.url) + query
        async with rpc.connect(
            url, options=options, registry=rpc.Registry(), reconnect=False
        ) as peer:
            results = peer.stream("flood", value=20_000, item_timeout=0.5)
            assert (await anext(results))[0] == 0
            got = []
            with pytest.raises(
                rpc.StreamOverflow, match=r"16 stream results waiting, none taken for 0\.5 s"
            ):
                async for item in results:
                    await stopped.wait()  # read nothing more until the handler has ended
                    got.append(item[0])
            assert got == list(range(1, len(got) + 1))
            assert (len(produced) < 20_000) is told  # cancelled, or run to its end
            assert await peer.request("echo", "still here", timeout=5) == "still here"
            assert not peer._calls  # our side keeps no state for the failed stream


async def test_our_held_stream_given_up_on_ends_the_hold_at_once() -> None:
    """A stream whose full queue holds the connection, closed by its reader: reading
    resumes then (a request is answered), not at the stream's 30-s ``item_timeout``."""
    options = rpc.Options(max_stream_queue=16)
    async with served("gotalk", registry(), client_options=options) as (_srv, peer):
        results = peer.stream("count", value=100_000, item_timeout=30)
        assert await anext(results) == 0
        await until(lambda: peer._stream_hold.active)
        await results.aclose()
        async with asyncio.timeout(5):
            assert await peer.request("echo", "after", timeout=5) == "after"
        assert not peer._stream_hold.active


def test_a_stream_queue_holds_at_least_one_item() -> None:
    """With room for none, a stream's first item would wait for a reader that has nothing
    to take, until the stall limit: refused when the options are made."""
    with pytest.raises(ValueError, match="max_stream_queue must be at least 1"):
        rpc.Options(max_stream_queue=0)
