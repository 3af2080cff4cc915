"""A graceful close that stopped reading a peer without retry results (12d3f81): what it
must still read and answer, and for how long it reads again (reviews of 12d3f81, f29d4e7,
153c7d8, 9dc3ddd and 1922a74 by helpers 167 to 169). Real sockets on 127.0.0.1, both
loops; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import rpc
from rpc.errors import ConnectionClosed
from tests.rpc_helpers import wait_until

pytestmark = pytest.mark.both_loops

DRAIN = 2.0
"""The close's drain bound: the defects below hold the close to it."""


async def total_of_gated_parts(client: Any, gate: asyncio.Event) -> list[Any]:
    """The ``total`` stream request with parts 1 and 2, the second sent once ``gate`` is
    set: its results."""

    async def parts() -> Any:
        yield 1
        await gate.wait()
        yield 2

    return [x async for x in client.stream("total", parts=parts(), timeout=DRAIN + 2)]


async def test_a_handler_that_calls_the_peer_back_during_the_close_gets_its_reply() -> None:
    """A request read before the close whose handler calls the peer (a peerwire client the
    server gives no retry results, as gotalk.js) once the close stopped reading it: the
    call's reply must still be read, so the handler ends and its answer goes out, and the
    close ends then, not at ``drain_timeout`` with the handler cut."""
    go = asyncio.Event()
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("ask")
    async def ask(value: Any) -> Any:
        started.set()
        await go.wait()
        return await rpc.current_peer.get().request("answer", value, timeout=DRAIN + 1)

    client_reg = rpc.Registry()

    @client_reg.handle("answer")
    def answer(value: Any) -> Any:
        return value * 2

    loop = asyncio.get_running_loop()
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False) as server:
        async with rpc.connect(str(server.url), registry=client_reg, reconnect=False) as client:
            asked = asyncio.ensure_future(client.request("ask", 21, timeout=DRAIN + 2))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            began = loop.time()
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: not served.reading, 2)  # the input stopped
            go.set()
            assert await asyncio.wait_for(asked, DRAIN + 3) == 42
            await asyncio.wait_for(closing, DRAIN + 3)
            took = loop.time() - began
    assert took < DRAIN / 2, f"the close took {took:.3f} s"


def _gotalk_request(rid: int, op: bytes, value: bytes) -> bytes:
    return b"r" + rid.to_bytes(4, "little") + b"%03d" % len(op) + op + b"%08x" % len(value) + value


async def _gotalk_answers(reader: asyncio.StreamReader) -> dict[int, str]:
    """What a raw Gotalk v1 client reads up to EOF: each answer's kind, by request id (R:
    a result; e: a retry result)."""
    buf = b""
    while data := await reader.read(1 << 20):
        buf += data
    answers: dict[int, str] = {}
    while buf:
        if buf[:1] == b"h":  # a heartbeat
            buf = buf[13:]
            continue
        kind, rid = buf[:1], int.from_bytes(buf[1:5], "little")
        assert kind in (b"R", b"e"), buf[:40]  # a result, or a retry result (its wait first)
        head = 13 if kind == b"R" else 21
        size = int(buf[head - 8 : head], 16)
        answers[rid] = kind.decode()
        buf = buf[head + size :]
    return answers


@pytest.mark.parametrize("retry_results", [False, True])
async def test_requests_kept_in_the_backlog_when_the_close_begins_are_answered(
    retry_results: bool,
) -> None:
    """Requests read before the close and kept in the backlog (our output to the client
    backed up: it reads slowly) when the close begins, with no handler running: they are
    read before the close, so they run (or, for a peer that takes retry results, get one)
    once the client reads, within ``drain_timeout``; they were dropped unanswered, the
    close finding nothing in flight to wait for."""
    reg = rpc.Registry()

    @reg.handle("big")
    def big(value: Any) -> Any:
        return "x" * (8 << 20)  # far above high_water and what the sockets buffer

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=retry_results
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(_gotalk_request(0, b"big", b"0"))
            await wait_until(lambda: any(p.outbox.blocked for p in server.peers), 5)
            [served] = server.peers
            writer.write(b"".join(_gotalk_request(i, b"work", b"%d" % i) for i in (1, 2, 3)))
            await wait_until(lambda: len(served._backlog) == 3, 5)  # kept: output backed up
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            answers = await asyncio.wait_for(_gotalk_answers(reader), DRAIN + 3)
            await asyncio.wait_for(closing, DRAIN + 3)
        finally:
            writer.close()
    kept = "e" if retry_results else "R"  # "closing": not run, safe to send again
    assert answers == {0: "R", 1: kept, 2: kept, 3: kept}, answers


async def test_a_stream_request_kept_when_the_close_begins_gets_its_parts() -> None:
    """A stream request read before the close but kept (its handler slot taken,
    ``max_concurrent=1``, a peer without retry results) starts once the close stopped the
    input: its parts that come then must be read, as for a stream that took parts when the
    close began, so it ends and is answered, and the close ends then, not at
    ``drain_timeout`` with the stream's handler cut."""
    started, release, gate = asyncio.Event(), asyncio.Event(), asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        started.set()
        await release.wait()
        return value

    @reg.handle_stream("total")
    async def total(values: Any) -> int:
        return sum([value async for value in values])

    loop = asyncio.get_running_loop()
    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False, options=options
    ) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            held = asyncio.ensure_future(client.request("slow", 7, timeout=DRAIN + 2))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            streamed = asyncio.ensure_future(total_of_gated_parts(client, gate))
            await wait_until(lambda: served._backlog, 5)  # kept: the one slot is taken
            began = loop.time()
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: not served.reading, 2)  # the input stopped
            gate.set()  # part 2 and the stream's end come now
            release.set()  # the slot frees: the stream's handler starts
            assert await asyncio.wait_for(held, DRAIN + 3) == 7
            assert await asyncio.wait_for(streamed, DRAIN + 3) == [3]
            await asyncio.wait_for(closing, DRAIN + 3)
            took = loop.time() - began
    assert took < DRAIN / 2, f"the close took {took:.3f} s"


async def test_nothing_is_written_after_the_half_close(caplog: pytest.LogCaptureFixture) -> None:
    """Over TCP a graceful close that stopped a peer's input ends with our FIN (write_eof)
    and waits for the peer's (or ``rpc.closing.QUIET``): meanwhile the connection is no
    longer open for output. A handler still running at the drain's end (cut) that answers
    then, or a notification sent then, is dropped or refused (ConnectionClosed), as once
    the transport closes; they reached the transport, which raised RuntimeError ("Cannot
    call write() after write_eof()", logged at ERROR as a result that could not be sent)."""
    go = asyncio.Event()
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        started.set()
        await go.wait()
        return value

    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(_gotalk_request(1, b"slow", b"1"))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=0.1))
            assert await asyncio.wait_for(reader.read(), 5) == b""  # our FIN: half-closed
            assert not served.is_open
            with pytest.raises(rpc.ConnectionClosed):
                served.notify("late", 1)
            go.set()  # the cut handler answers now
            await asyncio.wait_for(closing, 5)  # at QUIET: the client keeps its side open
        finally:
            writer.close()
    assert errors == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_the_input_stops_again_once_a_call_begun_during_the_close_is_answered() -> None:
    """A handler read before the close calls the peer back once the close stopped the input
    (a peer without retry results): reading resumes for the reply (read_on), and must stop
    again once that call is answered, while another handler read before the close still
    runs. It stayed on until every handler the close waited for had ended, so a busy peer's
    requests sent meanwhile were read, run and waited for, as before 12d3f81."""
    go, release = asyncio.Event(), asyncio.Event()
    started: list[str] = []
    ran: list[Any] = []
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        started.append("slow")
        await release.wait()
        return value

    @reg.handle("ask")
    async def ask(value: Any) -> Any:
        started.append("ask")
        await go.wait()
        return await rpc.current_peer.get().request("answer", value, timeout=DRAIN + 1)

    @reg.handle("work")
    def work(value: Any) -> Any:
        ran.append(value)
        return value

    client_reg = rpc.Registry()

    @client_reg.handle("answer")
    def answer(value: Any) -> Any:
        return value * 2

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False) as server:
        async with rpc.connect(str(server.url), registry=client_reg, reconnect=False) as client:
            held = asyncio.ensure_future(client.request("slow", 7, timeout=DRAIN + 2))
            asked = asyncio.ensure_future(client.request("ask", 21, timeout=DRAIN + 2))
            await wait_until(lambda: len(started) == 2, 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: not served.reading, 2)  # the input stopped
            go.set()  # the callback: reading resumes for its reply
            assert await asyncio.wait_for(asked, DRAIN) == 42
            try:  # "slow" still runs: nothing else keeps the input read
                await wait_until(lambda: not served.reading, DRAIN / 4)
            except TimeoutError:
                pytest.fail("the input was still read once the close's callback was answered")
            late = asyncio.ensure_future(client.request("work", 1, timeout=DRAIN + 2))
            release.set()
            assert await asyncio.wait_for(held, DRAIN) == 7
            await asyncio.wait_for(closing, DRAIN + 3)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(late, DRAIN)
    assert ran == []


async def test_a_close_does_not_wait_for_results_kept_for_a_stream_of_ours() -> None:
    """A stream of ours whose reader stopped reading (its queue full: the results that
    follow wait in the backlog, the input paused) is cut by a graceful close, as the close
    says; the close waited for the backlog to empty (f29d4e7's Backlog.emptied), which
    those results never do while the close waits, so it took ``drain_timeout``."""
    reg = rpc.Registry()

    @reg.handle("many")
    async def many(value: Any) -> Any:
        for i in range(value):
            yield i

    loop = asyncio.get_running_loop()
    options = rpc.Options(max_stream_queue=2)
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as server:
        async with rpc.connect(str(server.url), reconnect=False, options=options) as client:
            results = client.stream("many", value=50, timeout=DRAIN + 3)
            assert await asyncio.wait_for(anext(results), 5) == 0
            await wait_until(lambda: client._backlog and not client.reading, 5)
            began = loop.time()
            await asyncio.wait_for(client.close(drain_timeout=DRAIN), DRAIN + 3)
            took = loop.time() - began
            await results.aclose()
    assert took < DRAIN / 2, f"the close took {took:.3f} s"


async def test_the_input_stops_again_once_a_kept_stream_request_took_its_parts() -> None:
    """A stream request read before the close but kept (both slots taken, a peer without
    retry results) starts once the close stopped the input: reading resumes for its parts
    (read_on), and must stop again once they have ended, as docs/api.md says ("or a stream
    request of its still takes parts; after that it is no longer read"), while another
    handler read before the close still runs. The close, asleep in an ALL_COMPLETED wait on
    the handlers, looked again only once every one had ended, so a busy peer's requests
    sent meanwhile were read, run and waited for."""
    first, second, gate = asyncio.Event(), asyncio.Event(), asyncio.Event()
    started: list[int] = []
    took: list[int] = []
    ran: list[Any] = []
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: int) -> int:
        started.append(value)
        await (first if value == 1 else second).wait()
        return value

    @reg.handle_stream("total")
    async def total(values: Any) -> int:
        sum_ = 0
        async for value in values:
            took.append(value)
            sum_ += value
        return sum_

    @reg.handle("work")
    def work(value: Any) -> Any:
        ran.append(value)
        return value

    options = rpc.Options(max_concurrent=2)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False, options=options
    ) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            held = [
                asyncio.ensure_future(client.request("slow", value, timeout=DRAIN + 2))
                for value in (1, 2)
            ]
            await wait_until(lambda: len(started) == 2, 5)
            [served] = server.peers
            streamed = asyncio.ensure_future(total_of_gated_parts(client, gate))
            await wait_until(lambda: served._backlog, 5)  # kept: both slots are taken
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: not served.reading, 2)  # the input stopped
            first.set()  # a slot frees: the stream's handler starts, the input is read
            await wait_until(lambda: took == [1], 2)
            gate.set()  # part 2 and the stream's end come now
            assert await asyncio.wait_for(streamed, DRAIN) == [3]
            try:  # "slow" 2 still runs: nothing else keeps the input read
                await wait_until(lambda: not served.reading, DRAIN / 4)
            except TimeoutError:
                pytest.fail("the input was still read once the stream's parts had ended")
            late = asyncio.ensure_future(client.request("work", 1, timeout=DRAIN + 2))
            second.set()
            assert [await asyncio.wait_for(call, DRAIN) for call in held] == [1, 2]
            await asyncio.wait_for(closing, DRAIN + 3)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(late, DRAIN)
    assert ran == []
