"""A peer that begins a message and sends the rest a byte now and then is closed once it falls
under ``min_receive_rate`` past ``receive_grace`` (rpc.message_stall); before, every byte
reset the silence limits and such a peer held its connection for good. A peer that keeps
up, or whose input we hold ourselves, is not closed."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import rpc
from tests.gotalk_raw import RawGotalk
from tests.rpc_helpers import wait_until
from wire import gotalk

STRICT = rpc.Options(min_receive_rate=1000.0, receive_grace=0.3)
"""Closed after 0.3 s under 1,000 bytes a second (the default grace is 10 s)."""


def echo_registry() -> rpc.Registry:
    reg = rpc.Registry()
    reg.handle("echo")(lambda value: value)
    return reg


async def trickle(write: Any, every: float) -> None:
    """The attacker: one byte every ``every`` seconds, for as long as it is let."""
    while True:
        write(b"x")
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
        dripping = asyncio.ensure_future(trickle(raw.writer.write, 0.05))  # 20 bytes a second
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
            dripping = asyncio.ensure_future(trickle(peer.transport.write, 0.05))
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
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        raw = await RawGotalk.connect(server.url.port)
        try:
            await wait_until(lambda: len(server.peers) == 1)
            [peer] = server.peers
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
        finally:
            await raw.close()
