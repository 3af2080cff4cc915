"""A request that arrives while its connection drains for a graceful close is refused
with a retry result ("not run"), not run and then cut: its caller may send it again
safely, and the reconnecting client does so on its next connection."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import served, wait_until

pytestmark = pytest.mark.both_loops

URLS = {
    "gotalk": "tcp+gotalk://127.0.0.1:0",
    "chatter": "tcp+sbs://127.0.0.1:0?dialect=HatChatter",
}


def _registry(runs: list[object], started: asyncio.Event, release: asyncio.Event) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(_value: object) -> str:
        started.set()
        await release.wait()
        return "held"

    @reg.handle("count")
    async def count(value: object) -> object:
        runs.append(value)
        await asyncio.sleep(0)  # a coroutine that suspends: a job the drain could wait for
        return value

    return reg


async def _refusing(client: rpc.Peer | rpc.ReconnectingPeer) -> None:
    """Wait until the server refuses new requests: a request whose timeout is shorter
    than the retry result's wait (``Options.retry_wait``, 0.5 s) gets RetryLater at once."""
    with pytest.raises(rpc.RetryLater) as refused:
        await asyncio.wait_for(client.request("count", "probe", timeout=0.3), 5)
    assert "closing" in str(refused.value)


async def _drain_holding(
    client: rpc.Peer | rpc.ReconnectingPeer, server: Any, started: asyncio.Event
) -> tuple[asyncio.Future[Any], asyncio.Future[None]]:
    """A ``hold`` call in flight, then the server's connection draining for a graceful
    close: the call and the close, both running."""
    held = asyncio.ensure_future(client.request("hold", None, timeout=30))
    await asyncio.wait_for(started.wait(), 5)
    [served] = server.peers
    closing = asyncio.ensure_future(served.close(drain_timeout=30))
    await wait_until(lambda: served.gave_up is not None)  # draining now
    return held, closing


@pytest.mark.parametrize("protocol", sorted(URLS))
async def test_a_request_arriving_during_the_drain_is_not_run(protocol: str) -> None:
    """Before, ``count`` ran during the drain, and its caller got ConnectionClosed once
    the connection closed under it, or its result: the side effect happened either way.
    Now a retry result answers it, and its caller, waiting to send it again, gets
    RetryLater once the connection closed."""
    runs: list[object] = []
    started, release = asyncio.Event(), asyncio.Event()
    async with rpc.serve(URLS[protocol], registry=_registry(runs, started, release)) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            held, closing = await _drain_holding(client, server, started)
            late = asyncio.ensure_future(client.request("count", 1, timeout=30))
            await _refusing(client)  # sent after late: late was refused before it
            release.set()  # the drain ends, the connection closes
            assert await asyncio.wait_for(held, 5) == "held"  # in flight before: waited for
            with pytest.raises(rpc.RetryLater, match="closing"):
                await asyncio.wait_for(late, 10)
            await asyncio.wait_for(closing, 10)
    assert runs == []


async def test_the_reconnecting_client_sends_a_refused_request_again() -> None:
    """A server restarted under a reconnecting client: an idempotent request it refused
    while draining runs once, on the new server (before, it ran on the old one, was cut
    by the close and was sent again: it ran twice)."""
    runs: list[object] = []
    started, release = asyncio.Event(), asyncio.Event()
    first = await rpc.serve(URLS["gotalk"], registry=_registry(runs, started, release))
    url = str(first.url)
    async with rpc.connect(url) as client:
        held = asyncio.ensure_future(client.request("hold", None, timeout=30))
        await asyncio.wait_for(started.wait(), 5)
        closing = asyncio.ensure_future(first.close(drain_timeout=30))
        await wait_until(lambda: all(p.gave_up is not None for p in first.peers))  # draining
        late = asyncio.ensure_future(client.request("count", 7, timeout=30, idempotent=True))
        await _refusing(client)
        release.set()
        assert await asyncio.wait_for(held, 5) == "held"
        await asyncio.wait_for(closing, 10)
        assert runs == []  # refused by the first server
        async with rpc.serve(url, registry=_registry(runs, asyncio.Event(), release)):
            assert await asyncio.wait_for(late, 20) == 7
    assert runs == [7]


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_our_close_runs_the_callbacks_our_calls_in_flight_need(flavour: str) -> None:
    """Our call ``outer`` is in flight when we close: close() waits for it, and runs
    ``inner``, the request the peer's handler of ``outer`` makes to us to answer it. On
    2693a44 ``inner`` was refused and ``outer`` failed with RetryLater ("not run", though
    it ran); refusing starts once no call of ours is in flight (helper-137's review)."""
    go = asyncio.Event()
    started = asyncio.Event()
    server_reg = rpc.Registry()

    @server_reg.handle("outer")
    async def outer(_: Any = None) -> Any:
        caller = rpc.current_peer.get()
        started.set()
        await go.wait()
        return await caller.request("inner", "x", timeout=10)

    client_reg = rpc.Registry()

    @client_reg.handle("inner")
    def inner(value: Any) -> Any:
        return f"inner {value}"

    async with served(
        flavour,
        server_reg,
        client_registry=client_reg,
        client_options=rpc.Options(retry_wait=0.01),  # the wait our refusals ask for
    ) as (_server, peer):
        call = asyncio.ensure_future(peer.request("outer", timeout=10))
        await asyncio.wait_for(started.wait(), 5)
        closing = asyncio.ensure_future(peer.close(drain_timeout=10))
        await wait_until(lambda: peer.gave_up is not None)  # draining now
        go.set()
        try:
            assert await asyncio.wait_for(call, 10) == "inner x"
        finally:
            await asyncio.wait_for(closing, 10)


async def test_a_refused_request_waits_for_the_close_not_its_retries() -> None:
    """A request the draining server refused waits for the connection to close, then goes
    to the next one. On 2693a44 its caller sent it again on the draining connection, each
    time refused; once ``retries`` (5) were spent, with the drain still going on, RetryLater
    went to the caller while the connection was open, and the reconnecting client did not
    send it again (with the defaults, any drain over 2.5-3.75 s; the server's
    ``retry_wait`` is short here to spend them quickly). Helper-137's review."""
    runs: list[object] = []
    refused: list[object] = []
    first_refusal = asyncio.Event()
    started, release = asyncio.Event(), asyncio.Event()

    async def counting(call: rpc.Call, call_next: Any) -> Any:
        try:
            return await call_next(call)
        except rpc.RetryLater:
            if call.op == "count":
                refused.append(call.payload)
                first_refusal.set()
            raise

    server_options = rpc.Options(retry_wait=0.02)
    first = await rpc.serve(
        URLS["gotalk"], registry=_registry(runs, started, release), options=server_options
    )
    url = str(first.url)
    async with rpc.connect(url, options=rpc.Options(middleware=[counting])) as client:
        held = asyncio.ensure_future(client.request("hold", None, timeout=30))
        await asyncio.wait_for(started.wait(), 5)
        closing = asyncio.ensure_future(first.close(drain_timeout=30))
        await wait_until(lambda: all(p.gave_up is not None for p in first.peers))  # draining
        late = asyncio.ensure_future(client.request("count", 7, timeout=30, idempotent=True))
        await asyncio.wait_for(first_refusal.wait(), 5)
        # the drain goes on for 0.5 s (the scenario, not a synchronisation): 5 retries at
        # 0.02-0.03 s would take 0.15 s at most
        await asyncio.sleep(0.5)
        release.set()
        assert await asyncio.wait_for(held, 5) == "held"
        await asyncio.wait_for(closing, 10)
        assert runs == [] and refused == [7]  # refused once: not sent again on it
        async with rpc.serve(url, registry=_registry(runs, asyncio.Event(), release)):
            assert await asyncio.wait_for(late, 20) == 7
    assert runs == [7]


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_request_run_while_our_call_is_in_flight_is_not_cut_by_the_drain(
    flavour: str,
) -> None:
    """While a call of ours is in flight, our close() runs the peer's requests (f3981df);
    its drain waited only for the handlers running when close() began and for our calls,
    so a request of the peer's unrelated to our call, started during the drain and
    outlasting our call, was cut at the close: its caller got ConnectionClosed though its
    handler ran (helper-144's review). The drain now waits for those too, within the same
    drain_timeout."""
    outer_go = asyncio.Event()
    send_side = asyncio.Event()
    side_results: list[object] = []
    runs: list[str] = []
    sides: list[asyncio.Future[None]] = []

    server_reg = rpc.Registry()

    @server_reg.handle("outer")
    async def outer(_: Any = None) -> Any:
        caller = rpc.current_peer.get()

        async def side() -> None:  # an unrelated request of the server's to the client
            try:
                side_results.append(await caller.request("side", "s", timeout=10))
            except Exception as exc:  # the test compares what happened
                side_results.append(type(exc).__name__)

        await send_side.wait()
        sides.append(asyncio.ensure_future(side()))
        await outer_go.wait()
        return "outer done"

    client_reg = rpc.Registry()
    side_release = asyncio.Event()

    @client_reg.handle("side")
    async def side_handler(value: Any) -> Any:
        runs.append(value)
        await side_release.wait()
        return f"side {value}"

    async with served(flavour, server_reg, client_registry=client_reg) as (_server, peer):
        call = asyncio.ensure_future(peer.request("outer", timeout=10))
        await wait_until(lambda: len(_server.peers) == 1)
        closing = asyncio.ensure_future(peer.close(drain_timeout=10))
        await wait_until(lambda: peer.gave_up is not None)  # draining now
        send_side.set()
        await wait_until(lambda: bool(runs or side_results))  # run, or refused
        outer_go.set()
        assert await asyncio.wait_for(call, 5) == "outer done"
        # a bound, not a synchronisation: a drain that waits for the side handler has
        # not ended within it (on the defect, the close cut the handler at once)
        await asyncio.wait([closing], timeout=1)
        side_release.set()
        await asyncio.wait_for(closing, 10)
        await wait_until(lambda: bool(side_results))
    # ran and answered, or refused and not run; never run and then cut
    assert (runs, side_results) in ((["s"], ["side s"]), ([], ["RetryLater"])), side_results


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_our_open_stream_does_not_keep_the_drain_running_requests(flavour: str) -> None:
    """A stream of ours still reading is not waited for by our close() (only single
    calls are), so it does not need the peer's requests answered either: while the drain
    waits (here for a handler of ours, ``hold``), those are refused as with no call in
    flight. Before, any call of ours in flight, a stream included, made the drain run
    them (helper-149's review)."""
    runs: list[object] = []
    started, release = asyncio.Event(), asyncio.Event()
    server_reg = rpc.Registry()

    @server_reg.handle("ticks")
    async def ticks(_: Any = None) -> Any:  # a streamed result that stays open
        yield 1
        await asyncio.Event().wait()

    client_reg = _registry(runs, started, release)
    async with served(flavour, server_reg, client_registry=client_reg) as (server, peer):
        stream = peer.stream("ticks", timeout=30)
        assert await anext(stream) == 1
        [served_peer] = server.peers
        held = asyncio.ensure_future(served_peer.request("hold", None, timeout=30))
        await asyncio.wait_for(started.wait(), 5)
        closing = asyncio.ensure_future(peer.close(drain_timeout=10))
        await wait_until(lambda: peer.gave_up is not None)  # draining now
        with pytest.raises(rpc.RetryLater, match="closing"):
            await asyncio.wait_for(served_peer.request("count", 1, timeout=0.3), 5)
        release.set()
        assert await asyncio.wait_for(held, 5) == "held"
        await asyncio.wait_for(closing, 15)
        await stream.aclose()
    assert runs == []


@pytest.mark.parametrize("parts", [None, [1, 2]], ids=["single", "parts"])
@pytest.mark.parametrize("protocol", sorted(URLS))
async def test_a_stream_refused_during_the_drain_raises_once_closed(
    protocol: str, parts: list[int] | None
) -> None:
    """A stream (a single result, or a stream request) refused by a peer closing raises
    RetryLater once the connection has closed, as a request does. Before, it raised at
    once, the draining connection still open: sent again there (the reconnecting client's
    ``stream`` takes the open connection), it was only refused again."""
    runs: list[object] = []
    started, release = asyncio.Event(), asyncio.Event()
    reg = _registry(runs, started, release)

    @reg.handle_stream("total")
    async def total(values: Any) -> int:
        got = [value async for value in values]
        runs.extend(got)
        return sum(got)

    async with rpc.serve(URLS[protocol], registry=reg) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            held, closing = await _drain_holding(client, server, started)

            async def read() -> tuple[BaseException, bool]:
                op = "count" if parts is None else "total"
                try:
                    async for _ in client.stream(op, value=1, parts=parts, timeout=30):
                        pass
                except rpc.RetryLater as exc:
                    return exc, client.is_open
                raise AssertionError("the stream was not refused")

            late = asyncio.ensure_future(read())
            await _refusing(client)  # sent after the stream: it was refused before
            assert not late.done()  # waiting for the close, not raised on the open one
            release.set()  # the drain ends, the connection closes
            assert await asyncio.wait_for(held, 5) == "held"
            refused, still_open = await asyncio.wait_for(late, 10)
            assert "closing" in str(refused) and not still_open
            await asyncio.wait_for(closing, 10)
    assert runs == []
