"""A stream request's parts from a plain iterable leave the loop a turn every so often:
before, they were sent without one for as long as the transport took them (its socket's
buffer and more), so the connection's other work (its results, other calls, heartbeats) and
every other task of the loop waited, for good where the peer drains as fast as we send."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import rpc
from rpc.stream_request import PARTS_PER_TURN
from tests.rpc_helpers import served

PARTS = 40_000
PART = "x" * 200


@pytest.mark.parametrize("path", ["gotalk", "chatter-current"])
async def test_a_long_plain_source_leaves_the_loop_turns(path: str) -> None:
    reg = rpc.Registry()

    @reg.handle_stream("count")
    async def count(parts):
        n = 0
        async for _ in parts:
            n += 1
        return n

    turns = 0
    longest = 0  # the most parts taken from the source within one turn of the loop

    async def ticker() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    def source() -> Iterator[str]:
        nonlocal longest
        seen, run = turns, 0
        for _ in range(PARTS):
            if turns != seen:
                seen, run = turns, 0
            run += 1
            longest = max(longest, run)
            yield PART

    async with served(path, reg) as (_, peer):
        ticking = asyncio.create_task(ticker())
        try:
            assert [n async for n in peer.stream("count", parts=source(), raw=True)] == [
                str(PARTS).encode()
            ]
        finally:
            ticking.cancel()
    # before: ~20,000 (what the socket's buffer and the transport's high water took). The
    # ticker may run after the feeder within a turn, so one run it sees can span two goes
    assert longest <= 2 * (PARTS_PER_TURN + 1)
