"""helper-168's review of the graceful close's latest changes (f29d4e7, 153c7d8, 9dc3ddd):
what reads a stopped peer again (InputFlow.read_on), and for how long."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc.errors import ConnectionClosed
from tests.rpc_helpers import wait_until

pytestmark = pytest.mark.both_loops

DRAIN = 2.0


async def test_the_input_stops_again_once_a_call_begun_during_the_close_is_answered() -> None:
    """A handler read before the close calls the peer back once the close stopped the input
    (a peer without retry results): reading resumes for the reply (read_on), and must stop
    again once that call is answered, while another handler read before the close still
    runs. It stayed on until every handler the close waited for had ended, so a busy peer's
    requests sent meanwhile were read, run and waited for, as before 12d3f81."""
    go, release = asyncio.Event(), asyncio.Event()
    started: list[str] = []
    ran: list[Any] = []
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        started.append("slow")
        await release.wait()
        return value

    @reg.handle("ask")
    async def ask(value: Any) -> Any:
        started.append("ask")
        await go.wait()
        return await rpc.current_peer.get().request("answer", value, timeout=DRAIN + 1)

    @reg.handle("work")
    def work(value: Any) -> Any:
        ran.append(value)
        return value

    client_reg = rpc.Registry()

    @client_reg.handle("answer")
    def answer(value: Any) -> Any:
        return value * 2

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False) as server:
        async with rpc.connect(str(server.url), registry=client_reg, reconnect=False) as client:
            held = asyncio.ensure_future(client.request("slow", 7, timeout=DRAIN + 2))
            asked = asyncio.ensure_future(client.request("ask", 21, timeout=DRAIN + 2))
            await wait_until(lambda: len(started) == 2, 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: not served.reading, 2)  # the input stopped
            go.set()  # the callback: reading resumes for its reply
            assert await asyncio.wait_for(asked, DRAIN) == 42
            try:  # "slow" still runs: nothing else keeps the input read
                await wait_until(lambda: not served.reading, DRAIN / 4)
            except TimeoutError:
                pytest.fail("the input was still read once the close's callback was answered")
            late = asyncio.ensure_future(client.request("work", 1, timeout=DRAIN + 2))
            release.set()
            assert await asyncio.wait_for(held, DRAIN) == 7
            await asyncio.wait_for(closing, DRAIN + 3)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(late, DRAIN)
    assert ran == []


async def test_a_close_does_not_wait_for_results_kept_for_a_stream_of_ours() -> None:
    """A stream of ours whose reader stopped reading (its queue full: the results that
    follow wait in the backlog, the input paused) is cut by a graceful close, as the close
    says; the close waited for the backlog to empty (f29d4e7's Backlog.emptied), which
    those results never do while the close waits, so it took ``drain_timeout``."""
    reg = rpc.Registry()

    @reg.handle("many")
    async def many(value: Any) -> Any:
        for i in range(value):
            yield i

    loop = asyncio.get_running_loop()
    options = rpc.Options(max_stream_queue=2)
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as server:
        async with rpc.connect(str(server.url), reconnect=False, options=options) as client:
            results = client.stream("many", value=50, timeout=DRAIN + 3)
            assert await asyncio.wait_for(anext(results), 5) == 0
            await wait_until(lambda: client._backlog and not client.reading, 5)
            began = loop.time()
            await asyncio.wait_for(client.close(drain_timeout=DRAIN), DRAIN + 3)
            took = loop.time() - began
            await results.aclose()
    assert took < DRAIN / 2, f"the close took {took:.3f} s"
