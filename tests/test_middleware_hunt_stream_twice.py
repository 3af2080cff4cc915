"""A served stream request whose middleware calls ``call_next`` again (a retry) after the
first handler read every part: the second handler cannot wait for parts that will never
come, so the call fails at once with an error result instead of holding its handler slot
until the caller gives up (or forever, for a caller without a deadline or cancellation)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import served


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_call_next_again_after_the_parts_ended_fails_at_once(flavour: str) -> None:
    reg = rpc.Registry()
    sums: list[int] = []

    @reg.handle_stream("sum")
    async def total(parts: Any) -> int:
        s = 0
        async for p in parts:
            s += p
        sums.append(s)
        if len(sums) == 1:
            raise RuntimeError("first try fails")
        return s

    async def retry_once(call: rpc.Call, call_next: Any) -> Any:
        try:
            return await call_next(call)
        except RuntimeError:
            return await call_next(call)

    reg.use(retry_once)
    async with served(flavour, reg) as (_, peer):
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(rpc.RemoteError, match="parts were all taken by an earlier call"):
            async for _ in peer.stream("sum", parts=[1, 2, 3], timeout=1.5):
                pass
        assert loop.time() - start < 1.0  # an answer, not the caller's timeout
        assert sums == [6]  # the second handler never ran on an empty stream
