"""The bytes a connection holds for the peer's requests are bounded (rpc.request_bytes).

Payloads of requests whose coroutine handlers have not finished, and stream parts not yet
read, count against ``Options.max_request_bytes``. Before, they were bounded in number
alone: ``max_concurrent`` (1,024) requests of up to ``max_size`` (16 MiB) each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import wait_until

pytestmark = [pytest.mark.both_loops, pytest.mark.timeout(60)]

MB = 1_000_000
LIMIT = 4 * 1024 * 1024  # 4.19 MB: four payloads of 1 MB fit under it, a fifth passes it


def held(server: rpc.Server) -> int:
    [peer] = server.peers
    return peer._request_bytes.used


@pytest.mark.parametrize("retry_results", [True, False], ids=["retry", "reading-paused"])
async def test_waiting_handlers_hold_at_most_the_limit_plus_one_payload(
    retry_results: bool,
) -> None:
    """20 requests of 1 MB for a handler that waits: at most five run at once (the fifth
    passes the limit), the rest get a retry result (which the client honours) or wait
    unread; all are answered once the handlers go on. Before, all 20 ran at once."""
    registry = rpc.Registry()
    go = asyncio.Event()
    running = 0
    most = 0

    @registry.handle("hold")
    async def hold(value: str) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await go.wait()
        running -= 1
        return len(value)

    server_options = rpc.Options(max_request_bytes=LIMIT, retry_wait=0.05)
    client_options = rpc.Options(timeout=20, retries=1000)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0",
        registry=registry,
        options=server_options,
        retry_results=retry_results,
    ) as server:
        async with rpc.connect(str(server.url), options=client_options) as peer:
            calls = [asyncio.ensure_future(peer.request("hold", "x" * MB)) for _ in range(20)]
            await wait_until(lambda: running == 5)
            if not retry_results:  # the other requests wait unread
                [served] = server.peers
                await wait_until(lambda: not served.reading)
            assert running == 5 and LIMIT <= held(server) < LIMIT + MB + 100
            go.set()
            assert await asyncio.gather(*calls) == [MB] * 20
            assert most == 5
            await wait_until(lambda: held(server) == 0)


async def test_unread_stream_parts_hold_reading_at_the_limit() -> None:
    """A stream handler that reads nothing until told: its 40 parts of 1 MB stop at the
    limit (reading paused), where before 16 MiB of them waited (the queue's own bound);
    once it reads, every part arrives."""
    registry = rpc.Registry()
    go = asyncio.Event()

    @registry.handle_stream("total")
    async def total(parts: AsyncIterator[str]) -> int:
        await go.wait()
        return sum([len(part) async for part in parts])

    options = rpc.Options(max_request_bytes=LIMIT, timeout=20)
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry, options=options) as server:
        async with rpc.connect(str(server.url), options=options) as peer:

            async def send() -> list[Any]:
                return [r async for r in peer.stream("total", parts=["y" * MB] * 40)]

            call = asyncio.ensure_future(send())
            await wait_until(lambda: server.peers and held(server) >= LIMIT)
            [served] = server.peers
            await wait_until(lambda: not served.reading)
            assert held(server) < LIMIT + MB + 100
            go.set()
            assert await call == [40 * MB]
            await wait_until(lambda: held(server) == 0)


@pytest.mark.parametrize("ending", ["returns", "raises", "plain"])
async def test_parts_left_unread_stop_counting_when_the_handler_ends(ending: str) -> None:
    """A stream handler that ends without reading its parts (returns, raises, or is a
    plain function): what is left in its queue no longer counts, so the connection does
    not stay full for good."""
    registry = rpc.Registry()
    arrived = asyncio.Event()
    go = asyncio.Event()

    if ending == "plain":

        @registry.handle_stream("skip")
        def skip_plain(parts: AsyncIterator[str]) -> int:
            return 0

    else:

        @registry.handle_stream("skip")
        async def skip(parts: AsyncIterator[str]) -> int:
            arrived.set()
            await go.wait()
            if ending == "raises":
                raise ValueError("no")
            return 0

    options = rpc.Options(max_request_bytes=LIMIT, timeout=20)
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry, options=options) as server:
        async with rpc.connect(str(server.url), options=options) as peer:
            results = peer.stream("skip", parts=["z" * 1000] * 3)
            if ending != "plain":
                call = asyncio.ensure_future(anext(results))
                await arrived.wait()
                await wait_until(lambda: held(server) >= 3000)  # its parts wait unread
                go.set()
                if ending == "raises":
                    with pytest.raises(rpc.RemoteError):
                        await call
                else:
                    assert await call == 0
            else:
                assert await anext(results) == 0
            await wait_until(lambda: held(server) == 0)
