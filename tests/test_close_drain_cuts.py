"""A graceful close says what it cut: work still running when its drain ended."""

from __future__ import annotations

import asyncio
import logging

import pytest

import rpc
from tests.rpc_helpers import wait_until

pytestmark = pytest.mark.both_loops


async def test_a_close_that_cuts_a_handler_past_its_drain_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, calls cut by a server's close were never logged (``peerwire serve`` stops
    with ``server.close()``): an operator could not tell a clean stop from one that
    dropped work in flight."""
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(_value: object) -> None:
        started.set()
        await asyncio.Event().wait()  # never ends by itself

    @reg.handle("quick")
    async def quick(value: object) -> object:
        return value

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            assert await client.request("quick", 1) == 1  # done before the close: not cut
            call = asyncio.ensure_future(client.request("hold", None, timeout=30))
            await asyncio.wait_for(started.wait(), 5)
            with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
                await server.close(drain_timeout=0.2)
            with pytest.raises(rpc.ConnectionClosed):
                await asyncio.wait_for(call, 5)
    [cut] = [r.getMessage() for r in caplog.records if "drain are cut" in r.getMessage()]
    assert "1 handler(s) and 0 call(s) of ours still running after the 0.2-s drain" in cut


async def test_a_close_that_drains_everything_cuts_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: object) -> object:
        started.set()
        await asyncio.sleep(0.05)  # the handler's work, which the drain waits for
        return value

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            call = asyncio.ensure_future(client.request("slow", 2, timeout=30))
            await asyncio.wait_for(started.wait(), 5)  # running: the drain waits for it
            with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
                await server.close(drain_timeout=5)
            assert await asyncio.wait_for(call, 5) == 2
    assert not [r for r in caplog.records if "drain are cut" in r.getMessage()]


async def test_a_close_that_cuts_says_what_it_kept_unrun(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Requests read before the close and kept for a handler slot (a peer without retry
    results, ``max_concurrent=1``) that never frees: the drain's end drops them unrun, and
    the warning counts them. It named only the handler, so an operator could not tell
    that requests had been read and dropped too."""
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(value: object) -> None:
        started.set()
        await asyncio.Event().wait()  # never ends by itself

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False, options=options
    ) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            calls = [asyncio.ensure_future(client.request("hold", i, timeout=30)) for i in range(3)]
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            await wait_until(lambda: len(served._backlog) == 2)  # kept: the slot is taken
            with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
                await server.close(drain_timeout=0.2)
            for call in calls:
                with pytest.raises(rpc.ConnectionClosed):
                    await asyncio.wait_for(call, 5)
    [cut] = [r.getMessage() for r in caplog.records if "drain are cut" in r.getMessage()]
    assert "1 handler(s) and 0 call(s) of ours still running after the 0.2-s drain" in cut
    assert cut.endswith(", 2 message(s) read and kept unrun dropped"), cut


async def test_a_close_from_a_handler_does_not_count_that_handler_as_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The handler that called ``close()`` is not counted as cut: the drain itself does
    not wait for it (``drain`` leaves the closers out). 0e76601 counted every job of the
    runner, so one handler left running past the drain was told as two (review 174)."""
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(_value: object) -> None:
        started.set()
        await asyncio.Event().wait()  # never ends by itself

    @reg.handle("shutdown")
    async def shutdown(_value: object) -> None:
        await rpc.current_peer.get().close(drain_timeout=0.2)

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            held = asyncio.ensure_future(client.request("hold", None, timeout=30))
            await asyncio.wait_for(started.wait(), 5)
            with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
                with pytest.raises(rpc.ConnectionClosed):
                    await asyncio.wait_for(client.request("shutdown", None, timeout=30), 5)
            with pytest.raises(rpc.ConnectionClosed):
                await asyncio.wait_for(held, 5)
    [cut] = [r.getMessage() for r in caplog.records if "drain are cut" in r.getMessage()]
    assert "1 handler(s) and 0 call(s) of ours still running after the 0.2-s drain" in cut
