"""peerwire's Python client over ``ws+gotalk`` tells the server it takes retry results (the
``peerwire-retry`` query flag, as peerwire's browser client does): a request past
``max_concurrent`` is answered with a retry result (RetryLater), not kept until a handler
ends as for gotalk.js, and a request refused by a graceful close raises RetryLater (not run),
not ConnectionClosed ("may or may not have run"), as over ``tcp+gotalk`` (helper-209's
hunt: the client never sent the flag). Real sockets on 127.0.0.1, both loops."""

from __future__ import annotations

import asyncio

import pytest

import rpc
from tests.rpc_helpers import wait_until

pytestmark = pytest.mark.both_loops


def _registry(
    started: asyncio.Event, release: asyncio.Event, marked: asyncio.Event | None = None
) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(value: int) -> int:
        started.set()
        await release.wait()
        return value

    @reg.handle("echo")
    def echo(value: int) -> int:
        return value

    @reg.handle_notification("mark")
    def mark(value: int) -> None:
        if marked is not None:
            marked.set()

    return reg


async def test_a_request_past_max_concurrent_gets_a_retry_result() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0",
        registry=_registry(started, release),
        options=rpc.Options(max_concurrent=1),
    ) as server:
        async with rpc.connect(
            str(server.url), reconnect=False, options=rpc.Options(retries=0)
        ) as client:
            held = asyncio.ensure_future(client.request("hold", 1, timeout=10))
            await asyncio.wait_for(started.wait(), 5)
            with pytest.raises(rpc.RetryLater):
                await client.request("echo", 2, timeout=3)  # before: kept, then timed out
            release.set()
            assert await held == 1
            assert await client.request("echo", 3, timeout=5) == 3


async def test_a_request_refused_by_a_graceful_close_raises_retry_later() -> None:
    started, release, marked = asyncio.Event(), asyncio.Event(), asyncio.Event()
    registry = _registry(started, release, marked)
    async with rpc.serve("ws+gotalk://127.0.0.1:0", registry=registry) as server:
        async with rpc.connect(
            str(server.url), reconnect=False, options=rpc.Options(retries=0)
        ) as client:
            held = asyncio.ensure_future(client.request("hold", 1, timeout=10))
            await asyncio.wait_for(started.wait(), 5)
            closing = asyncio.ensure_future(server.close())
            [served] = server.peers
            await wait_until(lambda: served.gave_up is not None)  # its graceful close began
            refused = asyncio.ensure_future(client.request("echo", 2, timeout=5))
            await asyncio.sleep(0)  # one loop turn: the task's first step sends the request
            client.notify("mark", 0)  # read after it: the request was refused by then
            await asyncio.wait_for(marked.wait(), 5)
            release.set()
            assert await held == 1
            with pytest.raises(rpc.RetryLater):
                await refused
            await closing


async def test_the_flag_tells_the_server_about_its_client_not_the_client_about_its_server() -> None:
    """The server's transport reports the flag its client sent; the client's reports none
    (its request is its own): the client does not start sending retry results to servers,
    which it did with the flag in its own request (review 212 of f19f9f8)."""
    started, release = asyncio.Event(), asyncio.Event()
    async with rpc.serve("ws+gotalk://127.0.0.1:0", registry=_registry(started, release)) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            assert await client.request("echo", 1, timeout=5) == 1
            [served] = server.peers
            assert served.transport.get_extra_info("peerwire_retry") is True
            assert client.transport.get_extra_info("peerwire_retry") is False
