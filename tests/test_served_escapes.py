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
import textwrap
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import pytest

import rpc
from rpc import loops
from tests.rpc_helpers import FLAVOURS, child_report, served

pytestmark = pytest.mark.timeout(60)

PATIENT = 20.0
T = TypeVar("T")
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


def run_past_an_interrupt(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``scenario()`` on a loop of its own (the one ``--loop`` chose): it must leave
    ``run_until_complete`` with a KeyboardInterrupt first (a handler's, passed on), then
    end when the loop is run again; what it returned."""
    loop = loops.new_event_loop(os.environ.get(loops.ENV_VAR) or "asyncio")
    main = loop.create_task(scenario())
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main)
        assert not main.done()
        return loop.run_until_complete(main)
    finally:
        if not main.done():
            main.cancel()
            with contextlib.suppress(BaseException):  # what it ended in: reported above
                loop.run_until_complete(main)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


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

    assert run_past_an_interrupt(scenario) == ("KeyboardInterrupt", "ok")


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

    assert run_past_an_interrupt(scenario) == ("KeyboardInterrupt", "ok")


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

    assert run_past_an_interrupt(scenario) == ["stop", "stop_async", "interrupt"]
    assert seen == ["stop", "stop_async", "interrupt"]
    escaped = [r for r in caplog.records if "not an Exception" in r.getMessage()]
    assert [r.exc_info[0] for r in escaped if r.exc_info] == [Stop, Stop, KeyboardInterrupt]


TWO_INTERRUPTS = textwrap.dedent(
    """
    import asyncio, json, sys
    import rpc
    from rpc import loops
    from wire.gotalk import VERSION, Notification, Request, encode

    registry = rpc.Registry()

    @registry.handle("interrupt")
    def interrupt(_=None):  # a plain function: run in the peer's read
        raise KeyboardInterrupt

    @registry.handle_notification("interrupted")
    def interrupted(_=None):
        raise KeyboardInterrupt

    report = {"cleanup": False}
    count = int(sys.argv[1])
    kind = sys.argv[2]

    def message(i):
        if kind == "request":
            return encode(Request(b"%04d" % i, "interrupt", b"null"))
        return encode(Notification("interrupted", b"null"))

    async def main():
        try:
            async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry) as server:
                _, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
                writer.write(VERSION + b"".join(message(i) for i in range(count)))  # one read
                await asyncio.Event().wait()  # until the KeyboardInterrupt
        finally:  # asyncio.run cancels main after a KeyboardInterrupt: this runs
            report["cleanup"] = True

    try:
        loops.run(main())
    except KeyboardInterrupt:
        report["raised"] = "KeyboardInterrupt"
    print(json.dumps(report), flush=True)
    """
)


@pytest.mark.parametrize("kind", ["request", "notification"])
@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_two_keyboard_interrupts_in_one_read_leave_asyncio_run_once(
    loop: str, count: int, kind: str
) -> None:
    """Each plain handler's KeyboardInterrupt was passed on from a callback of its own
    (b15b8cc, da2e3c0). With two in one read (two requests, or notifications, sent
    together), the first left asyncio.run's run_until_complete and the second fired inside
    its clean-up (while it cancels what is left), before the tasks it cancels ran: main's
    ``finally`` (closing the server and its connections) never ran, tasks were destroyed
    pending (asyncio; helper-144's review). One waits per loop now (rpc.escapes)."""
    report = child_report(TWO_INTERRUPTS, loop, str(count), kind)
    assert report == {"cleanup": True, "raised": "KeyboardInterrupt"}, report


@pytest.mark.both_loops
async def test_a_peers_notifications_failing_with_a_base_exception_are_logged_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler's failure is logged at most 20 per 10 s, as a peer can send what makes a
    handler fail; a BaseException that is not an Exception was logged always, with its
    traceback (da2e3c0, c4f8a7e): a peer sending such notifications by the thousand wrote
    as many error records. Now rate-limited the same way (rpc.escapes; helper-144)."""
    seen: list[object] = []
    registry = rpc.Registry()

    @registry.handle_notification("stop")
    def stop(value: Any = None) -> None:  # a plain function: run in the peer's read
        seen.append(value)
        raise Stop

    @registry.handle("ok")
    def ok(value: Any) -> Any:
        return value

    async with served("gotalk", registry) as (_server, peer):
        for i in range(200):
            peer.notify("stop", i)
        assert await peer.request("ok", "after", timeout=10) == "after"  # all were read
    assert seen == list(range(200))  # the premise: each ran and raised
    logged = [r for r in caplog.records if "not an Exception" in r.getMessage()]
    assert len(logged) <= 20, len(logged)
    # each record names where it was raised from (the notification's dispatch), not the
    # logging helper (rpc.escapes.report) every one goes through
    assert {(r.module, r.funcName) for r in logged} == {("notifications", "run_notification")}
