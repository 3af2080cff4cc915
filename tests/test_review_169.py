"""helper-169's review of 1922a74 (the graceful close wakes as a stopped input is read
again): how long a kept stream request of the peer's keeps the input read."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc.errors import ConnectionClosed
from tests.rpc_helpers import wait_until

pytestmark = pytest.mark.both_loops

DRAIN = 2.0


async def test_the_input_stops_again_once_a_kept_stream_request_took_its_parts() -> None:
    """A stream request read before the close but kept (both slots taken, a peer without
    retry results) starts once the close stopped the input: reading resumes for its parts
    (read_on), and must stop again once they have ended, as docs/api.md says ("or a stream
    request of its still takes parts; after that it is no longer read"), while another
    handler read before the close still runs. The close, asleep in an ALL_COMPLETED wait on
    the handlers, looked again only once every one had ended, so a busy peer's requests
    sent meanwhile were read, run and waited for."""
    first, second, gate = asyncio.Event(), asyncio.Event(), asyncio.Event()
    started: list[int] = []
    took: list[int] = []
    ran: list[Any] = []
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: int) -> int:
        started.append(value)
        await (first if value == 1 else second).wait()
        return value

    @reg.handle_stream("total")
    async def total(values: Any) -> int:
        sum_ = 0
        async for value in values:
            took.append(value)
            sum_ += value
        return sum_

    @reg.handle("work")
    def work(value: Any) -> Any:
        ran.append(value)
        return value

    async def parts() -> Any:
        yield 1
        await gate.wait()
        yield 2

    async def collect(client: Any) -> list[Any]:
        return [x async for x in client.stream("total", parts=parts(), timeout=DRAIN + 2)]

    options = rpc.Options(max_concurrent=2)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False, options=options
    ) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            held = [
                asyncio.ensure_future(client.request("slow", value, timeout=DRAIN + 2))
                for value in (1, 2)
            ]
            await wait_until(lambda: len(started) == 2, 5)
            [served] = server.peers
            streamed = asyncio.ensure_future(collect(client))
            await wait_until(lambda: served._backlog, 5)  # kept: both slots are taken
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: not served.reading, 2)  # the input stopped
            first.set()  # a slot frees: the stream's handler starts, the input is read
            await wait_until(lambda: took == [1], 2)
            gate.set()  # part 2 and the stream's end come now
            assert await asyncio.wait_for(streamed, DRAIN) == [3]
            try:  # "slow" 2 still runs: nothing else keeps the input read
                await wait_until(lambda: not served.reading, DRAIN / 4)
            except TimeoutError:
                pytest.fail("the input was still read once the stream's parts had ended")
            late = asyncio.ensure_future(client.request("work", 1, timeout=DRAIN + 2))
            second.set()
            assert [await asyncio.wait_for(call, DRAIN) for call in held] == [1, 2]
            await asyncio.wait_for(closing, DRAIN + 3)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(late, DRAIN)
    assert ran == []
