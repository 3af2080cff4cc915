"""A peer that begins a message and sends the rest a byte now and then is closed once it falls
under ``min_receive_rate`` past ``receive_grace`` (rpc.message_stall); before, every byte
reset the silence limits and such a peer held its connection for good. A peer that keeps
up, or whose input we hold ourselves, is not closed, nor one whose bytes waited while our
own loop was busy, nor a WebSocket peer whose large frame comes quickly but takes longer
than the grace (the last three failed on 02c1f63: found in review by helper-97)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any

import pytest

import rpc
from tests.gotalk_raw import RawGotalk, served_raw
from tests.rpc_helpers import wait_until
from tests.test_web_hostile import RawClient, close_writer
from transports.web_http import HttpOptions
from wire import gotalk

pytestmark = pytest.mark.both_loops

STRICT = rpc.Options(min_receive_rate=1000.0, receive_grace=0.3)
"""Closed after 0.3 s under 1,000 bytes a second (the default grace is 10 s)."""


def echo_registry() -> rpc.Registry:
    reg = rpc.Registry()
    reg.handle("echo")(lambda value: value)
    return reg


async def trickle(transport: Any, every: float) -> None:
    """The attacker: one byte every ``every`` seconds, for as long as it is let (uvloop's
    transports raise on a write once closed)."""
    while not transport.is_closing():
        transport.write(b"x")
        await asyncio.sleep(every)


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    received = b""
    while data := await reader.read(65536):
        received += data
    return received


async def test_a_gotalk_peer_trickling_a_message_is_closed_with_a_timeout_fault() -> None:
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=echo_registry(), options=STRICT
    ) as server:
        raw = await RawGotalk.connect(server.url.port)
        header = gotalk.request_header(gotalk.MessageType.REQUEST, b"0001", "echo", 1000)
        raw.writer.write(header + b'"')
        dripping = asyncio.ensure_future(trickle(raw.writer.transport, 0.05))  # 20 bytes a second
        try:
            async with asyncio.timeout(5):  # (each byte reset the 30-s read timeout)
                received = await read_to_end(raw.reader)
        finally:
            dripping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dripping
            await raw.close()
        assert received.endswith(gotalk.GotalkConnection().fault(gotalk.ErrorCode.TIMEOUT))
        await wait_until(lambda: not server.peers)


async def test_a_chatter_peer_trickling_a_frame_is_closed() -> None:
    async with rpc.serve(
        "tcp+sbs://127.0.0.1:0", registry=echo_registry(), options=STRICT
    ) as server:
        url = f"tcp+sbs://127.0.0.1:{server.url.port}"
        async with rpc.connect(url, reconnect=False) as peer:
            assert await peer.request("echo", 1) == 1  # a whole first frame: no handshake limit
            peer.transport.write(b"\x02\x03\xe8x")  # a frame of 1,000 bytes begun
            dripping = asyncio.ensure_future(trickle(peer.transport, 0.05))
            try:
                async with asyncio.timeout(5):  # (each byte put off the 30-s Ping)
                    await peer.closed
            finally:
                dripping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await dripping
        await wait_until(lambda: not server.peers)


async def test_a_large_message_sent_slowly_but_above_the_rate_is_served() -> None:
    """60 kB in 3-kB pieces every 50 ms (about 1 s, past the 0.3-s grace, at about 60 kB a
    second): above 1,000 bytes a second on average, so it is served."""
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=echo_registry(), options=STRICT
    ) as server:
        raw = await RawGotalk.connect(server.url.port)
        try:
            payload = b'"' + b"y" * 59_998 + b'"'
            message = (
                gotalk.request_header(gotalk.MessageType.REQUEST, b"0001", "echo", len(payload))
                + payload
            )
            for start in range(0, len(message), 3000):
                raw.writer.write(message[start : start + 3000])
                await asyncio.sleep(0.05)  # the pace of a slow link (not a wait for anything)
            async with asyncio.timeout(5):
                while isinstance(answer := await raw.next(), gotalk.Notification):
                    pass
            assert answer == gotalk.Result(b"0001", payload)
        finally:
            await raw.close()


async def test_input_we_hold_does_not_count_against_the_rate() -> None:
    """A message begun in a read that also filled the backlog (the one slot taken, no retry
    results): reading pauses with it unfinished. The check comes due meanwhile and waits
    (the bytes wait unread, not the peer); once reading resumes the peer sends the rest
    and is answered."""
    gate = asyncio.Event()
    reg = echo_registry()

    @reg.handle("hold")
    async def hold(value: Any) -> Any:
        await gate.wait()
        return value

    options = rpc.Options(
        max_concurrent=1, max_request_bytes=1000, min_receive_rate=1000.0, receive_grace=0.3
    )
    async with served_raw(reg, options, retry_results=False) as (raw, peer):
        raw.request_alone(b"0001", "hold", b"1")
        await wait_until(lambda: peer.handlers_running == 1)
        kept = b"".join(
            gotalk.request_header(gotalk.MessageType.REQUEST, b"%04d" % n, "echo", 1) + b"2"
            for n in range(2, 6)
        )  # four kept: 4 x 257 bytes counted fill the backlog (1,000)
        rest = b'"' + b"z" * 98 + b'"'
        begun = gotalk.request_header(gotalk.MessageType.REQUEST, b"0009", "echo", 100)
        raw.writer.write(kept + begun + rest[:10])
        await wait_until(lambda: not peer.reading and peer.deadlines.when("message"))
        first = peer.deadlines.when("message")
        await wait_until(lambda: (peer.deadlines.when("message") or 0) > first)  # came due
        assert peer.is_open and not peer.reading
        gate.set()  # the slot frees: the kept requests run, reading resumes
        await wait_until(lambda: peer.reading)
        raw.writer.write(rest[10:])
        answers: dict[bytes, Any] = {}
        async with asyncio.timeout(5):
            while len(answers) < 6:
                answer = await raw.next()
                if isinstance(answer, gotalk.Result):
                    answers[answer.id] = answer.payload
        assert answers[b"0009"] == rest and answers[b"0001"] == b"1"


async def paced(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write ``data`` in 3,000-byte pieces every 50 ms: a slow link at about 60 kB a second;
    fails at once if the server closed the connection meanwhile."""
    for start in range(0, len(data), 3000):
        assert not writer.transport.is_closing(), "the server closed the connection"
        writer.write(data[start : start + 3000])
        await asyncio.sleep(0.05)  # the pace of a slow link (not a wait for anything)
        if writer.transport.is_closing() or writer.is_closing():
            pytest.fail("the server closed the connection while the message came")


async def test_a_websocket_gotalk_payload_frame_arriving_fast_but_longer_than_the_grace() -> None:
    """Gotalk over WebSocket sends a message's header and payload as one frame each (as our
    own client and gotalk.js do). The sink sees the header at once, then nothing until the
    payload frame is whole: a 60-kB payload sent at about 60 kB a second (sixty times the
    least rate) over about a second (past the 0.3-s grace) looks like 0 bytes since the
    message began, and the peer is closed. (Default: a 16-MiB payload over a link slower
    than 1.6 MiB a second.)"""
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=echo_registry(),
        options=STRICT,
        web=HttpOptions(allow_missing_origin=True),
    ) as server:
        client = await RawClient.open(server.url.port)
        try:
            assert client.ws.state.name == "OPEN"
            payload = b'"' + b"y" * 59_998 + b'"'
            header = gotalk.request_header(gotalk.MessageType.REQUEST, b"0001", "echo", 60_000)
            client.ws.send_binary(b"01")
            client.ws.send_binary(header)
            client.flush()
            client.ws.send_binary(payload)
            frame = b"".join(client.ws.data_to_send())
            await paced(client.writer, frame)
            assert await client.gotalk_results() == [gotalk.Result(b"0001", payload)]
        finally:
            await close_writer(client.writer)


async def test_bytes_that_came_while_our_loop_was_busy_count_as_the_peers() -> None:
    """A plain handler that keeps the loop busy (here 0.6 s, past the 0.3-s grace) while the
    rest of a message already sits in the socket: the bytes wait unread because of us, not
    the peer. On uvloop the check's timer runs before the loop polls the socket (libuv runs
    due timers first), so it finds only the 30 bytes of the first read and closes a peer
    that sent all of it at once (asyncio reads first: passes)."""
    busy = threading.Event()
    reg = echo_registry()

    @reg.handle("busy")
    def keep_busy(value: Any) -> Any:
        busy.set()
        time.sleep(0.6)  # the loop is busy (a plain handler's CPU work), not a wait for anything
        return value

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, options=STRICT) as server:
        port = server.url.port
        payload = b'"' + b"z" * 998 + b'"'
        head = gotalk.request_header(gotalk.MessageType.REQUEST, b"0002", "echo", len(payload))
        first = gotalk.request_header(gotalk.MessageType.REQUEST, b"0001", "busy", 1) + b"1"

        answer = b"R0002" + b"%08x" % len(payload) + payload

        def peer() -> bytes:
            """The peer, in a thread: it sends while the server's loop is busy."""
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(b"01" + first + head + payload[:10])
                assert busy.wait(5)
                sock.sendall(payload[10:])  # all of it, while the server's loop is busy
                sock.settimeout(5)
                received = b""
                while not received.endswith(answer) and (data := sock.recv(65536)):
                    received += data
                return received

        received = await asyncio.wait_for(asyncio.to_thread(peer), 10)
        assert received.endswith(answer), f"closed instead: {received[-40:]!r}"


async def slow_link(target: int) -> asyncio.Server:
    """A loopback proxy to ``target`` whose downstream (server to client) carries about 60 kB
    a second (3,000 bytes every 50 ms); upstream goes as it comes."""

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slow: bool) -> None:
        try:
            while data := await reader.read(3000 if slow else 65536):
                writer.write(data)
                await writer.drain()
                if slow:
                    await asyncio.sleep(0.05)  # the link's pace (not a wait for anything)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))

    return await asyncio.start_server(accept, "127.0.0.1", 0)


async def test_our_websocket_client_takes_a_large_result_over_a_slow_link() -> None:
    """The client side of the same: our own Gotalk WebSocket server sends a 60-kB result
    (header frame, payload frame) over a link of about 60 kB a second; our client, with the
    same options, sees 0 bytes of it for a second and closes its own connection."""
    reg = rpc.Registry()
    reg.handle("big")(lambda value: "y" * 60_000)
    async with rpc.serve("ws+gotalk://127.0.0.1:0/gotalk/", registry=reg) as server:
        link = await slow_link(server.url.port)
        async with link:
            port = link.sockets[0].getsockname()[1]
            url = f"ws+gotalk://127.0.0.1:{port}/gotalk/"
            async with rpc.connect(url, options=STRICT, reconnect=False) as peer:
                result = await asyncio.wait_for(peer.request("big", 1), 10)
                assert result == "y" * 60_000
