"""What the randomized input-flow test (tests/test_rpc_input_flow_random.py) found, shrunk
to a test each (helper-98); both failed on a4b4894: a stream part past
``max_request_bytes`` paused reading, so the replies its handlers waited for went unread;
Chatter results produced while earlier ones waited for the caller's End overtook them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import FLAVOURS, wait_until
from tests.test_rpc_input_flow_random import BOUND, KIB, Limits, run_plan


@pytest.mark.parametrize("retry_results", [False, True])
@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_part_held_for_request_bytes_does_not_hold_the_reply_they_wait_for(
    flavour: str, retry_results: bool
) -> None:
    """A handler whose payload alone passes ``max_request_bytes`` (the first payload
    always goes in) calls the client back; meanwhile a part of a running stream comes.
    The part must wait for room (rpc.responder.on_request_part: InputHeld), but the reply
    the handler waits for, which the client sent after it, must still be read: the
    backlog's own share exists "so that their handlers still get the peer's replies to
    their calls" (docs/limits.md). The part's InputHeld marks it ``refused``, which pauses
    reading until it runs: the reply stays unread until the server's call times out (30 s
    here; Gotalk's default 30 s, Chatter's 5 s), then the handler fails and the part runs."""
    seen: list[int] = []
    registry = rpc.Registry()

    @registry.handle_stream("collect")
    async def collect(parts: AsyncIterator[int]) -> list[int]:
        async for item in parts:
            seen.append(item)
        return seen

    @registry.handle("callback")
    async def callback(value: str) -> Any:
        return await rpc.current_peer.get().request("client_wait", len(value))

    asked, answer = asyncio.Event(), asyncio.Event()
    client_registry = rpc.Registry()

    @client_registry.handle("client_wait")
    async def client_wait(size: int) -> int:
        asked.set()
        await answer.wait()
        return size

    second, sent = asyncio.Event(), asyncio.Event()

    async def parts() -> AsyncIterator[int]:
        yield 1
        await second.wait()
        yield 2
        sent.set()  # part 2 is in the client's output, ahead of the reply written later

    scheme, query = FLAVOURS[flavour]
    options = rpc.Options(max_concurrent=2, max_request_bytes=8 * KIB, timeout=30)
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=registry, options=options, retry_results=retry_results
    ) as srv:
        url = f"{scheme}://127.0.0.1:{srv.url.port}{query}"
        async with rpc.connect(
            url, registry=client_registry, options=rpc.Options(timeout=30), reconnect=False
        ) as client:

            async def streamed() -> list[Any]:
                return [r async for r in client.stream("collect", parts=parts())]

            stream = asyncio.ensure_future(streamed())
            await wait_until(lambda: seen == [1])  # the stream's handler runs
            call = asyncio.ensure_future(client.request("callback", "x" * (10 * KIB)))
            await asyncio.wait_for(asked.wait(), BOUND)  # its 10 KiB held: past the limit
            second.set()
            await asyncio.wait_for(sent.wait(), BOUND)
            answer.set()
            try:
                async with asyncio.timeout(5):
                    assert await call == 10 * KIB
                    assert await stream == [[1, 2]]
            finally:
                stream.cancel()
                call.cancel()


@pytest.mark.both_loops
async def test_chatter_two_way_stream_past_its_queue_keeps_its_results_in_order() -> None:
    """Chatter: a stream handler that answers each part as it comes (results wait for the
    caller's End: rpc.token_waits, at most ``max_stream_queue`` of them, past it an error
    result), 10 parts with ``max_stream_queue=2``. The caller got every result but the
    first one late: [1, 2, 3, 4, 5, 6, 7, 8, 0, 9] (asyncio, both server limits below;
    found by the randomized test above, shrunk). The results must come in order, or the
    documented error must end the stream; never reordered."""
    limits = Limits(
        max_concurrent=1, max_stream_queue=2, high_water=64 * KIB, client_stream_queue=6, slack=0
    )
    try:
        await run_plan("chatter-current", limits, [("twoway_uncapped", 10, 0, {})])
    except rpc.RemoteError as exc:  # the documented outcome
        assert "results before the stream's end" in str(exc)
