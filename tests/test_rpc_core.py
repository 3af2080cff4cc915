"""The RPC core end to end over real sockets, for Gotalk and both Chatter dialects."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

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


@pytest.mark.parametrize("kind", ["request", "stream", "upload"])
@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "middleware"])
async def test_lone_request_is_written_at_once(flavour: str, kind: str, middleware: bool) -> None:
    """A request (or a stream's, without parts or with a list's parts and their end) with
    no other call in flight is written by the call itself, not by a flush at the end of
    the loop iteration; requests made together still share a write. The same through
    middleware, whose path sends its own requests."""
    loop = asyncio.get_running_loop()

    async def pass_through(call: rpc.Call, call_next: Any) -> Any:
        return await call_next(call)

    chain = {"middleware": [pass_through]} if middleware else {}
    async with served(flavour, make_registry(), **chain) as (_, peer):
        queued: list[int] = []

        def look() -> None:  # runs after the steps scheduled before it, before any flush
            queued.append(peer.outbox.queued)

        async def call() -> Any:
            if kind == "request":
                return await peer.request("raw", b"abc", raw=True)
            if kind == "upload":
                return [x async for x in peer.stream("sum", parts=[1, 2])]
            return [x async for x in peer.stream("count", value=2)]

        expected = {"request": b"cba", "stream": [1, 2], "upload": [3]}[kind]
        alone = asyncio.create_task(call())
        loop.call_soon(look)
        assert await alone == expected
        together = [asyncio.create_task(call()) for _ in range(5)]
        loop.call_soon(look)
        assert await asyncio.gather(*together) == [expected] * 5
        assert queued[0] == 0  # handed to the transport in the task's first step
        assert queued[1] > 0  # the first of five went at once, four wait for the flush


async def test_lone_upload_waits_for_the_transport_to_drain(flavour: str) -> None:
    """A lone upload of a plain iterable's parts is written under the outbox's hold, which
    it lets go of before it waits for the transport to drain: the server, which runs only
    while the caller waits, never finds the hold taken, and every part arrives."""
    reg = rpc.Registry()
    held_while_served: list[bool] = []

    async with served(flavour, reg) as (_, peer):

        @reg.handle_stream("size")
        async def size(parts: AsyncIterator[bytes]) -> int:
            total = 0
            async for part in parts:
                held_while_served.append(peer.outbox.held)
                total += len(part)
            return total

        # a small send buffer: the transport pushes back after a few parts on any host
        sock = peer.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        chunk = b"x" * (128 * 1024)
        seen: list[tuple[bool, bool]] = []  # (held, blocked) as each part is taken

        def parts() -> Iterator[bytes]:  # a plain generator: never returns to the loop
            for _ in range(64):
                seen.append((peer.outbox.held, peer.outbox.blocked))
                yield chunk

        results = [x async for x in peer.stream("size", parts=parts())]
    assert results == [64 * len(chunk)]
    assert seen[1] == (True, False)  # the hold was taken for the parts
    assert any(blocked for _, blocked in seen)  # and the upload had to wait
    assert len(held_while_served) == 64 and not any(held_while_served)


@pytest.mark.parametrize("kind", ["single", "stream"])
@pytest.mark.parametrize("fails", [False, True], ids=["result", "error"])
@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "middleware"])
async def test_last_job_reply_is_written_at_once(
    flavour: str, middleware: bool, fails: bool, kind: str
) -> None:
    """The last word of a handler's job (a coroutine's result or error, a streamed result's
    end or error, with its part) is written at once when the job is the only one (with
    middleware too: that path sends its own replies); while others run, it waits for the
    loop iteration's flush, to share a write with theirs."""
    loop = asyncio.get_running_loop()
    gates = {n: asyncio.Event() for n in (1, 2, 3)}
    waiting: list[int] = []
    queued: list[tuple[int, int]] = []
    reg = rpc.Registry()

    async def gate(n: int) -> None:
        """Wait for ``n``'s gate, then look at the server's queued bytes once this step
        (which sends the reply or the part and the end) is done, before any flush."""
        waiting.append(n)
        await gates[n].wait()
        server_side = rpc.current_peer.get()
        loop.call_soon(lambda: queued.append((n, server_side.outbox.queued)))

    @reg.handle("gated")
    async def gated(n: int) -> int:
        await gate(n)
        if fails:
            raise ValueError(f"failed {n}")
        return n

    @reg.handle("gated_stream")
    async def gated_stream(n: int):
        await gate(n)
        yield n
        if fails:
            raise ValueError(f"failed {n}")

    async def pass_through(call: rpc.Call, call_next: Any) -> Any:
        return await call_next(call)

    async def call(n: int) -> Any:
        if kind == "single":
            return await peer.request("gated", n)
        return [x async for x in peer.stream("gated_stream", value=n)]

    chain = {"middleware": [pass_through]} if middleware else {}
    async with served(flavour, reg, **chain) as (_, peer):
        calls = {n: asyncio.create_task(call(n)) for n in (1, 2, 3)}
        await wait_until(lambda: sorted(waiting) == [1, 2, 3])
        for n in (2, 3, 1):
            gates[n].set()  # one at a time: 2 and 3 end while others still run, 1 last
            if fails:
                with pytest.raises(rpc.RemoteError, match=f"failed {n}"):
                    await calls[n]
            else:
                assert await calls[n] == (n if kind == "single" else [n])
    assert [n for n, _ in queued] == [2, 3, 1]
    assert queued[0][1] > 0 and queued[1][1] > 0  # others ran: these waited for the flush
    assert queued[2][1] == 0  # the only job: handed to the transport in its last step


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
