"""Replies to our calls are read while the peer's other input waits for handler slots.

Either side can handle and request, so a handler may call back the peer that called it. When
every slot is taken by such handlers, what the peer sends next (a notification, a request to
a peer that takes no retry results) must wait; the replies those handlers wait for must
not wait behind it. Before, reading paused at the first message that found no slot, and
the handlers waited for their replies until their calls timed out."""

from __future__ import annotations

import asyncio

import pytest

import rpc
from tests.rpc_helpers import FLAVOURS, served, wait_until


def calling_back_registry(answers: list[object]) -> rpc.Registry:
    """``ask(n)``: a notification whose handler calls the peer's ``back`` with ``n`` and
    keeps the answer; ``ask_request(n)`` does the same as a request and returns it."""
    reg = rpc.Registry()

    @reg.handle_notification("ask")
    async def ask(value: int) -> None:
        answers.append(await rpc.current_peer.get().request("back", value, timeout=20))

    @reg.handle("ask_request")
    async def ask_request(value: int) -> object:
        return await rpc.current_peer.get().request("back", value, timeout=20)

    return reg


def back_registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("back")
    async def back(value: int) -> object:
        await asyncio.sleep(0.05)  # the later notifications arrive while it works
        return value * 10

    return reg


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_notification_handlers_that_call_back_get_their_replies(flavour: str) -> None:
    answers: list[object] = []
    options = rpc.Options(max_concurrent=2)
    async with served(
        flavour, calling_back_registry(answers), client_registry=back_registry(), options=options
    ) as (_, peer):
        for n in range(6):  # four find no slot and wait while the first two call back
            peer.notify("ask", n)
        await wait_until(lambda: len(answers) == 6, timeout=10)  # not their 20-s timeouts
        assert sorted(answers) == [0, 10, 20, 30, 40, 50]


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_request_handlers_that_call_back_a_peer_without_retry_results(
    flavour: str,
) -> None:
    """A peer that takes no retry results gets none: its requests past the slots wait
    unread, but the replies the running handlers wait for are read."""
    scheme, query = FLAVOURS[flavour]
    answers: list[object] = []
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0",
        registry=calling_back_registry(answers),
        options=rpc.Options(max_concurrent=1),
        retry_results=False,
    ) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        async with rpc.connect(url, registry=back_registry(), reconnect=False) as peer:
            async with asyncio.timeout(10):
                got = await asyncio.gather(*(peer.request("ask_request", n) for n in range(4)))
    assert got == [0, 10, 20, 30]
