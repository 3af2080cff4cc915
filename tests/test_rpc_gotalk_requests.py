"""A Gotalk client's request headers and ids over real sockets: the header formats a
connection keeps per operation, and ids once the count passes 2**32."""

from __future__ import annotations

import asyncio

import pytest

import rpc
from rpc.gotalk_peer import REQUEST_FORMATS, GotalkPeer
from tests.rpc_helpers import served, wait_until


def _named_registry(names: list[str]) -> rpc.Registry:
    reg = rpc.Registry()
    for name in names:
        reg.handle(name)(lambda data, name=name: f"{name}:{data}")
    return reg


async def test_more_operations_than_the_formats_a_connection_keeps() -> None:
    """Past REQUEST_FORMATS operations the kept formats start again; every request, first
    or repeated, still names its own operation (a name with % in it too)."""
    names = [f"op{index}" for index in range(REQUEST_FORMATS * 2 + 5)] + ["100%", "%b%08x"]
    async with served("gotalk", _named_registry(names)) as (_, peer):
        for round_ in range(2):
            for name in names:
                assert await peer.request(name, round_) == f"{name}:{round_}"
        # the same ops, interleaved, many in flight at once
        replies = await asyncio.gather(*(peer.request(name, 7) for name in names * 2))
        assert replies == [f"{name}:7" for name in names * 2]


async def test_ids_past_two_to_the_32_skip_ids_still_in_flight() -> None:
    """Ids are the count's low 32 bits: once it wraps, an id a call of ours still holds is
    skipped, so two calls in flight never share one (the 4 billion requests before are
    stood in for by setting the count)."""
    release = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("held")
    async def held(value: int) -> int:
        await release.wait()
        return value

    @reg.handle("echo")
    def echo(value: int) -> int:
        return value

    async with served("gotalk", reg) as (_, peer):
        assert isinstance(peer, GotalkPeer)
        adapter = peer.gotalk
        adapter._next_id = 9  # the held call gets id 10
        waiting = asyncio.ensure_future(peer.request("held", 1))
        await wait_until(lambda: peer.has_call((10).to_bytes(4, "little")))
        adapter._next_id = 2**32 + 9  # next count's low bits: 10, held
        assert await peer.request("echo", 2) == 2
        assert adapter._next_id == 2**32 + 11  # 10 skipped, 11 taken
        assert await peer.request("echo", 3) == 3
        release.set()
        assert await waiting == 1


async def test_a_stream_request_answered_early_stops_taking_parts() -> None:
    """A handler that refuses a stream request at its first part answers at once (Gotalk
    has no token to wait for): the caller sees the error and its source is not pulled any
    further. Before, an endless source was read (and sent) for good, the error unseen."""
    reg = rpc.Registry()

    @reg.handle_stream("upload")
    async def upload(parts):
        async for part in parts:
            raise ValueError(f"bad part {part!r}")

    pulled = 0

    async def live_feed():  # a part every 10 ms, for good
        nonlocal pulled
        while True:
            pulled += 1
            yield pulled
            await asyncio.sleep(0.01)

    async with served("gotalk", reg) as (_, peer):
        with pytest.raises(rpc.RemoteError, match="bad part 1"):
            async for _ in peer.stream("upload", parts=live_feed(), timeout=5):
                pass
        assert pulled < 50  # the error came within a few parts (RequestTimeout at 5 s before)
