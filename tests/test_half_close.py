"""A TCP peer that half-closes (``shutdown(SHUT_WR)``, its FIN behind its requests) still
gets its answers: what it sent before runs and is answered, then the connection closes;
a call of ours to it fails at once, no reply being able to come. Before, the FIN closed the
connection at once and the answers of coroutine handlers were dropped (helper-180's hunt).
Real servers and clients on 127.0.0.1, both loops; the waits are bounded, none is a fixed
sleep."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc.closing import ENDED
from rpc.errors import ConnectionClosed
from tests.rpc_helpers import wait_until

pytestmark = pytest.mark.both_loops

SCHEMES = ["tcp+gotalk", "tcp+sbs"]


def _gotalk_request(rid: int, op: bytes, payload: bytes) -> bytes:
    return b"r%s%03x%s%08x%s" % (rid.to_bytes(4, "little"), len(op), op, len(payload), payload)


async def test_a_raw_gotalk_client_that_half_closes_gets_its_answers() -> None:
    """As ``nc`` sends: the version, two requests for a coroutine handler that waits, then
    FIN. Both answers come, then the server's FIN."""
    go = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        await go.wait()
        return value * 2

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01" + _gotalk_request(1, b"slow", b"20"))
            writer.write(_gotalk_request(2, b"slow", b"1"))
            writer.write_eof()
            await wait_until(lambda: len(server.peers) == 1, 5)
            [served] = server.peers
            await wait_until(lambda: served._input_end == ENDED, 5)  # the FIN was read
            go.set()
            data = await asyncio.wait_for(reader.read(), 5)  # up to the server's FIN
        finally:
            writer.close()
    assert data.startswith(b"01")
    answers = data[2:]
    assert b"R" + (1).to_bytes(4, "little") + b"%08x" % 2 + b"40" in answers
    assert b"R" + (2).to_bytes(4, "little") + b"%08x" % 1 + b"2" in answers


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_client_that_half_closes_gets_the_answers_of_its_calls(scheme: str) -> None:
    """A peerwire client's call to a coroutine handler, its connection half-closed while
    the handler waits: the answer reaches it, then the server closes the connection."""
    go, started = asyncio.Event(), asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        started.set()
        await go.wait()
        return value * 2

    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=reg) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            call = asyncio.ensure_future(client.request("slow", 21, timeout=5))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            client._transport.write_eof()
            await wait_until(lambda: served._input_end == ENDED, 5)  # the FIN was read
            go.set()
            assert await asyncio.wait_for(call, 5) == 42
            await asyncio.wait_for(asyncio.shield(served.closed), 5)
            await asyncio.wait_for(asyncio.shield(client.closed), 5)


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_our_call_to_a_peer_that_half_closed_fails_at_once(scheme: str) -> None:
    """The server's handler calls the client back, then the client half-closes: that call
    fails with ConnectionClosed at once (not at its 10-s timeout), and so does a new one;
    the handler's own answer still reaches the client."""
    started = asyncio.Event()
    failures: list[BaseException] = []
    reg = rpc.Registry()

    @reg.handle("ask")
    async def ask(value: Any) -> Any:
        peer = rpc.current_peer.get()
        pending = asyncio.ensure_future(peer.request("answer", value, timeout=10))
        started.set()
        for attempt in (pending, peer.request("answer", value, timeout=10)):
            try:
                await attempt
            except ConnectionClosed as exc:
                failures.append(exc)
        return "asked"

    client_reg = rpc.Registry()
    never = asyncio.Event()

    @client_reg.handle("answer")
    async def answer(value: Any) -> Any:
        await never.wait()

    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=reg) as server:
        async with rpc.connect(str(server.url), registry=client_reg, reconnect=False) as client:
            call = asyncio.ensure_future(client.request("ask", 1, timeout=5))
            await asyncio.wait_for(started.wait(), 5)
            [served] = server.peers
            await wait_until(lambda: served.has_call(_first_call_key(served)), 5)
            client._transport.write_eof()
            assert await asyncio.wait_for(call, 3) == "asked"
            never.set()  # the client's handler ends: its close has nothing to wait for
    assert len(failures) == 2 and all(isinstance(f, ConnectionClosed) for f in failures)


def _first_call_key(peer: Any) -> Any:
    """The key of a call the peer has in flight (None: none yet)."""
    return next(iter(peer._calls), None)


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_half_close_with_nothing_to_answer_closes_at_once(scheme: str) -> None:
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=reg) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            assert await client.request("echo", 3, timeout=5) == 3
            [served] = server.peers
            client._transport.write_eof()
            await asyncio.wait_for(asyncio.shield(served.closed), 2)
            await asyncio.wait_for(asyncio.shield(client.closed), 2)


def _answer(rid: int, payload: bytes) -> bytes:
    return b"R" + rid.to_bytes(4, "little") + b"%08x" % len(payload) + payload


async def test_a_request_kept_behind_max_concurrent_runs_after_the_half_close() -> None:
    """max_concurrent=1, no retry results: the second request waits kept while the first
    runs; the client half-closes. Both answers come, well before the drain's end. (Review
    190 of 536ca3a: the close began as a task of the notification task set took its only
    slot, which held the kept request for good.)"""
    go = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        await go.wait()
        return value * 2

    options = rpc.Options(max_concurrent=1, timeout=2.5)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01" + _gotalk_request(1, b"slow", b"20"))
            writer.write(_gotalk_request(2, b"slow", b"1"))
            writer.write_eof()
            await wait_until(lambda: len(server.peers) == 1, 2)
            [served] = server.peers
            await wait_until(lambda: served._input_end == ENDED, 2)  # the FIN was read
            go.set()
            data = b""
            try:
                async with asyncio.timeout(1.5):  # (the drain would end at 2.5 s)
                    while _answer(2, b"2") not in data:
                        chunk = await reader.read(65536)
                        if not chunk:
                            break
                        data += chunk
            except TimeoutError:
                pass
        finally:
            writer.close()
    assert _answer(1, b"40") in data
    assert _answer(2, b"2") in data, "the kept request never ran after the FIN"


async def test_the_read_timeout_does_not_abort_a_half_closed_client_before_its_answer() -> None:
    """A half-closed client sends nothing more, heartbeats included: Gotalk's read_timeout
    must not abort the drain the half-close began (review 190 of 536ca3a: it did, and the
    answer was dropped). Here read_timeout=0.3, Options.timeout=3, the handler 0.8 s."""
    reg = rpc.Registry()
    started = asyncio.Event()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        started.set()
        await asyncio.sleep(0.8)  # (the work being answered, not a synchronisation)
        return value * 2

    options = rpc.Options(timeout=3)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, read_timeout=0.3
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01" + _gotalk_request(1, b"slow", b"20"))
            writer.write_eof()
            await asyncio.wait_for(started.wait(), 2)
            data = await asyncio.wait_for(reader.read(), 2.5)  # up to the server's FIN
        finally:
            writer.close()
    assert _answer(1, b"40") in data, f"answer dropped: {data!r}"


async def test_a_half_close_with_only_a_long_on_connect_running_closes_at_once() -> None:
    """An async on_connect that lives as long as the connection (a push loop, say) owes
    the client no answer: a client that sends its version and half-closes at once is
    closed at once, as before 536ca3a (review 190: it was kept the whole drain)."""
    gate = asyncio.Event()

    async def on_connect(peer: Any) -> None:
        await gate.wait()

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", on_connect=on_connect) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            writer.write_eof()
            data = await asyncio.wait_for(reader.read(), 1.5)  # up to the server's FIN
        finally:
            writer.close()
            gate.set()
    assert data.startswith(b"01")


async def test_chatter_pings_do_not_abort_a_half_closed_client_before_its_answer() -> None:
    """As the read timeout above, for Chatter: no Pong can come from a half-closed client,
    so the server's Pings stop rather than close the connection at their timeout (0.2 s
    here, with Pings after 0.2 s of silence) before the 0.8-s handler's answer."""
    reg = rpc.Registry()
    started = asyncio.Event()

    @reg.handle("slow")
    async def slow(value: Any) -> Any:
        started.set()
        await asyncio.sleep(0.8)  # (the work being answered, not a synchronisation)
        return value * 2

    options = rpc.Options(timeout=3)
    async with rpc.serve(
        "tcp+sbs://127.0.0.1:0", registry=reg, options=options, ping_interval=0.2, ping_timeout=0.2
    ) as server:
        async with rpc.connect(str(server.url), reconnect=False, ping_interval=None) as client:
            call = asyncio.ensure_future(client.request("slow", 21, timeout=3))
            await asyncio.wait_for(started.wait(), 2)
            client._transport.write_eof()
            assert await asyncio.wait_for(call, 2.5) == 42
