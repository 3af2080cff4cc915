"""Chatter: results of more incoming streams than ``WAITING_STREAMS`` wait for their
requesters' tokens. The oldest stream's waiting results are dropped; its stream must then
fail, not go on with a gap (before, its caller got the results made after the drop as if
none were missing)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import rpc
from rpc.token_waits import WAITING_STREAMS
from tests.rpc_helpers import served, wait_until


async def test_a_stream_whose_waiting_results_were_dropped_fails() -> None:
    reg = rpc.Registry()
    answered = 0

    @reg.handle_stream("echo")
    async def echo(parts):
        nonlocal answered
        async for part in parts:
            answered += 1
            yield part

    go = asyncio.Event()

    async def source(n: int) -> AsyncIterator[int]:
        yield n
        await go.wait()  # the caller keeps its token meanwhile: results wait for it
        yield -n

    async def call(n: int) -> list[int]:
        return [x async for x in peer.stream("echo", parts=source(n), item_timeout=5)]

    count = WAITING_STREAMS + 1
    async with served("chatter-current", reg) as (_, peer):
        calls = [asyncio.create_task(call(n)) for n in range(1, count + 1)]
        await wait_until(lambda: answered == count)  # the first stream's result dropped
        go.set()
        done = await asyncio.gather(*calls, return_exceptions=True)
    first = done[0]
    # before: [-1], its first result missing and nothing said
    assert isinstance(first, rpc.RemoteError), first
    assert "streams' results waiting for their ends" in str(first)
    assert all(r == [n, -n] for n, r in enumerate(done[1:], 2))
