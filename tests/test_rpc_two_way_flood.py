"""Two peers that both flood each other with requests: while our output waits, the peer's
input is still read (its requests kept, not run) up to a bound (rpc.backlog, rpc.peer).

Before, a peer whose output waited stopped reading at the other's next request: two peers
both sending each other more than the socket buffers take each stopped reading the other,
and every call still waiting ended at its timeout. (That a peer that never reads is read
only up to the bound: tests/test_hostile_core.py.)
"""

from __future__ import annotations

import asyncio

import pytest

import rpc
from tests.rpc_helpers import TCP_URLS, echo_registry

pytestmark = [pytest.mark.both_loops, pytest.mark.timeout(60)]


async def flood(peer: rpc.Peer, side: str, count: int, size: int) -> list[bool]:
    """``count`` requests of ``size`` bytes at once to ``peer``'s echo: which came back."""
    values = [f"{side}{i:06d}" + "x" * size for i in range(count)]
    results = await asyncio.gather(
        *(peer.request("echo", value) for value in values), return_exceptions=True
    )
    timeouts = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(r, rpc.RequestTimeout) for r in timeouts), timeouts[:1]
    return [result == value for result, value in zip(results, values, strict=True)]


@pytest.mark.parametrize("protocol", sorted(TCP_URLS))
async def test_two_peers_flooding_each_other_all_complete(protocol: str) -> None:
    """Each side sends the other 300 requests of 100 kB at once (30 MB each way, far past
    the socket buffers and both high-water marks), with a 10-s timeout: all 600 complete.
    Before, both outputs backed up, each side stopped reading at the other's next request,
    and most calls on both sides ended with RequestTimeout."""
    options = rpc.Options(timeout=10)
    async with rpc.serve(TCP_URLS[protocol], registry=echo_registry(), options=options) as server:
        url = str(server.url)
        async with rpc.connect(url, registry=echo_registry(), options=options) as client:
            await client.request("echo", "hello")  # connected: the server has its peer
            [served] = server.peers
            ours, theirs = await asyncio.gather(
                flood(client, "c", 300, 100_000), flood(served, "s", 300, 100_000)
            )
            assert (ours.count(False), theirs.count(False)) == (0, 0)
