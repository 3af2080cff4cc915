"""Chatter: the late replies of more calls than the tracker once remembered (4,096 abandoned
conversations) are dropped, and the connection stays up. Before, the reply to a call
abandoned 4,097 calls ago was taken for a violation and the connection closed. Real
peers; a server without the cancellation extension, whose handlers answer after the
calls' timeouts."""

from __future__ import annotations

import asyncio

import pytest

import rpc
from tests.rpc_helpers import served

CALLS = 4200  # past the 4,096 abandoned conversations that were remembered
OPTIONS = rpc.Options(max_concurrent=CALLS + 1)  # every slow call waits in its handler


@pytest.mark.parametrize("flavour", ["chatter-legacy", "chatter-current"])
async def test_late_replies_of_many_timed_out_calls_are_dropped(flavour: str) -> None:
    release, answered = asyncio.Event(), asyncio.Event()
    finished = 0
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(data: bytes) -> str:
        nonlocal finished
        await release.wait()
        finished += 1
        if finished == CALLS:
            answered.set()
        return "late"

    @reg.handle("fast")
    def fast(data: bytes) -> int:
        return len(data)

    # extensions off: the server is not told of the timeouts, so its handlers do answer
    async with served(flavour, reg, options=OPTIONS, extensions=False) as (_, peer):
        results = await asyncio.gather(
            *(peer.request("slow", b"x", timeout=0.3) for _ in range(CALLS)),
            return_exceptions=True,
        )
        assert all(isinstance(r, rpc.RequestTimeout) for r in results)
        release.set()  # every call timed out: the replies that follow are all late
        await asyncio.wait_for(answered.wait(), 10)
        # the server answers this after the late replies, in the same byte stream
        assert await peer.request("fast", b"still up", timeout=5) == 8
        assert peer.is_open and peer.violation is None
        assert peer.codec.open_conversations == 0
