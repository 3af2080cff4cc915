"""A handler or middleware that raises a BaseException that is not an Exception (a
``class Stop(BaseException)``): its caller gets an error result at once and the connection
serves on; the peer logs it. Before, it ended the handler runner's worker (the caller
waited for its timeout) or, from a plain function, the connection. KeyboardInterrupt is
answered too, then leaves the loop's run as asyncio lets it; the loop run again serves on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from rpc import loops
from tests.rpc_helpers import FLAVOURS, served

pytestmark = pytest.mark.timeout(60)

PATIENT = 20.0
"""The callers' timeout: an answer must come long before it."""


class Stop(BaseException):
    """Not an Exception: meant to stop more than one call."""


def registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("plain")
    def plain(_: Any = None) -> None:
        raise Stop("plain stop")

    @reg.handle("coro")
    async def coro(_: Any = None) -> None:
        raise Stop("coro stop")

    @reg.handle("waited")
    async def waited(_: Any = None) -> None:
        await asyncio.sleep(0.01)  # the handler's own work: it holds its worker meanwhile
        raise Stop("waited stop")

    @reg.handle("streamed")
    async def streamed(_: Any = None) -> AsyncIterator[int]:
        yield 1
        raise Stop("streamed stop")

    @reg.handle_stream("parts")
    async def parts(items: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in items:
            yield item
            raise Stop("parts stop")

    @reg.handle("ok")
    def ok(_: Any = None) -> str:
        return "ok"

    @reg.handle("ok_async")
    async def ok_async(_: Any = None) -> str:
        return "ok"

    return reg


async def stopping_middleware(call: rpc.Call, call_next: Any) -> Any:
    if call.op == "halt":  # no such handler: the middleware answers it, with a Stop
        raise Stop("middleware stop")
    return await call_next(call)


async def answers(peer: rpc.Peer, timeout: float | None) -> list[str]:
    """Each op's error result, every call answered within ``PATIENT`` / 2."""
    seen = []
    async with asyncio.timeout(PATIENT / 2):
        for op in ("plain", "coro", "waited"):
            with pytest.raises(rpc.RemoteError) as info:
                await peer.request(op, timeout=timeout)
            seen.append(str(info.value))
        with pytest.raises(rpc.RemoteError) as info:
            async for item in peer.stream("streamed", timeout=timeout):
                assert item == 1
        seen.append(str(info.value))
        with pytest.raises(rpc.RemoteError) as info:
            async for item in peer.stream("parts", parts=["a"], timeout=timeout):
                assert item == "a"
        seen.append(str(info.value))
        # the connection serves on: a plain function and a coroutine, each with a worker
        assert await peer.request("ok", timeout=timeout) == "ok"
        assert await peer.request("ok_async", timeout=timeout) == "ok"
    return seen


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
@pytest.mark.parametrize("timeout", [None, PATIENT], ids=["no-deadline", "deadline"])
async def test_a_base_exception_is_answered_at_once(
    flavour: str, timeout: float | None, caplog: pytest.LogCaptureFixture
) -> None:
    """``deadline``: the caller's time left goes with each call (request metadata), so a
    coroutine handler's request takes the bounded path (Responder.serve_bounded) and a
    streamed result's the middleware path's."""
    with caplog.at_level(logging.ERROR, logger="peerwire.rpc"):
        async with served(flavour, registry()) as (server, peer):
            seen = await answers(peer, timeout)
            assert [p.handlers_running for p in server.peers] == [0]
    assert seen == ["plain stop", "coro stop", "waited stop", "streamed stop", "parts stop"]
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is Stop]
    assert len(logged) == 5, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_middleware_raising_a_base_exception_is_answered_at_once(
    flavour: str, caplog: pytest.LogCaptureFixture
) -> None:
    options = rpc.Options(middleware=[stopping_middleware])
    with caplog.at_level(logging.ERROR, logger="peerwire.rpc"):
        async with served(flavour, registry(), options=options) as (server, peer):
            async with asyncio.timeout(PATIENT / 2):
                with pytest.raises(rpc.RemoteError, match="middleware stop"):
                    await peer.request("halt", timeout=PATIENT)
                with pytest.raises(rpc.RemoteError, match="middleware stop"):
                    await peer.request("halt")
                seen = await answers(peer, PATIENT)  # handlers under middleware too
            assert [p.handlers_running for p in server.peers] == [0]
    assert seen == ["plain stop", "coro stop", "waited stop", "streamed stop", "parts stop"]
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is Stop]
    assert len(logged) == 7, [r.getMessage() for r in caplog.records]


def interrupting_registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("interrupt")
    async def interrupt(_: Any = None) -> None:
        raise KeyboardInterrupt

    @reg.handle("interrupt_plain")
    def interrupt_plain(_: Any = None) -> None:  # a plain function: run in the peer's read
        raise KeyboardInterrupt

    @reg.handle("ok")
    async def ok(_: Any = None) -> str:
        return "ok"

    @reg.handle("ok_plain")
    def ok_plain(_: Any = None) -> str:
        return "ok"

    return reg


@pytest.mark.parametrize("timeout", [None, PATIENT], ids=["no-deadline", "deadline"])
def test_keyboard_interrupt_is_answered_then_leaves_the_loops_run(timeout: float | None) -> None:
    """A coroutine handler's KeyboardInterrupt leaves ``run_until_complete`` (as asyncio
    lets one leave a task), after its caller was answered: the loop run again, the caller
    has its error result and the connection serves on (before, the caller waited for its
    timeout: the worker had ended unanswered)."""
    url = FLAVOURS["gotalk"][0] + "://127.0.0.1:0"

    async def scenario() -> tuple[str, str]:
        async with rpc.serve(url, registry=interrupting_registry()) as server:
            async with rpc.connect(str(server.url), reconnect=False) as peer:
                async with asyncio.timeout(PATIENT / 2):
                    with pytest.raises(rpc.RemoteError) as info:
                        await peer.request("interrupt", timeout=timeout)
                    return str(info.value), await peer.request("ok", timeout=timeout)

    loop = loops.new_event_loop(os.environ.get(loops.ENV_VAR) or "asyncio")
    try:
        main = loop.create_task(scenario())
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main)
        assert not main.done()
        assert loop.run_until_complete(main) == ("KeyboardInterrupt", "ok")
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
def test_plain_function_keyboard_interrupt_is_answered_and_serves_on(flavour: str) -> None:
    """A plain function's KeyboardInterrupt: its caller has its error result, then it
    leaves ``run_until_complete``; the loop run again serves on. Before, it was raised in
    the peer's read, between the outbox's hold and its release: on asyncio the outbox
    stayed held (the error result and every answer after it never written, the caller
    waited for its timeout), on uvloop the transport took it for a failure and closed."""
    scheme, query = FLAVOURS[flavour]

    async def scenario() -> tuple[str, str]:
        registry = interrupting_registry()
        async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=registry) as server:
            url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
            async with rpc.connect(url, reconnect=False) as peer:
                async with asyncio.timeout(PATIENT / 2):
                    with pytest.raises(rpc.RemoteError) as info:
                        await peer.request("interrupt_plain", timeout=PATIENT)
                    return str(info.value), await peer.request("ok_plain", timeout=PATIENT)

    loop = loops.new_event_loop(os.environ.get(loops.ENV_VAR) or "asyncio")
    try:
        main = loop.create_task(scenario())
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main)
        assert not main.done()
        assert loop.run_until_complete(main) == ("KeyboardInterrupt", "ok")
    finally:
        if not main.done():
            main.cancel()
            with contextlib.suppress(BaseException):  # what it ended in: reported above
                loop.run_until_complete(main)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _notified_registry(seen: list[str]) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle_notification("stop")
    def stop(_: Any = None) -> None:  # a plain function: run in the peer's read
        raise Stop

    @reg.handle_notification("interrupt")
    def interrupt(_: Any = None) -> None:
        raise KeyboardInterrupt

    @reg.handle_notification("stop_async")
    async def stop_async(_: Any = None) -> None:
        raise Stop

    @reg.handle("ok")
    def ok(value: Any) -> Any:
        seen.append(value)
        return value

    return reg


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
def test_a_notification_handlers_base_exception_stops_it_not_the_connection(
    flavour: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain notification handler's Stop (a BaseException, not an Exception) and
    KeyboardInterrupt were raised in the peer's read, between the outbox's hold and its
    release: on asyncio every later answer stayed unwritten (the caller of ``ok`` waited
    for its timeout), on uvloop the transport took it for a failure and closed. Now Stop
    is logged and stops there; KeyboardInterrupt leaves ``run_until_complete`` after the
    read, and the loop run again serves on."""
    scheme, query = FLAVOURS[flavour]
    seen: list[str] = []

    async def scenario() -> list[object]:
        async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=_notified_registry(seen)) as s:
            url = f"{scheme}://127.0.0.1:{s.url.port}{query}"
            async with rpc.connect(url, reconnect=False) as peer:
                async with asyncio.timeout(PATIENT / 2):
                    answers: list[object] = []
                    for name in ("stop", "stop_async", "interrupt"):
                        peer.notify(name)
                        answers.append(await peer.request("ok", name, timeout=PATIENT))
                    return answers

    loop = loops.new_event_loop(os.environ.get(loops.ENV_VAR) or "asyncio")
    try:
        main = loop.create_task(scenario())
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main)
        assert not main.done()
        assert loop.run_until_complete(main) == ["stop", "stop_async", "interrupt"]
    finally:
        if not main.done():
            main.cancel()
            with contextlib.suppress(BaseException):  # what it ended in: reported above
                loop.run_until_complete(main)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    assert seen == ["stop", "stop_async", "interrupt"]
    escaped = [r for r in caplog.records if "not an Exception" in r.getMessage()]
    assert [r.exc_info[0] for r in escaped if r.exc_info] == [Stop, Stop, KeyboardInterrupt]
