"""Two-way streams: a stream request's parts go out while its results are read
(rpc.stream_request). Before, every part was sent before the caller read a result, so a
handler answering each part as it came deadlocked a long stream: our full result queue
paused our reading, the server's output backed up, it stopped reading, our parts stopped
going out, and the stream failed at its ``item_timeout``. On the plain path and through
client middleware."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import served, wait_until


async def passthrough(call: rpc.Call, call_next: Any) -> Any:
    return await call_next(call)


PATHS: dict[str, tuple[Any, ...]] = {"plain": (), "middleware": (passthrough,)}
pytestmark = [
    pytest.mark.parametrize("path", list(PATHS)),
    pytest.mark.timeout(60),
    pytest.mark.both_loops,
]


class Echo:
    """A registry whose ``echo`` stream handler answers each part as it comes, and records
    the cancel it may get."""

    def __init__(self) -> None:
        self.registry = rpc.Registry()
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()

        @self.registry.handle_stream("echo")
        async def echo(parts: AsyncIterator[Any]) -> AsyncIterator[Any]:
            self.started.set()
            try:
                async for part in parts:
                    yield part
            except asyncio.CancelledError:
                self.cancelled.set()
                raise


def small_buffers(peer: rpc.Peer) -> None:
    """64 KiB socket buffers on our side: a few hundred kB fill the way both ways on any
    host (loopback buffers grow to megabytes otherwise)."""
    sock = peer.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)


async def test_a_long_two_way_stream_completes_in_order(path: str) -> None:
    """20,000 parts of 1 kB (20 MB each way, far past the buffers) echoed one by one:
    every result comes, in order, and nothing is left running. Before, the stream
    failed after ``item_timeout`` (StreamOverflow or RequestTimeout) with 256 results."""
    echo = Echo()
    count = 20_000
    part = "x" * 1000

    def parts() -> Iterator[str]:
        for i in range(count):
            yield f"{i:05d}{part}"

    async with served(
        "gotalk", echo.registry, client_options=rpc.Options(middleware=PATHS[path])
    ) as (_, peer):
        small_buffers(peer)
        before = asyncio.all_tasks()
        got = 0
        async for result in peer.stream("echo", parts=parts(), item_timeout=2):
            assert result == f"{got:05d}{part}"
            got += 1
        assert got == count
        assert not peer._calls
        await wait_until(lambda: asyncio.all_tasks() <= before)


@pytest.mark.parametrize("failure", ["raises", "oversized"])
async def test_a_failing_source_ends_the_stream_after_its_results(path: str, failure: str) -> None:
    """An async source that fails after three parts whose results came (it raises, or
    yields a part over ``max_size``): the reader gets those results, then the error, and
    the server hears the cancel. Before, the results were never read: the source waited
    for them until the stream's deadline (RequestTimeout)."""
    echo = Echo()
    three = asyncio.Event()

    async def source() -> AsyncIterator[Any]:
        for i in range(3):
            yield i
        await three.wait()  # the results of all three have come
        if failure == "raises":
            raise ValueError("source broke")
        yield "y" * 70_000

    options = rpc.Options(max_size=64 * 1024, middleware=PATHS[path])
    error = ValueError if failure == "raises" else rpc.PayloadError
    async with served("gotalk", echo.registry, client_options=options) as (_, peer):
        before = asyncio.all_tasks()
        got: list[Any] = []
        with pytest.raises(error):
            async for result in peer.stream("echo", parts=source(), timeout=5):
                got.append(result)
                if len(got) == 3:
                    three.set()
        assert got == [0, 1, 2]
        await asyncio.wait_for(echo.cancelled.wait(), 5)
        assert not peer._calls
        await wait_until(lambda: asyncio.all_tasks() <= before)
        assert [x async for x in peer.stream("echo", parts=[7, 8])] == [7, 8]


@pytest.mark.parametrize("leave", ["break", "aclose"])
async def test_a_reader_that_stops_early_stops_the_parts(path: str, leave: str) -> None:
    """An endless async source; the reader stops after 1,000 results (``break`` out of its
    loop, or ``aclose()`` on the stream): no task is left sending parts, the server's
    handler is cancelled, and the source is pulled no more. Before, no result was read
    while the parts went: the stream failed at its ``item_timeout`` (StreamOverflow after
    256 results)."""
    echo = Echo()
    pulled = 0

    async def endless() -> AsyncIterator[int]:
        nonlocal pulled
        while True:
            pulled += 1
            yield pulled
            await asyncio.sleep(0)

    async with served(
        "gotalk", echo.registry, client_options=rpc.Options(middleware=PATHS[path])
    ) as (_, peer):
        before = asyncio.all_tasks()
        got: list[int] = []
        if leave == "break":  # the stream, referenced no more, is closed by the loop
            async for result in peer.stream("echo", parts=endless(), item_timeout=2):
                got.append(result)
                if len(got) == 1000:
                    break
        else:
            results = peer.stream("echo", parts=endless(), item_timeout=2)
            while len(got) < 1000:
                got.append(await anext(results))
            await results.aclose()
        assert got == list(range(1, 1001))
        await asyncio.wait_for(echo.cancelled.wait(), 5)
        await wait_until(lambda: asyncio.all_tasks() <= before)
        assert not peer._calls
        taken = pulled
        assert [x async for x in peer.stream("echo", parts=[1])] == [1]
        assert pulled == taken  # nothing pulled it since


async def test_connection_lost_while_the_source_waits(path: str) -> None:
    """The source yields a part, then waits: its result is read meanwhile, and when the
    connection drops the reader gets ConnectionClosed at once, with no task left. Before,
    the result could not be read while the source waited."""
    echo = Echo()

    async def slow() -> AsyncIterator[int]:
        yield 1
        await asyncio.Event().wait()
        yield 2

    async with served(
        "gotalk", echo.registry, client_options=rpc.Options(middleware=PATHS[path])
    ) as (server, peer):
        before = asyncio.all_tasks()
        results = peer.stream("echo", parts=slow())
        assert await asyncio.wait_for(anext(results), 5) == 1
        [server_peer] = server.peers
        server_peer.transport.abort()
        with pytest.raises(rpc.ConnectionClosed):
            await asyncio.wait_for(anext(results), 5)
        await wait_until(lambda: asyncio.all_tasks() <= before)
        assert not peer._calls


async def test_item_timeout_counts_from_the_last_part(path: str) -> None:
    """A source slower than ``item_timeout`` (parts 0.2 s apart, 0.1 s for each result)
    for a handler that answers at the end: the result comes, as when no result was read
    before the last part had gone. Once the last part has gone, ``item_timeout`` bounds
    the wait again: a handler that then answers nothing fails the stream after it."""
    reg = rpc.Registry()
    hang = asyncio.Event()

    @reg.handle_stream("sum")
    async def total(parts: AsyncIterator[int]) -> int:
        result = sum([p async for p in parts])
        if result < 0:
            await hang.wait()
        return result

    async def slow(*values: int) -> AsyncIterator[int]:
        for value in values:
            await asyncio.sleep(0.2)  # the source's pace, what is tested
            yield value

    async with served("gotalk", reg, client_options=rpc.Options(middleware=PATHS[path])) as (
        _,
        peer,
    ):
        results = peer.stream("sum", parts=slow(1, 2, 3), item_timeout=0.1)
        assert [x async for x in results] == [6]
        with pytest.raises(rpc.RequestTimeout, match=r"sum: no result within 0\.1 s"):
            async with asyncio.timeout(5):  # the item bound, not this, must end it
                [x async for x in peer.stream("sum", parts=slow(1, -2), item_timeout=0.1)]
        assert not peer._calls
