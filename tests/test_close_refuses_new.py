"""A request that arrives while its connection drains for a graceful close is refused
with a retry result ("not run"), not run and then cut: its caller may send it again
safely, and the reconnecting client does so on its next connection."""

from __future__ import annotations

import asyncio

import pytest

import rpc

pytestmark = pytest.mark.both_loops

URLS = {
    "gotalk": "tcp+gotalk://127.0.0.1:0",
    "chatter": "tcp+sbs://127.0.0.1:0?dialect=HatChatter",
}


def _registry(runs: list[object], started: asyncio.Event, release: asyncio.Event) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(_value: object) -> str:
        started.set()
        await release.wait()
        return "held"

    @reg.handle("count")
    async def count(value: object) -> object:
        runs.append(value)
        await asyncio.sleep(0)  # a coroutine that suspends: a job the drain could wait for
        return value

    return reg


async def _refusing(client: rpc.Peer | rpc.ReconnectingPeer) -> None:
    """Wait until the server refuses new requests: a request whose timeout is shorter
    than the retry result's wait (``Options.retry_wait``, 0.5 s) gets RetryLater at once."""
    with pytest.raises(rpc.RetryLater) as refused:
        await asyncio.wait_for(client.request("count", "probe", timeout=0.3), 5)
    assert "closing" in str(refused.value)


@pytest.mark.parametrize("protocol", sorted(URLS))
async def test_a_request_arriving_during_the_drain_is_not_run(protocol: str) -> None:
    """Before, ``count`` ran during the drain, and its caller got ConnectionClosed once
    the connection closed under it, or its result: the side effect happened either way.
    Now a retry result answers it, and its caller, waiting to send it again, gets
    RetryLater once the connection closed."""
    runs: list[object] = []
    started, release = asyncio.Event(), asyncio.Event()
    async with rpc.serve(URLS[protocol], registry=_registry(runs, started, release)) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            held = asyncio.ensure_future(client.request("hold", None, timeout=30))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=30))
            await asyncio.sleep(0)  # the close's first step: the connection drains now
            late = asyncio.ensure_future(client.request("count", 1, timeout=30))
            await _refusing(client)  # sent after late: late was refused before it
            release.set()  # the drain ends, the connection closes
            assert await asyncio.wait_for(held, 5) == "held"  # in flight before: waited for
            with pytest.raises(rpc.RetryLater, match="closing"):
                await asyncio.wait_for(late, 10)
            await asyncio.wait_for(closing, 10)
    assert runs == []


async def test_the_reconnecting_client_sends_a_refused_request_again() -> None:
    """A server restarted under a reconnecting client: an idempotent request it refused
    while draining runs once, on the new server (before, it ran on the old one, was cut
    by the close and was sent again: it ran twice)."""
    runs: list[object] = []
    started, release = asyncio.Event(), asyncio.Event()
    first = await rpc.serve(URLS["gotalk"], registry=_registry(runs, started, release))
    url = str(first.url)
    async with rpc.connect(url) as client:
        held = asyncio.ensure_future(client.request("hold", None, timeout=30))
        await asyncio.wait_for(started.wait(), 5)
        closing = asyncio.ensure_future(first.close(drain_timeout=30))
        await asyncio.sleep(0)  # the close's first step: the connection drains now
        late = asyncio.ensure_future(client.request("count", 7, timeout=30, idempotent=True))
        await _refusing(client)
        release.set()
        assert await asyncio.wait_for(held, 5) == "held"
        await asyncio.wait_for(closing, 10)
        assert runs == []  # refused by the first server
        async with rpc.serve(url, registry=_registry(runs, asyncio.Event(), release)):
            assert await asyncio.wait_for(late, 20) == 7
    assert runs == [7]
