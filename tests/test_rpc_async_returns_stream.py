"""An ``async def`` handler that returns an async generator: its results are streamed on the
plain path as through middleware (the plain path answered it as one unencodable result), on
both protocols, for a request and a stream request, with and without the caller's deadline."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import served, wait_until

pytestmark = pytest.mark.timeout(30)


async def passthrough(call: rpc.Call, call_next: rpc.CallNext) -> Any:
    return await call_next(call)


def registry(path: str) -> rpc.Registry:
    reg = rpc.Registry()
    if path == "middleware":
        reg.use(passthrough)

    @reg.handle("count")
    async def count(n: int) -> Any:
        async def numbers() -> AsyncIterator[int]:
            for i in range(n):
                yield i

        return numbers()

    @reg.handle_stream("tens")
    async def tens(parts: AsyncIterator[int]) -> Any:
        async def times_ten() -> AsyncIterator[int]:  # reads the parts while it streams
            async for part in parts:
                yield part * 10

        return times_ten()

    return reg


@pytest.mark.parametrize("timeout", [None, 5.0], ids=["untimed", "timed"])
@pytest.mark.parametrize("path", ["plain", "middleware"])
@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_an_async_def_returning_an_async_generator_is_streamed(
    flavour: str, path: str, timeout: float | None
) -> None:
    async with served(flavour, registry(path)) as (_server, peer):
        await wait_until(lambda: peer.adapter.metadata)
        assert [x async for x in peer.stream("count", value=3, timeout=timeout)] == [0, 1, 2]
        assert [x async for x in peer.stream("count", value=0, timeout=timeout)] == []
        results = peer.stream("tens", parts=[1, 2, 3], timeout=timeout)
        assert [x async for x in results] == [10, 20, 30]
