"""Server middleware that change the call they pass on, over real sockets: another op runs
that op's handler (requests, streamed results, stream requests, notifications), and the
handler sees the call it was given as ``rpc.current_call``."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import FLAVOURS

pytestmark = pytest.mark.parametrize("flavour", list(FLAVOURS))


def registry(seen: list[Any]) -> rpc.Registry:
    """``x`` and ``v1-x`` both registered: a rewrite that is not honoured shows as ``v1-x``'s
    answer; ``count``, ``sum`` and ``note`` only under their plain names."""
    reg = rpc.Registry()

    @reg.handle("x")
    def x(value: Any) -> Any:
        call = rpc.current_call.get()
        seen.append(call)
        return ["x", value, call.op, call.context.get("by")]

    @reg.handle("v1-x")
    def old_x(value: Any) -> Any:
        return ["v1-x", value]

    @reg.handle("count")
    async def count(n: int) -> AsyncIterator[Any]:
        for i in range(n):
            yield [i, rpc.current_call.get().op]

    @reg.handle_stream("sum")
    async def total(parts: AsyncIterator[int]) -> Any:
        return [sum([p async for p in parts]), rpc.current_call.get().op]

    @reg.handle_notification("note")
    def note(value: Any) -> None:
        seen.append(("note", value, rpc.current_call.get().op))

    return reg


async def strip_in_place(call: rpc.Call, call_next: Any) -> Any:
    """Changes the call it was given."""
    if call.op.startswith("v1-"):
        call.op = call.op[3:]
        call.context["by"] = "in place"
    return await call_next(call)


async def strip_to_new_call(call: rpc.Call, call_next: Any) -> Any:
    """Passes a new call on, leaving the one it was given as received."""
    if call.op.startswith("v1-"):
        new = dataclasses.replace(call, op=call.op[3:], context={"by": "new call"})
        return await call_next(new)
    return await call_next(call)


@pytest.mark.parametrize("rewrite", [strip_in_place, strip_to_new_call])
async def test_another_op_runs_that_ops_handler(flavour: str, rewrite: rpc.Middleware) -> None:
    seen: list[Any] = []
    scheme, query = FLAVOURS[flavour]
    reg = registry(seen)
    noted = asyncio.Event()
    reg.handle_notification("done")(lambda _: noted.set())
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=reg, middleware=[rewrite]) as srv:
        url = f"{scheme}://127.0.0.1:{srv.url.port}{query}"
        async with rpc.connect(url, registry=rpc.Registry(), reconnect=False) as peer:
            by = "in place" if rewrite is strip_in_place else "new call"
            assert await peer.request("v1-x", 7) == ["x", 7, "x", by]
            [call] = seen
            assert call.op == "x"  # rpc.current_call in the handler: the call it was given
            with pytest.raises(rpc.RemoteError, match='unknown operation "nope"'):
                await peer.request("v1-nope", 1)
            # a streamed result, and a stream request for an op only middleware know
            assert [x async for x in peer.stream("v1-count", value=2)] == [
                [0, "count"],
                [1, "count"],
            ]
            assert [x async for x in peer.stream("v1-sum", parts=[1, 2, 3])] == [[6, "sum"]]
            # a stream request for a single-request op: the usual error, naming that op
            with pytest.raises(rpc.RemoteError, match='"x" does not take stream requests'):
                [x async for x in peer.stream("v1-x", parts=[1])]
            assert await peer.request("x", 1) == ["x", 1, "x", None]  # as received: unchanged
            peer.notify("v1-note", 5)
            peer.notify("done", None)  # their handlers start in order
            await asyncio.wait_for(noted.wait(), 5)
    assert seen[-1] == ("note", 5, "note")


async def test_a_changed_first_part_reaches_a_stream_handler(flavour: str) -> None:
    """``call.payload`` of a stream request is its first part: a middleware that replaces
    it, or adds one where none came, is heard; one that empties it drops it."""

    async def first_part(call: rpc.Call, call_next: Any) -> Any:
        if call.kind == "stream":
            call.payload = {"ten": b"10", "none": b""}.get(call.op, call.payload)
            call.op = "sum"
        return await call_next(call)

    scheme, query = FLAVOURS[flavour]
    reg = registry([])
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=reg, middleware=[first_part]) as srv:
        url = f"{scheme}://127.0.0.1:{srv.url.port}{query}"
        async with rpc.connect(url, registry=rpc.Registry(), reconnect=False) as peer:
            assert [x async for x in peer.stream("ten", parts=[1, 2, 3])] == [[15, "sum"]]
            assert [x async for x in peer.stream("ten", parts=[])] == [[10, "sum"]]
            assert [x async for x in peer.stream("none", parts=[1, 2, 3])] == [[5, "sum"]]
            assert [x async for x in peer.stream("sum", parts=[1, 2, 3])] == [[6, "sum"]]


@pytest.mark.parametrize("passes", ["the call", "a copy"])
async def test_a_client_stream_left_early_is_forgotten_whatever_call_the_chain_sent(
    flavour: str, passes: str
) -> None:
    """A client middleware that passes call_next a copy of the call: a stream left after 3
    results is forgotten all the same (the server told, its handler ended; our hold on the
    connection ended). Before, only the outer call's id was forgotten, which a copy never
    gets: the stream's results held the connection until its 30-s item_timeout."""
    scheme, query = FLAVOURS[flavour]
    reg = rpc.Registry()
    ended = asyncio.Event()

    @reg.handle("endless")
    async def endless(_: Any) -> AsyncIterator[int]:
        try:
            number = 0
            while True:
                yield number
                number += 1
                await asyncio.sleep(0)
        finally:
            ended.set()

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    async def copying(call: rpc.Call, call_next: Any) -> Any:
        return await call_next(dataclasses.replace(call) if passes == "a copy" else call)

    options = rpc.Options(middleware=(copying,), max_stream_queue=8)
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=reg) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        async with rpc.connect(url, options=options, reconnect=False) as peer:
            results = peer.stream("endless", value=0, item_timeout=30)
            assert [await anext(results) for _ in range(3)] == [0, 1, 2]
            await results.aclose()
            assert not peer._calls and not peer._stream_hold.active
            assert await peer.request("echo", "after", timeout=5) == "after"
            if flavour != "chatter-legacy":  # the legacy dialect has no cancel to tell it
                await asyncio.wait_for(ended.wait(), 5)
