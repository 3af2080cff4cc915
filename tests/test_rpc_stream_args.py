"""``Peer.stream``'s arguments: keyword-only ``parts`` / ``value``, ``timeout`` a deadline for
the whole stream (as in ``request``), ``item_timeout`` the wait for each next result, and the
deprecated positional form; on the plain path and through client middleware."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import served


async def passthrough(call: rpc.Call, call_next: Any) -> Any:
    return await call_next(call)


PATHS = {"plain": None, "middleware": rpc.Options(middleware=(passthrough,))}
pytestmark = pytest.mark.parametrize("path", list(PATHS))


def make_registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    @reg.handle("tick")
    async def tick(params: dict) -> AsyncIterator[int]:
        """``n`` results, ``ms`` milliseconds apart."""
        for i in range(params["n"]):
            await asyncio.sleep(params["ms"] / 1000)
            yield i

    @reg.handle("one_then_stall")
    async def one_then_stall(_: Any) -> AsyncIterator[int]:
        yield 1
        await asyncio.Event().wait()

    @reg.handle_stream("sum")
    async def total(parts: AsyncIterator[int]) -> int:
        return sum([p async for p in parts])

    return reg


async def test_keywords(path: str) -> None:
    async with served("gotalk", make_registry(), client_options=PATHS[path]) as (_, peer):
        assert [x async for x in peer.stream("echo", value="one")] == ["one"]
        assert [x async for x in peer.stream("sum", parts=[1, 2, 3])] == [6]
        # a slow stream: each result within item_timeout, the whole within timeout
        ticks = peer.stream("tick", value={"n": 5, "ms": 20}, timeout=30, item_timeout=10)
        assert [x async for x in ticks] == [0, 1, 2, 3, 4]


async def test_positional_parts_and_value_are_deprecated(path: str) -> None:
    async with served("gotalk", make_registry(), client_options=PATHS[path]) as (_, peer):
        with pytest.warns(DeprecationWarning, match="parts= and value= as keywords"):
            assert [x async for x in peer.stream("sum", [1, 2, 3])] == [6]
        with pytest.warns(DeprecationWarning):
            assert [x async for x in peer.stream("echo", None, "two")] == ["two"]
        with pytest.raises(TypeError, match="as keywords"):
            [x async for x in peer.stream("sum", [1], parts=[2])]
        with pytest.raises(TypeError, match="as keywords"):
            [x async for x in peer.stream("echo", None, "a", value="b")]
        assert not peer._calls


async def test_timeout_is_a_deadline_for_the_whole_stream(path: str) -> None:
    """Results 30 ms apart, each well within ``item_timeout``: the stream still ends at its
    deadline, with the results that came before it."""
    async with served("gotalk", make_registry(), client_options=PATHS[path]) as (_, peer):
        got: list[int] = []
        with pytest.raises(rpc.RequestTimeout, match=r"tick: stream not done within 0\.2 s"):
            async for x in peer.stream(
                "tick", value={"n": 100, "ms": 30}, timeout=0.2, item_timeout=10
            ):
                got.append(x)
        assert got == list(range(len(got))) and len(got) < 100
        assert not peer._calls  # given up on: forgotten (and abandoned)
        assert await peer.request("echo", "after") == "after"


async def test_item_timeout_bounds_each_wait(path: str) -> None:
    async with served("gotalk", make_registry(), client_options=PATHS[path]) as (_, peer):
        got: list[int] = []
        with pytest.raises(rpc.RequestTimeout, match=r"one_then_stall: no result within 0\.1 s"):
            async for x in peer.stream("one_then_stall", item_timeout=0.1, timeout=30):
                got.append(x)
        assert got == [1]
        assert not peer._calls


async def test_deadline_covers_sending_the_parts(path: str) -> None:
    """A part source that stalls: the deadline ends the stream request, and its call is
    forgotten (before, a failure while sending parts left it in the peer's calls)."""

    never = asyncio.Event()

    async def stalling() -> AsyncIterator[int]:
        yield 1
        await never.wait()
        yield 2

    async with served("gotalk", make_registry(), client_options=PATHS[path]) as (_, peer):
        with pytest.raises(rpc.RequestTimeout, match=r"sum: stream not done within 0\.1 s"):
            [x async for x in peer.stream("sum", parts=stalling(), timeout=0.1)]
        assert not peer._calls
        assert await peer.request("echo", "after") == "after"


async def test_parts_as_one_str_or_bytes_is_refused(path: str) -> None:
    """``parts=b"..."`` would send a part per byte: a TypeError, before anything is sent."""
    async with served("gotalk", make_registry(), client_options=PATHS[path]) as (_, peer):
        for parts in ("ab", b"ab"):
            with pytest.raises(TypeError, match=r"parts: an iterable of parts, not a"):
                [x async for x in peer.stream("sum", parts=parts)]
        assert not peer._calls
        assert [x async for x in peer.stream("sum", parts=[1, 2])] == [3]


async def test_deadline_covers_parts_from_a_slow_iterable(path: str) -> None:
    """Parts from a plain iterable are taken as they come, without an await each, and the
    deadline still ends the stream request while it is sending them: the part made past
    the deadline is the last one taken."""
    loop = asyncio.get_running_loop()
    taken: list[int] = []

    def slow(past_deadline: float) -> Iterator[int]:
        for n in range(10):
            if n == 1:  # a source that blocks the loop until the stream's deadline passed
                time.sleep(max(0.0, past_deadline - loop.time()))
            taken.append(n)
            yield n

    async with served("gotalk", make_registry(), client_options=PATHS[path]) as (_, peer):
        parts = slow(loop.time() + 0.2)  # the deadline below is 0.12 s from the call
        with pytest.raises(rpc.RequestTimeout, match=r"sum: stream not done within 0\.12 s"):
            [x async for x in peer.stream("sum", parts=parts, timeout=0.12)]
        assert taken == [0, 1]  # no part taken past the deadline but the one made across it
        assert not peer._calls
        assert await peer.request("echo", "after") == "after"


def test_blocking_stream_arguments(path: str) -> None:
    ready = threading.Event()
    state: dict[str, Any] = {}

    def server_thread() -> None:
        async def main() -> None:
            state["loop"] = asyncio.get_running_loop()
            state["stop"] = stop = asyncio.Event()
            async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=make_registry()) as server:
                state["port"] = server.url.port
                ready.set()
                await stop.wait()

        asyncio.run(main())

    thread = threading.Thread(target=server_thread)
    thread.start()
    assert ready.wait(10)
    url = f"tcp+gotalk://127.0.0.1:{state['port']}"
    try:
        with rpc.blocking.connect(url, options=PATHS[path]) as peer:
            assert list(peer.stream("sum", parts=[1, 2])) == [3]
            with pytest.warns(DeprecationWarning):
                assert list(peer.stream("sum", [1, 2, 3])) == [6]
            with pytest.raises(rpc.RequestTimeout, match="stream not done"):
                list(peer.stream("tick", value={"n": 100, "ms": 30}, timeout=0.2))
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(10)
