"""A graceful close of a connection to a peer without retry results: what the peer sent
before the close runs and is answered, what it sends during the drain runs only while a call
of ours is in flight, and the rest is turned away unrun, while the replies to our calls,
the peer's cancellations and the parts of its running stream requests are still read.
(12d3f81 stopped reading such a peer instead, and its reviews, by helpers 167 to 169, found
what that left unread; the tests of those reviews are kept here, with review 173's of the
turning away: the close's own clock tick, what is kept past our call, floods of turned-away
stream requests and Chatter conversations.) Real sockets on 127.0.0.1, both loops; the
waits are bounded, none is a fixed sleep."""

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


@pytest.mark.parametrize("timeout", [DRAIN + 1, float("inf")], ids=["timed", "no-deadline"])
async def test_a_handler_that_calls_the_peer_back_during_the_close_gets_its_reply(
    timeout: float,
) -> None:
    """A request read before the close whose handler calls the peer (a peerwire client the
    server gives no retry results, as gotalk.js) once the close began: the call's reply
    must be read, so the handler ends and its answer goes out, and the close ends then,
    not at ``drain_timeout`` with the handler cut. A request the client's handler of that
    call sends first runs too (our call is in flight: the peer may need it answered).
    (Once the close stopped reading the peer, a call with no deadline did not resume it.)"""
    go = asyncio.Event()
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("ask")
    async def ask(value: Any) -> Any:
        started.set()
        await go.wait()
        return await rpc.current_peer.get().request("answer", value, timeout=timeout)

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    client_reg = rpc.Registry()

    @client_reg.handle("answer")
    async def answer(value: Any) -> Any:
        assert await rpc.current_peer.get().request("work", "during", timeout=DRAIN) == "during"
        return value * 2

    loop = asyncio.get_running_loop()
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False) as server:
        async with rpc.connect(str(server.url), registry=client_reg, reconnect=False) as client:
            asked = asyncio.ensure_future(client.request("ask", 21, timeout=DRAIN + 2))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            began = loop.time()
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
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
    ``max_concurrent=1``, a peer without retry results) starts during the close: its
    parts that come then must be read, as for a stream that took parts when the close
    began, so it ends and is answered, and the close ends then, not at ``drain_timeout``
    with the stream's handler cut."""
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
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            gate.set()  # part 2 and the stream's end come now
            release.set()  # the slot frees: the stream's handler starts
            assert await asyncio.wait_for(held, DRAIN + 3) == 7
            assert await asyncio.wait_for(streamed, DRAIN + 3) == [3]
            await asyncio.wait_for(closing, DRAIN + 3)
            took = loop.time() - began
    assert took < DRAIN / 2, f"the close took {took:.3f} s"


async def test_nothing_is_written_after_the_half_close(caplog: pytest.LogCaptureFixture) -> None:
    """Over TCP a graceful close of a peer without retry results ends with our FIN
    (write_eof) and waits for the peer's (or ``rpc.closing.QUIET``): meanwhile the
    connection is no longer open for output. A handler still running at the drain's end
    (cut) that answers then, or a notification sent then, is dropped or refused
    (ConnectionClosed), as once the transport closes; they reached the transport, which
    raised RuntimeError ("Cannot call write() after write_eof()", logged at ERROR as a
    result that could not be sent). A request fails in its first step: it waited for the
    connection to go (QUIET at least)."""
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
            request = asyncio.ensure_future(served.request("late", 1, timeout=5))
            await asyncio.sleep(0)  # (one step: not a wait for time to pass)
            assert request.done() and isinstance(request.exception(), rpc.ConnectionClosed)
            go.set()  # the cut handler answers now
            await asyncio.wait_for(closing, 5)  # at QUIET: the client keeps its side open
        finally:
            writer.close()
    assert errors == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_what_the_peer_sends_during_the_close_runs_only_while_our_call_is_in_flight() -> None:
    """A peer without retry results (a peerwire client of a ``retry_results=False``
    server): during the close, its request and notification run while a call of ours is
    in flight (here the client's handler of our call sends them before it answers), and
    are turned away once none is, while a handler read before the close still runs:
    never run, the request fails as the connection closes, and the close does not wait
    for them."""
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

    @reg.handle_notification("note")
    def note(value: Any) -> None:
        ran.append(("note", value))

    client_reg = rpc.Registry()

    @client_reg.handle("answer")
    async def answer(value: Any) -> Any:
        peer = rpc.current_peer.get()
        peer.notify("note", "during")
        assert await peer.request("work", "during", timeout=DRAIN) == "during"
        return value * 2

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False) as server:
        async with rpc.connect(str(server.url), registry=client_reg, reconnect=False) as client:
            held = asyncio.ensure_future(client.request("slow", 7, timeout=DRAIN + 2))
            asked = asyncio.ensure_future(client.request("ask", 21, timeout=DRAIN + 2))
            await wait_until(lambda: len(started) == 2, 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            go.set()  # our call: the client's handler sends a request and a notification
            assert await asyncio.wait_for(asked, DRAIN) == 42
            late = asyncio.ensure_future(client.request("work", "late", timeout=DRAIN + 2))
            client.notify("note", "late")
            with pytest.raises(rpc.RemoteError, match="unknown operation"):  # read after
                await asyncio.wait_for(client.request("nothing", timeout=DRAIN), DRAIN)  # them
            release.set()
            assert await asyncio.wait_for(held, DRAIN) == 7
            await asyncio.wait_for(closing, DRAIN + 3)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(late, DRAIN)
    assert ran == [("note", "during"), "during"]


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


async def test_a_cancellation_during_the_close_ends_its_handler() -> None:
    """A peerwire client gives up on its request during the close of a server that gives
    no retry results: its cancellation is read and cancels the handler, so the close ends
    then. (Once the close stopped reading such a peer, the cancellation stayed unread and
    the handler ran to ``drain_timeout``, cut.)"""
    started, cancelled = asyncio.Event(), asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("hang")
    async def hang(value: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    loop = asyncio.get_running_loop()
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            call = asyncio.ensure_future(client.request("hang", 1, timeout=DRAIN + 2))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            began = loop.time()
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            await wait_until(lambda: served.gave_up is not None, 2)  # the close began
            call.cancel()  # the client tells the server (the cancellation extension)
            await asyncio.wait_for(cancelled.wait(), DRAIN / 2)
            await asyncio.wait_for(closing, DRAIN + 3)
            took = loop.time() - began
    assert took < DRAIN / 2, f"the close took {took:.3f} s"


@pytest.mark.parametrize("round_", range(3))
async def test_a_request_kept_in_the_tick_the_close_begins_in_is_answered(round_: int) -> None:
    """A request read before the close and kept (the one handler slot taken), when the
    close begins within the same clock reading (uvloop counts whole ms: the close's task
    starts in the loop iteration after the read): it was read before the close, so it runs
    and is answered, as docs/api.md and limits.md say. It was dropped unanswered on uvloop
    (``read_at >= _close_began``). Three rounds: one crossing a ms edge may pass."""
    closes: list[asyncio.Future[None]] = []
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(value: Any) -> Any:
        peer = rpc.current_peer.get()
        closes.append(asyncio.ensure_future(peer.close(drain_timeout=DRAIN)))
        async with asyncio.timeout(2):
            while peer.gave_up is None:  # the close began
                await asyncio.sleep(0)
        return value

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            # one read: "hold" takes the slot, "work" is kept behind it
            writer.write(_gotalk_request(1, b"hold", b"1") + _gotalk_request(2, b"work", b"2"))
            answers = await asyncio.wait_for(_gotalk_answers(reader), DRAIN + 3)
            await asyncio.wait_for(closes[0], DRAIN + 3)
        finally:
            writer.close()
    assert answers == {1: "R", 2: "R"}, answers


@pytest.mark.parametrize("kind", ["request", "notification"])
async def test_what_the_peer_sends_during_our_call_runs_even_when_kept_past_it(
    kind: str,
) -> None:
    """A handler read before the close calls the client back during it (the one handler
    slot is its own); the client's handler of that call sends a request (or notification)
    to the server, then answers. Sent while our call was in flight, it must run, as
    docs/api.md and limits.md say ("requests that come while calls of ours are in flight
    still run"). Kept behind the slot, it was dispatched once our call had ended, and
    ``turned_away`` (which asks whether a call is in flight *now*) dropped it unrun."""
    go = asyncio.Event()
    started = asyncio.Event()
    ran: list[Any] = []
    reg = rpc.Registry()

    @reg.handle("ask")
    async def ask(value: Any) -> Any:
        started.set()
        await go.wait()
        return await rpc.current_peer.get().request("answer", value, timeout=DRAIN)

    @reg.handle("work")
    def work(value: Any) -> Any:
        ran.append(value)
        return value

    @reg.handle_notification("note")
    def note(value: Any) -> None:
        ran.append(value)

    sent: list[asyncio.Future[Any]] = []
    client_reg = rpc.Registry()

    @client_reg.handle("answer")
    async def answer(value: Any) -> Any:
        peer = rpc.current_peer.get()
        if kind == "request":
            sent.append(asyncio.ensure_future(peer.request("work", "during", timeout=DRAIN)))
            await asyncio.sleep(0)  # the request goes out before our answer
        else:
            peer.notify("note", "during")
        return value * 2

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        async with rpc.connect(str(server.url), registry=client_reg, reconnect=False) as client:
            asked = asyncio.ensure_future(client.request("ask", 21, timeout=DRAIN + 2))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            async with asyncio.timeout(2):
                while served.gave_up is None:  # the close began
                    await asyncio.sleep(0)
            go.set()
            assert await asyncio.wait_for(asked, DRAIN + 3) == 42
            await asyncio.wait_for(closing, DRAIN + 3)
            if sent:
                await asyncio.wait(sent, timeout=DRAIN + 3)
    assert ran == ["during"], ran


async def test_parts_of_many_stream_requests_turned_away_do_not_break_the_close() -> None:
    """A busy Gotalk peer without retry results (gotalk.js) that opens more than
    ``ENDED_STREAMS`` (256) stream requests during the close, all turned away unanswered,
    and goes on sending their parts (it was told nothing): a part of the first is then a
    part of an unknown stream, a protocol violation, and the connection was aborted, the
    request read before the close (its handler still running) cut unanswered. Before
    a333be4 the peer was not read then; with retry results it is told to stop."""
    from wire.gotalk.encoding import encode
    from wire.gotalk.messages import Heartbeat, StreamRequest, StreamRequestPart

    go = asyncio.Event()
    started = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        started.set()
        await go.wait()
        return value

    @reg.handle_stream("total")
    async def total(parts: Any) -> Any:
        return sum([p async for p in parts])

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(_gotalk_request(1, b"slow", b"1"))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            closing = asyncio.ensure_future(served.close(drain_timeout=DRAIN))
            async with asyncio.timeout(2):
                while served.gave_up is None:  # the close began
                    await asyncio.sleep(0)
            ids = [(10 + i).to_bytes(4, "little") for i in range(300)]
            sent = [encode(StreamRequest(i, "total", b"1")) for i in ids]
            sent += [encode(StreamRequestPart(i, b"2")) for i in ids]
            sent += [encode(StreamRequestPart(i, b"")) for i in ids]  # their ends
            sent.append(encode(Heartbeat(0, 0)))  # (read last: the server counts it)
            writer.write(b"".join(sent))
            await wait_until(lambda: served.violation is not None or served.heartbeats_received, 2)
            assert served.violation is None, served.violation  # (the slow request: cut)
            go.set()
            answers = await asyncio.wait_for(_gotalk_answers(reader), DRAIN + 3)
            await asyncio.wait_for(closing, DRAIN + 3)
        finally:
            writer.close()
    assert answers == {1: "R"}, answers
