"""The parts of a kept stream request, set aside behind it and put back right behind it
when it is taken (rpc.backlog), keep their order against parts read later, a turn (256) at a
time. Each test failed on c31f466 (found in review by helper-95): a part read between two
turns ran at once, ahead of those put back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.gotalk_raw import served_raw
from tests.rpc_helpers import FLAVOURS, wait_until
from wire import gotalk


async def test_parts_put_back_behind_their_request_are_not_overtaken_by_a_later_read() -> None:
    """A stream request kept while another handler holds the one slot (a peer without
    retry results), and 8,000 of its parts set aside behind it: once the slot frees, the
    request runs and its parts follow, a turn (256) at a time. A part read meanwhile,
    between two turns, must run after them, not at once (c31f466: ``popleft`` puts them
    back first but leaves the backlog ``sorted``, so a read goes through ``take``, which
    runs a part of a running stream at once)."""
    gate = asyncio.Event()
    started = asyncio.Event()
    done = asyncio.Event()
    seen: list[int] = []
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(value: Any) -> Any:
        await gate.wait()
        return value

    @reg.handle_stream("collect")
    async def collect(parts: Any) -> int:
        async for n in parts:
            seen.append(n)
            if len(seen) == 300:  # the parts put back run: the second turn at them
                started.set()
        done.set()
        return len(seen)

    options = rpc.Options(max_concurrent=1, max_stream_queue=100_000)
    kept_count, late = 8000, 50
    async with served_raw(reg, options, retry_results=False) as (raw, peer):
        kept = peer._kept
        raw.request_alone(b"0002", "hold", b"1")
        await wait_until(lambda: peer.handlers_running == 1)
        raw.write(gotalk.StreamRequest(b"0001", "collect", b""))  # no slot: kept
        for n in range(1, kept_count + 1):
            raw.write(gotalk.StreamRequestPart(b"0001", str(n).encode()))
        await wait_until(lambda: len(kept) == kept_count + 1 and peer.reading)
        assert len(kept.messages) == 1  # the parts are set aside behind their request
        gate.set()  # the slot frees: the stream's handler takes it, its parts follow
        async with asyncio.timeout(10):
            await started.wait()
            assert kept.messages  # parts put back still wait for their turns
            for n in range(kept_count + 1, kept_count + late + 1):
                raw.write(gotalk.StreamRequestPart(b"0001", str(n).encode()))
            raw.write(gotalk.StreamRequestPart(b"0001", b""))
            await done.wait()
        assert seen == list(range(1, kept_count + late + 1))


@pytest.mark.parametrize("flavour", ["chatter-current", "chatter-legacy"])
async def test_chatter_parts_put_back_behind_their_request_keep_their_order(
    flavour: str,
) -> None:
    """The same over Chatter, with our own client: a part (and the End) read between two
    turns at the parts put back ran at once, ahead of them; the handler then saw its parts
    out of order and its End early (the later parts dropped as an ended stream's)."""
    gate = asyncio.Event()
    started = asyncio.Event()
    seen: list[int] = []
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(value: Any) -> Any:
        await gate.wait()
        return value

    @reg.handle_stream("collect")
    async def collect(parts: Any) -> int:
        async for n in parts:
            seen.append(n)
            if len(seen) == 300:  # the parts put back run: the second turn at them
                started.set()
        return len(seen)

    kept_count, late = 8000, 50

    async def parts() -> AsyncIterator[int]:
        for n in range(1, kept_count + 1):
            yield n
        await started.wait()
        for n in range(kept_count + 1, kept_count + late + 1):
            yield n

    scheme, query = FLAVOURS[flavour]
    options = rpc.Options(max_concurrent=1, max_stream_queue=100_000)
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        async with rpc.connect(url, reconnect=False) as client:
            [peer] = server.peers
            kept = peer._kept
            holding = asyncio.ensure_future(client.request("hold", "held"))
            await wait_until(lambda: peer.handlers_running == 1)

            async def streamed() -> list[Any]:
                return [item async for item in client.stream("collect", parts=parts())]

            stream = asyncio.ensure_future(streamed())
            await wait_until(lambda: len(kept) == kept_count and peer.reading)  # (1 in it)
            assert len(kept.messages) == 1  # the parts are set aside behind their request
            gate.set()
            async with asyncio.timeout(10):
                assert await holding == "held"
                assert await stream == [kept_count + late]
            assert seen == list(range(1, kept_count + late + 1))
