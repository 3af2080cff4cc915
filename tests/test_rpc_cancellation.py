"""Cancellation reaches the server: the peerwire extension on Gotalk and Chatter."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import served, wait_until
from tests.test_rpc_timeout_default import raw_gotalk_server
from wire import gotalk

pytestmark = pytest.mark.timeout(30)


def waiting_registry(started: asyncio.Event, cancelled: asyncio.Event) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("wait")
    async def wait(_: object = None) -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    @reg.handle("echo")
    def echo(value: object) -> object:
        return value

    return reg


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_client_timeout_cancels_the_handler(flavour: str) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()
    async with served(flavour, waiting_registry(started, cancelled)) as (server, peer):
        assert await peer.request("echo", 1) == 1  # the announcement has been answered
        assert peer.adapter.cancels
        with pytest.raises(rpc.RequestTimeout):
            await peer.request("wait", timeout=0.2)
        await asyncio.wait_for(cancelled.wait(), 5)
        [server_peer] = server.peers
        await wait_until(lambda: not server_peer._running and server_peer.handlers_running == 0)
        assert await peer.request("echo", 2) == 2


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_cancelled_caller_cancels_the_handler(flavour: str) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()
    async with served(flavour, waiting_registry(started, cancelled)) as (_server, peer):
        call = asyncio.create_task(peer.request("wait", timeout=30))
        await asyncio.wait_for(started.wait(), 5)
        call.cancel()
        await asyncio.wait_for(cancelled.wait(), 5)
        assert await peer.request("echo", 3) == 3


async def test_legacy_dialect_has_no_extension() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()
    async with served("chatter-legacy", waiting_registry(started, cancelled)) as (server, peer):
        assert await peer.request("echo", 1) == 1
        assert not peer.adapter.cancels
        [server_peer] = server.peers
        assert not server_peer.adapter.cancels


async def test_extension_off_when_the_client_opts_out() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=waiting_registry(started, cancelled)
    ) as server:
        async with rpc.connect(
            str(server.url), registry=rpc.Registry(), extensions=False, reconnect=False
        ) as peer:
            assert await peer.request("echo", 1) == 1
            assert not peer.adapter.cancels
            with pytest.raises(rpc.RequestTimeout):
                await peer.request("wait", timeout=0.2)
            assert started.is_set()
            # a cancel written with the timeout would have been read before this request
            assert await peer.request("echo", 2) == 2
            [server_peer] = server.peers
            assert server_peer.handlers_running == 1  # nobody told the server: the handler runs on
            assert not cancelled.is_set()


async def test_a_retry_result_is_not_followed_by_a_cancel() -> None:
    """A retry result answers the request: the client sends it again, and no cancel for
    the answered one (the server would only drop it)."""
    async with raw_gotalk_server(b"1") as (url, accepted, _):
        async with rpc.connect(url, registry=rpc.Registry(), reconnect=False) as peer:
            raw = await accepted.get()
            call = asyncio.ensure_future(peer.request("echo", 1, timeout=5))
            first = await raw.next()
            assert isinstance(first, gotalk.Request)
            raw.write(gotalk.RetryResult(first.id, 1, b"busy"))
            again = await raw.next()  # what the client writes next: the request, no cancel
            assert isinstance(again, gotalk.Request) and again.id != first.id
            raw.write(gotalk.Result(again.id, b"7"))
            assert await call == 7


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_cancel_reaches_a_handler_behind_middleware(flavour: str) -> None:
    """Calls served through middleware are cancelled like the others, and a streamed
    result behind middleware stops when its caller leaves."""
    started, cancelled = asyncio.Event(), asyncio.Event()
    reg = waiting_registry(started, cancelled)
    seen: list[str] = []

    @reg.use
    async def observe(call: rpc.Call, call_next):
        try:
            return await call_next(call)
        except asyncio.CancelledError:
            seen.append(call.op)
            raise

    parts_stopped = asyncio.Event()

    @reg.handle("parts")
    async def parts(_: object = None):
        try:
            for i in range(1_000_000):
                yield i
                await asyncio.sleep(0)  # a producer that keeps going until stopped
        finally:
            parts_stopped.set()

    async with served(flavour, reg) as (server, peer):
        assert await peer.request("echo", 1) == 1  # the announcement has been answered
        call = asyncio.create_task(peer.request("wait"))
        await asyncio.wait_for(started.wait(), 5)
        call.cancel()
        await asyncio.wait_for(cancelled.wait(), 5)
        assert seen == ["wait"]
        [server_peer] = server.peers
        await wait_until(lambda: not server_peer._running and server_peer.handlers_running == 0)

        stream = peer.stream("parts", value=None)
        assert await anext(stream) == 0
        await stream.aclose()  # we leave: the peer is told, the producer stops
        await asyncio.wait_for(parts_stopped.wait(), 5)
        await wait_until(lambda: not server_peer._running and server_peer.handlers_running == 0)
        assert await peer.request("echo", 2) == 2


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_handler_waiting_for_parts_is_cancelled_then_freed(flavour: str) -> None:
    """A stream handler waiting for its request's next part: the caller giving up
    cancels it, its state goes, a late part is dropped, and the connection serves on;
    when the connection drops, a handler waiting for parts is cancelled too, and the caller,
    whose part source stalls, gets ConnectionClosed at once."""
    waiting = asyncio.Queue[str]()
    cancelled = asyncio.Queue[str]()
    reg = rpc.Registry()

    @reg.handle_stream("collect")
    async def collect(parts) -> list[str]:
        got = []
        try:
            async for part in parts:
                got.append(part)
                waiting.put_nowait(part)
        except asyncio.CancelledError:
            cancelled.put_nowait(",".join(got))
            raise
        return got

    @reg.handle("echo")
    def echo(value: object) -> object:
        return value

    gate = asyncio.Event()

    async def parts(tag: str):
        yield tag
        await gate.wait()
        yield "late"

    async with served(flavour, reg) as (server, peer):
        assert await peer.request("echo", 1) == 1  # the announcement has been answered
        call = asyncio.create_task(anext(peer.stream("collect", parts=parts("first"))))
        assert await asyncio.wait_for(waiting.get(), 5) == "first"
        call.cancel()
        assert await asyncio.wait_for(cancelled.get(), 5) == "first"
        [server_peer] = server.peers
        await wait_until(lambda: not server_peer._streams and server_peer.handlers_running == 0)
        assert await peer.request("echo", 2) == 2

        dropped = asyncio.create_task(anext(peer.stream("collect", parts=parts("second"))))
        assert await asyncio.wait_for(waiting.get(), 5) == "second"
        server_peer.transport.abort()  # the connection drops while the handler waits
        assert await asyncio.wait_for(cancelled.get(), 5) == "second"
        with pytest.raises(rpc.ConnectionClosed):  # the caller's source stalls: not waited for
            await asyncio.wait_for(dropped, 5)


async def _pass_through(call: rpc.Call, call_next: Any) -> Any:
    return await call_next(call)


async def test_a_stream_given_up_on_in_the_legacy_dialect_ends_its_handlers_parts() -> None:
    """The legacy dialect has no cancellation: a stream request given up on while it still
    sends parts is ended instead (its End, the conversation's last), so that the handler
    there gets the end of its parts and its slot comes free. Before, it waited for parts
    for as long as the connection lasted (found by helper-100's hunt)."""
    waiting = asyncio.Queue[str]()
    ended = asyncio.Queue[list[str]]()
    reg = rpc.Registry()

    @reg.handle_stream("collect")
    async def collect(parts) -> list[str]:
        got = []
        async for part in parts:
            got.append(part)
            waiting.put_nowait(part)
        ended.put_nowait(got)
        return got

    reg.handle("echo")(lambda value: value)
    gate = asyncio.Event()

    async def parts():
        yield "first"
        await gate.wait()
        yield "late"

    async with served("chatter-legacy", reg) as (server, peer):
        assert not peer.adapter.cancels
        call = asyncio.create_task(anext(peer.stream("collect", parts=parts())))
        assert await asyncio.wait_for(waiting.get(), 5) == "first"
        call.cancel()
        assert await asyncio.wait_for(ended.get(), 5) == ["first"]
        [server_peer] = server.peers
        await wait_until(lambda: server_peer.handlers_running == 0)
        assert await peer.request("echo", 2) == 2


@pytest.mark.parametrize("path", ["plain", "middleware", "deadline", "cancel-on-record"])
async def test_a_stalled_part_source_ends_with_connection_closed(path: str) -> None:
    """The connection drops while our stream request waits for its source's next part:
    ConnectionClosed at once, on every path (middleware, a whole-stream deadline, a task
    that caught an earlier cancel of its own without uncancelling it), and the task is
    left with exactly the cancels it had before."""
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle_stream("collect")
    async def collect(parts: Any) -> list[Any]:
        got = []
        async for part in parts:
            got.append(part)
            started.set()
        return got

    async def stalling():
        yield 1
        await asyncio.Event().wait()
        yield 2

    options = rpc.Options(middleware=(_pass_through,)) if path == "middleware" else None
    timeout = 30 if path == "deadline" else None

    async def send() -> tuple[type[BaseException], int]:
        task = asyncio.current_task()
        assert task is not None
        if path == "cancel-on-record":
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # caught, not uncancelled:
                await asyncio.sleep(10)  # one cancel stays on record
        before = task.cancelling()
        try:
            await anext(peer.stream("collect", parts=stalling(), timeout=timeout))
        except BaseException as exc:
            return type(exc), task.cancelling() - before
        return type(None), 0

    async with served("gotalk", reg, client_options=options) as (server, peer):
        sending = asyncio.create_task(send())
        await asyncio.wait_for(started.wait(), 5)
        [server_peer] = server.peers
        server_peer.transport.abort()
        kind, cancels_added = await asyncio.wait_for(sending, 5)
    assert kind is rpc.ConnectionClosed and cancels_added == 0


async def test_a_first_part_after_the_connection_dropped_is_not_sent() -> None:
    """The connection drops while the source makes the first part (nothing sent yet): once
    it comes, the stream raises ConnectionClosed rather than sending into a closed
    connection and waiting for a result until its timeout."""
    asked, go_on = asyncio.Event(), asyncio.Event()

    async def late_first():
        asked.set()
        await go_on.wait()
        yield 1

    async with served("gotalk", rpc.Registry()) as (server, peer):
        sending = asyncio.create_task(anext(peer.stream("collect", parts=late_first())))
        await asyncio.wait_for(asked.wait(), 5)
        [server_peer] = server.peers
        server_peer.transport.abort()
        await wait_until(lambda: not peer.is_open)
        go_on.set()
        with pytest.raises(rpc.ConnectionClosed):
            await asyncio.wait_for(sending, 5)


def self_cancelling_registry() -> rpc.Registry:
    """Handlers that end in a CancelledError of their own: they await what another task
    cancelled (a shared future), which no caller asked for."""
    reg = rpc.Registry()

    async def cancelled_elsewhere() -> None:
        shared = asyncio.get_running_loop().create_future()
        shared.cancel()
        await shared

    @reg.handle("flaky")
    async def flaky(_: object = None) -> str:
        await cancelled_elsewhere()
        return "never"

    @reg.handle("flaky_stream")
    async def flaky_stream(_: object = None):
        yield 1
        await cancelled_elsewhere()

    @reg.handle("echo")
    def echo(value: object) -> object:
        return value

    return reg


async def _pass_through(call: rpc.Call, call_next: Any) -> Any:
    return await call_next(call)


@pytest.mark.both_loops
@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
@pytest.mark.parametrize("extensions", [True, False])
@pytest.mark.parametrize("middleware", [False, True])
async def test_a_handlers_own_cancellation_is_an_error_result(
    flavour: str, extensions: bool, middleware: bool
) -> None:
    """A handler ending in a CancelledError of its own is answered at once with an error
    result that does not blame the caller, as any exception; the connection goes on.
    Before, a caller that took the cancellation extension got no answer at all (its
    timeout), and one that did not got "cancelled by the caller"."""
    options = rpc.Options(middleware=(_pass_through,)) if middleware else None
    async with served(
        flavour, self_cancelling_registry(), options=options, extensions=extensions
    ) as (_, peer):
        with pytest.raises(rpc.RemoteError, match="not by its caller"):
            await peer.request("flaky", timeout=10)
        got = []
        with pytest.raises(rpc.RemoteError, match="not by its caller"):
            async for item in peer.stream("flaky_stream", item_timeout=10):
                got.append(item)
        assert got == [1]
        assert await peer.request("echo", "after") == "after"


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_streamed_result_that_never_waits_can_be_cancelled(flavour: str) -> None:
    """A handler's generator that never awaits still gives the loop a turn every few
    hundred parts: the caller's cancel reaches it at once, and another connection is
    served meanwhile (before, the loop was the generator's until its output backed up:
    seconds, and over a fast reader for good)."""
    stopped = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("firehose")
    async def firehose(_: object = None):
        try:
            number = 0
            while True:
                yield number  # no await: it never waits
                number += 1
        finally:
            stopped.set()

    @reg.handle("echo")
    def echo(value: object) -> object:
        return value

    async with served(flavour, reg) as (server, peer):
        results = peer.stream("firehose")
        assert [await anext(results) for _ in range(3)] == [0, 1, 2]
        scheme = "tcp+gotalk" if flavour == "gotalk" else "tcp+sbs"
        other_url = f"{scheme}://127.0.0.1:{server.url.port}"
        async with rpc.connect(other_url, registry=rpc.Registry(), reconnect=False) as other:
            assert await other.request("echo", "served", timeout=2) == "served"
        await results.aclose()
        await asyncio.wait_for(stopped.wait(), 2)


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_coroutine_handler_that_returned_is_no_longer_cancellable(flavour: str) -> None:
    """A request leaves the cancellable set when its coroutine handler returns, single or
    stream request alike: a connection's set holds only what runs (no key is kept for the
    connection's life). Reads the set itself: the keys are the protocol's, which the
    client's calls do not expose (found in review 201: no test failed without the
    discard)."""
    reg = rpc.Registry()

    @reg.handle("double")
    async def double(value: int) -> int:
        return 2 * value

    @reg.handle_stream("total")
    async def total(parts: AsyncIterator[int]) -> int:
        return sum([part async for part in parts])

    async with served(flavour, reg) as (server, peer):
        assert await peer.request("double", 1) == 2  # the announcement has been answered
        [server_peer] = server.peers
        assert peer.adapter.cancels and server_peer.adapter.cancels
        assert await peer.request("double", 2) == 4
        assert [x async for x in peer.stream("total", parts=[1, 2, 3])] == [6]
        assert not server_peer._running
