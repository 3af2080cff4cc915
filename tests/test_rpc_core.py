"""The RPC core end to end over real sockets, for Gotalk and both Chatter dialects."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import pytest

import rpc
from tests.rpc_helpers import FLAVOURS, served, wait_until
from wire.chatter import ChatterConnection, Dialect

pytestmark = pytest.mark.parametrize("flavour", list(FLAVOURS))


@dataclass
class GreetIn:
    name: str


def make_registry(started: asyncio.Queue[int] | None = None) -> rpc.Registry:
    """The test ops; ``sleep`` puts its argument on ``started`` when it begins."""
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(value):
        return value

    @reg.handle("raw")
    def raw(data: bytes) -> bytes:
        return data[::-1]

    @reg.handle("greet")
    async def greet(params: GreetIn) -> dict:
        return {"greeting": f"Hello {params.name}"}

    @reg.handle("sleep")
    async def sleep(ms: int) -> int:
        if started is not None:
            started.put_nowait(ms)
        await asyncio.sleep(ms / 1000)  # the work itself
        return ms

    @reg.handle("fail")
    def fail(_value):
        raise ValueError("something went wrong")

    @reg.handle("count")
    async def count(n: int):
        for i in range(1, n + 1):
            yield i

    @reg.handle("count_then_fail")
    async def count_then_fail(n: int):
        yield 1
        raise RuntimeError("stream broke")

    @reg.handle_stream("sum")
    async def total(parts):
        return sum([p async for p in parts])

    @reg.handle_stream("upper")
    async def upper(parts):
        async for part in parts:
            yield part.upper()

    @reg.handle("ask_back")
    async def ask_back(name: str) -> str:
        caller = rpc.current_peer.get()
        return await caller.request("client_name", name)

    return reg


async def test_request_result(flavour: str) -> None:
    async with served(flavour, make_registry()) as (_, peer):
        assert await peer.request("echo", {"a": [1, 2]}) == {"a": [1, 2]}
        assert await peer.request("echo") is None
        assert await peer.request("raw", b"abc", raw=True) == b"cba"
        assert await peer.request("greet", {"name": "Bob"}) == {"greeting": "Hello Bob"}


async def test_error_results(flavour: str) -> None:
    async with served(flavour, make_registry()) as (_, peer):
        with pytest.raises(rpc.RemoteError, match="something went wrong"):
            await peer.request("fail", 1)
        with pytest.raises(rpc.RemoteError, match='unknown operation "nope"'):
            await peer.request("nope")
        with pytest.raises(rpc.RemoteError, match="invalid parameters"):
            await peer.request("greet", {"nom": 1})
        # the connection survives all of it
        assert await peer.request("echo", 5) == 5


async def test_many_in_flight_out_of_order(flavour: str) -> None:
    async with served(flavour, make_registry()) as (_, peer):
        order: list[int] = []

        async def call(ms: int) -> None:
            order.append(await peer.request("sleep", ms))

        await asyncio.gather(call(300), call(10), *(peer.request("echo", i) for i in range(200)))
        assert order == [10, 300]


async def test_streams(flavour: str) -> None:
    async with served(flavour, make_registry()) as (_, peer):
        assert [x async for x in peer.stream("count", value=4)] == [1, 2, 3, 4]
        assert [x async for x in peer.stream("echo", value="one")] == ["one"]
        assert [x async for x in peer.stream("sum", parts=[1, 2, 3])] == [6]
        assert [x async for x in peer.stream("upper", parts=["a", "b"])] == ["A", "B"]
        got = []
        with pytest.raises(rpc.RemoteError, match="stream broke"):
            async for x in peer.stream("count_then_fail", value=1):
                got.append(x)
        assert got == [1]
        assert await peer.request("echo", "after") == "after"


async def test_a_request_answered_with_a_streamed_result_fails_at_once(flavour: str) -> None:
    """request() of an op whose handler streams its result: a PayloadError that says to
    call stream(), at once, for a stream of parts or an empty one (before: the request
    waited for good, its timeout lost with it); the connection goes on."""
    reg = make_registry()

    @reg.handle("nothing")
    async def nothing(_value):
        return
        yield  # an async generator that yields nothing: an empty streamed result

    async with served(flavour, reg) as (_, peer):
        for op in ("count", "nothing"):
            with pytest.raises(rpc.PayloadError, match="call stream"):
                await peer.request(op, 3, timeout=10)
        assert await peer.request("echo", "after") == "after"
        assert [x async for x in peer.stream("count", value=2)] == [1, 2]


async def test_a_handler_closing_its_own_connection_does_not_wait_for_itself(
    flavour: str,
) -> None:
    """``await rpc.current_peer.get().close()`` in a request handler or a notification
    handler closes at once: the graceful close waits for the connection's other work, not
    for the handler awaiting it, nor for another handler closing it at the same time
    (before: the whole drain_timeout, 5 s)."""
    reg = make_registry()

    @reg.handle("bye")
    async def bye(_value):
        await rpc.current_peer.get().close()

    @reg.handle_notification("quit")
    async def quit_(_value):
        await rpc.current_peer.get().close()

    async with served(flavour, reg) as (server, peer):
        async with asyncio.timeout(2):
            with pytest.raises(rpc.ConnectionClosed):
                await peer.request("bye", None)
        scheme, query = FLAVOURS[flavour]
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        async with rpc.connect(url, registry=rpc.Registry(), reconnect=False) as other:
            async with asyncio.timeout(2):  # two at once: neither waits for the other
                results = await asyncio.gather(
                    other.request("bye", 1), other.request("bye", 2), return_exceptions=True
                )
            assert all(isinstance(r, rpc.ConnectionClosed) for r in results), results
        async with rpc.connect(url, registry=rpc.Registry(), reconnect=False) as other:
            other.notify("quit")
            async with asyncio.timeout(2):
                await other.closed


async def test_a_close_cancelled_while_it_drains_still_closes(flavour: str) -> None:
    """A handler closes its own connection through ``asyncio.wait_for`` (a task of its own:
    the close waits for that handler too) with a timeout shorter than the drain's: when
    the timeout cancels the close, the connection closes all the same. Before, it stayed
    open, and the handler's TimeoutError went back as an error result."""
    reg = make_registry()

    @reg.handle("bye")
    async def bye(_value):
        await asyncio.wait_for(rpc.current_peer.get().close(drain_timeout=30), 0.2)

    async with served(flavour, reg) as (_server, peer):
        async with asyncio.timeout(5):  # (before: open for good; the drain alone 30 s)
            with pytest.raises(rpc.ConnectionClosed):
                await peer.request("bye", None, timeout=20)
            await peer.closed


async def test_notifications_both_ways_and_callbacks(flavour: str) -> None:
    server_reg = make_registry()
    client_reg = rpc.Registry()
    seen_by_server: asyncio.Queue = asyncio.Queue()
    seen_by_client: asyncio.Queue = asyncio.Queue()

    @server_reg.handle_notification("hello")
    def on_hello(value):
        seen_by_server.put_nowait(value)
        rpc.current_peer.get().notify("welcome", {"to": value})

    @client_reg.handle_notification("welcome")
    async def on_welcome(value):
        seen_by_client.put_nowait(value)

    @client_reg.handle("client_name")
    def client_name(name: str) -> str:
        return f"client of {name}"

    async with served(flavour, server_reg, client_registry=client_reg) as (server, peer):
        peer.notify("hello", "bob")
        assert await asyncio.wait_for(seen_by_server.get(), 5) == "bob"
        assert await asyncio.wait_for(seen_by_client.get(), 5) == {"to": "bob"}
        # the server calls back into the client during a request
        assert await peer.request("ask_back", "srv") == "client of srv"
        # and the server can call the client on its own
        [server_side] = server.peers
        assert await server_side.request("client_name", "x") == "client of x"


async def test_timeout_frees_state_and_late_result_is_dropped(flavour: str) -> None:
    async with served(flavour, make_registry()) as (_, peer):
        with pytest.raises(rpc.RequestTimeout):
            await peer.request("sleep", 300, timeout=0.05)
        assert peer._calls == {}
        # the server answers in order of its timers: this reply comes after the late one,
        # which the client has then received and dropped
        assert await peer.request("sleep", 301) == 301
        assert peer._calls == {}


async def test_cancellation_frees_state(flavour: str) -> None:
    started: asyncio.Queue[int] = asyncio.Queue()
    async with served(flavour, make_registry(started)) as (_, peer):
        task = asyncio.create_task(peer.request("sleep", 300))
        assert await asyncio.wait_for(started.get(), 5) == 300  # the server is running it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert peer._calls == {}
        # a later, longer sleep answers after any late result of the cancelled one
        assert await peer.request("sleep", 301) == 301
        assert peer._calls == {}


async def test_concurrency_limit_answers_retry_and_client_honours_it(flavour: str) -> None:
    options = rpc.Options(max_concurrent=2, retry_wait=0.05)
    started: asyncio.Queue[int] = asyncio.Queue()
    async with served(flavour, make_registry(started), options=options) as (_, peer):
        results = await asyncio.gather(*(peer.request("sleep", 100) for _ in range(6)))
        assert results == [100] * 6
        while not started.empty():
            started.get_nowait()
        impatient = rpc.Options(retries=0)
        peer.options = impatient
        busy = [asyncio.create_task(peer.request("sleep", 200)) for _ in range(2)]
        for _ in busy:  # both slots are taken
            assert await asyncio.wait_for(started.get(), 5) == 200
        with pytest.raises(rpc.RetryLater, match="request rate limit"):
            await peer.request("sleep", 1)
        await asyncio.gather(*busy)


async def test_graceful_close_drains_in_flight_work(flavour: str) -> None:
    started: asyncio.Queue[int] = asyncio.Queue()
    async with served(flavour, make_registry(started)) as (server, peer):
        pending = asyncio.create_task(peer.request("sleep", 200))
        assert await asyncio.wait_for(started.get(), 5) == 200
        [server_side] = server.peers
        await server_side.close()
        assert await pending == 200


async def test_connection_loss_fails_pending_requests(flavour: str) -> None:
    started: asyncio.Queue[int] = asyncio.Queue()
    async with served(flavour, make_registry(started)) as (server, peer):
        pending = asyncio.create_task(peer.request("sleep", 2000))
        assert await asyncio.wait_for(started.get(), 5) == 2000
        [server_side] = server.peers
        server_side.abort()
        with pytest.raises(rpc.ConnectionClosed):
            await pending
        with pytest.raises(rpc.ConnectionClosed):
            await peer.request("echo", 1)


async def test_request_over_our_max_size_fails_before_sending(flavour: str) -> None:
    """A request larger than the caller's max_size is refused locally (nothing sent) and
    the connection goes on."""
    options = rpc.Options(max_size=1024)
    served_sizes: list[int] = []
    reg = rpc.Registry()

    @reg.handle("raw")
    def raw(data: bytes) -> bytes:
        served_sizes.append(len(data))
        return data[::-1]

    async with served(flavour, reg, client_options=options) as (_, peer):
        with pytest.raises(rpc.PayloadError, match="request of 2000 bytes exceeds max_size 1024"):
            await peer.request("raw", b"x" * 2000, raw=True)
        assert await peer.request("raw", b"abc", raw=True) == b"cba"
    assert served_sizes == [3]  # the server takes up to 1 MiB: a request sent is served


async def test_a_stream_past_its_deadline_sends_nothing(flavour: str) -> None:
    """A stream whose whole-stream deadline has passed before it is sent raises
    RequestTimeout and sends nothing (peers without request metadata would run it)."""
    ran: list[int] = []
    reg = rpc.Registry()

    @reg.handle("noted")
    async def noted(n: int):
        ran.append(n)
        yield n

    async with served(flavour, reg) as (_, peer):
        with pytest.raises(rpc.RequestTimeout, match="noted: stream not done within 0 s"):
            async for _ in peer.stream("noted", value=1, timeout=0):
                pass
        assert [x async for x in peer.stream("noted", value=2)] == [2]
    assert ran == [2]  # the server saw the second stream only


async def test_on_connect_and_connection_limit(flavour: str) -> None:
    scheme, query = FLAVOURS[flavour]
    opened: list[rpc.Peer] = []

    async def on_connect(peer: rpc.Peer) -> None:
        peer.state["name"] = f"conn{len(opened)}"
        opened.append(peer)

    reg = make_registry()

    @reg.handle("my_name")
    def my_name(_value) -> str:
        return rpc.current_peer.get().state["name"]

    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=reg, on_connect=on_connect, max_connections=1
    ) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        async with rpc.connect(url) as peer:
            assert await peer.request("my_name") == "conn0"
            if flavour == "gotalk":  # Gotalk servers speak first: connect sees the refusal
                with pytest.raises(rpc.ConnectionClosed, match="refused the connection"):
                    await rpc.connect(url, reconnect=False)
            else:
                extra = await rpc.connect(url, reconnect=False)
                await asyncio.wait_for(extra.closed, 5)  # refused: over the limit
                with pytest.raises(rpc.ConnectionClosed):
                    await extra.request("echo", 1)
        assert len(opened) == 1


@pytest.mark.parametrize("kind", ["plain", "async"])
async def test_a_server_on_connect_that_raises_closes_its_connection(
    flavour: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A server's ``on_connect`` that refuses a client by raising closes that connection,
    sync or async. Before, an async one's error was logged as a task's and the connection
    went on being served."""
    scheme, query = FLAVOURS[flavour]
    refused: list[rpc.Peer] = []

    def refuse(peer: rpc.Peer) -> None:
        refused.append(peer)
        raise rpc.Rejected("not on the list")

    async def refuse_later(peer: rpc.Peer) -> None:
        await asyncio.sleep(0)
        refuse(peer)

    on_connect = refuse if kind == "plain" else refuse_later
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=make_registry(), on_connect=on_connect
    ) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        try:
            peer = await rpc.connect(url, reconnect=False)
        except rpc.ConnectionClosed:
            assert kind == "plain"  # closed before the client saw it open
        else:
            await asyncio.wait_for(peer.closed, 5)
        await wait_until(lambda: not server.peers)
        assert len(refused) == 1
    assert "on_open callback failed; closing" in caplog.text


async def test_drain_bounds_what_a_slow_reader_costs(flavour: str) -> None:
    scheme, query = FLAVOURS[flavour]
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=make_registry()) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        # a raw client that connects and then reads nothing
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        if flavour == "gotalk":
            writer.write(b"01")
        else:
            hello = ChatterConnection(Dialect.CURRENT)
            hello.send("echo", b"1", last=True)  # a notification: fixes the dialect
            writer.write(hello.data_to_send())
        await writer.drain()
        await wait_until(lambda: server.peers)
        [slow] = server.peers
        codec = slow.adapter.codec  # the server read what we sent:
        await wait_until(
            lambda: (codec.peer_version if flavour == "gotalk" else codec.dialect) is not None
        )
        chunk = b"x" * 65536
        sent = 0
        blocked = False
        for _ in range(2000):  # up to 128 MiB if nothing pushed back
            slow.notify("blob", chunk)
            sent += 1
            drained = asyncio.ensure_future(slow.drain())
            await asyncio.sleep(0)  # one step: drain() returns, or waits for the reader
            if not drained.done():
                blocked = True
                drained.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await drained
                break
        assert blocked, "drain() never waited for the slow reader"
        assert slow.write_buffer_size < 16 * 1024 * 1024
        assert sent < 2000

        # once the client reads, drain() completes
        async def consume() -> None:
            while await reader.read(1 << 20):
                pass

        consumer = asyncio.create_task(consume())
        await asyncio.wait_for(slow.drain(), 10)
        writer.close()
        consumer.cancel()
        # other connections were never affected
        async with rpc.connect(url) as peer:
            assert await peer.request("echo", 3) == 3


async def test_results_produced_while_the_caller_still_sends_parts_arrive(flavour: str) -> None:
    """A stream handler that answers each part as it comes: on Chatter the caller holds the
    conversation's token until its End, so those results wait for it instead of being lost;
    none is dropped and the order holds."""
    reg = rpc.Registry()
    answered: asyncio.Queue[int] = asyncio.Queue()

    @reg.handle_stream("running_sum")
    async def running_sum(parts):  # type: ignore[no-untyped-def]
        total = 0
        async for part in parts:
            total += part
            yield total
            answered.put_nowait(total)  # the result above is out of the handler

    async def parts():  # type: ignore[no-untyped-def]
        for part in (1, 2, 3):
            yield part
            assert await asyncio.wait_for(answered.get(), 5) > 0  # answered before the next

    async with served(flavour, reg) as (_server, peer):
        assert [r async for r in peer.stream("running_sum", parts=parts())] == [1, 3, 6]


async def test_every_handler_of_a_batch_sees_its_own_connection(flavour: str) -> None:
    """current_peer is set once per read's batch: plain and coroutine handlers of two
    connections, called 50 at a time on each, each see the peer of the connection that
    carried their request."""
    reg = rpc.Registry()

    @reg.handle("whoami")
    def whoami(_value) -> int:
        return rpc.current_peer.get().remote_address[1]

    @reg.handle("whoami_later")
    async def whoami_later(_value) -> int:
        await asyncio.sleep(0)
        return rpc.current_peer.get().remote_address[1]

    async with served(flavour, reg) as (server, first):
        scheme, query = FLAVOURS[flavour]
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        async with rpc.connect(url, reconnect=False) as second:

            async def answers(peer: rpc.Peer) -> set[int]:
                calls = [peer.request(op) for op in ("whoami", "whoami_later") for _ in range(50)]
                return set(await asyncio.gather(*calls))

            mine = [peer.transport.get_extra_info("sockname")[1] for peer in (first, second)]
            assert mine[0] != mine[1]
            assert [await answers(first), await answers(second)] == [{mine[0]}, {mine[1]}]
            both = await asyncio.gather(answers(first), answers(second))
            assert list(both) == [{mine[0]}, {mine[1]}]
