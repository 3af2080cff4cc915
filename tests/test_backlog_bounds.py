"""The bound of the backlog kept while our output waits (rpc/backlog.py, rpc/peer.py), each
shown by a peer on a raw socket on 127.0.0.1 that floods a server and never reads its
answers: messages larger than a read, Chatter type names, room that stream handlers free,
and a notification that refused to run. Each test failed on the code of c6ead1a/e401041
(found in review by helper-88; the figures are in each test's docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from rpc.backlog import OVERHEAD
from rpc.responder import NotificationsHeld
from tests.rpc_helpers import echo_registry
from tests.rpc_helpers import wait_until as until
from wire import gotalk
from wire.chatter import Dialect, Msg, encode_frame

pytestmark = [pytest.mark.both_loops, pytest.mark.timeout(60)]
KIB = 1024
MB = 1024 * 1024
READ = 256 * KIB
"""The most one read takes (transports.read_buffer.READ_SIZE)."""
OPTIONS = {"high_water": 64 * KIB, "low_water": 16 * KIB}


@contextlib.asynccontextmanager
async def non_reader(port: int) -> AsyncIterator[asyncio.StreamWriter]:
    """A raw TCP connection that never reads (a tiny receive buffer): the server's output
    to it soon waits above ``high_water``."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        yield writer
    finally:
        writer.transport.abort()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def gotalk_request(rid: int, op: str, payload: bytes) -> bytes:
    return gotalk.encode(gotalk.Request(rid.to_bytes(4, "big"), op, payload))


def blockers() -> bytes:
    """Requests for 1 MiB results: the first few fill the socket buffers and the output."""
    return b"".join(gotalk_request(i, "big", b"1048576") for i in range(1, 41))


async def test_requests_larger_than_a_read_stop_at_the_bound() -> None:
    """Requests of 400 kB (each read completes at most one) from a peer that never reads:
    reading must pause once the backlog holds ``max_request_bytes`` (plus the rest of a
    read and one message). Failed on c6ead1a: Peer._hold paused only when Backlog.take
    stopped before the end of the read's messages; the message that fills the backlog is
    the last (only) one of its read, so reading never paused and every request was kept
    (3.6-4.4 MB of 12 MB sent by the time the test looked, against a bound of 2 MiB;
    without limit in general)."""
    limit = 2 * MB
    options = rpc.Options(max_request_bytes=limit, **OPTIONS)
    payload = b'"' + b"x" * 400_000 + b'"'
    flood = b"".join(gotalk_request(1000 + i, "echo", payload) for i in range(30))
    bound = limit + 2 * READ + len(payload) + OVERHEAD
    url = "tcp+gotalk://127.0.0.1:0"
    async with rpc.serve(url, registry=echo_registry(), options=options) as srv:
        async with non_reader(srv.url.port) as writer:
            writer.write(b"01" + blockers() + flood)
            await until(lambda: len(srv.peers) == 1)
            [peer] = srv.peers
            kept = peer._kept
            await until(lambda: kept.bytes > bound or (not peer.reading and kept.full), 20)
            assert peer.outbox.blocked
            assert kept.bytes <= bound, (kept.bytes, len(kept.messages), peer.reading)


@pytest.mark.parametrize(
    "head", ["x", "\U0001f600" * 4000, "\U0001f600"], ids=["ascii", "four-byte", "mixed"]
)
async def test_chatter_type_names_count_against_the_bound(head: str) -> None:
    """Chatter requests with a 16 kB type (UTF-8, as sent) and no data from a peer that
    never reads: the memory the backlog holds must stay near ``max_request_bytes``. Failed
    on c6ead1a: rpc.backlog.size() counted a Msg's ``data`` alone (plus OVERHEAD, 256), so
    each 16 kB request counted 256 bytes: 1,031 of them (15.9 MB) fit a bound of 256 KiB;
    with the defaults, 16,384 messages of up to ``max_size`` (16 MiB) each. The four-byte
    case failed on 80814ad (names counted in characters: 992 kB held where 803 kB may), the
    mixed one (a four-byte character, then ASCII: 64 kB in memory) on 95785c1 (names
    counted in UTF-8 bytes: 1.9 MB held; found in review by helper-91)."""
    limit = 256 * KIB
    options = rpc.Options(max_request_bytes=limit, **OPTIONS)
    frames = [
        encode_frame(Msg(i, i, True, True, False, "big", b"1048576"), Dialect.CURRENT)
        for i in range(1, 41)
    ]
    name = head + "x" * (16_000 - len(head.encode()))
    frames += [
        encode_frame(Msg(i, i, True, True, False, f"{name}{i}", b""), Dialect.CURRENT)
        for i in range(41, 2041)
    ]
    url = "tcp+sbs://127.0.0.1:0?dialect=HatChatter"
    async with rpc.serve(url, registry=echo_registry(), options=options) as srv:
        async with non_reader(srv.url.port) as writer:
            writer.write(b"".join(frames))
            await until(lambda: len(srv.peers) == 1)
            [peer] = srv.peers
            kept = peer._kept
            await until(lambda: not peer.reading and kept.full, 20)
            held = sum(sys.getsizeof(m.type) + len(m.data) for m in kept.messages)
            assert held <= limit + 2 * READ + 16 * KIB, (held, len(kept.messages), kept.bytes)


async def test_stream_parts_taken_let_the_backlog_fill_again() -> None:
    """A stream handler's unread parts (700 kB) and the requests kept while the output
    waits share ``max_request_bytes`` (1 MiB); once the backlog is full, reading pauses.
    When the handler then takes its parts (and waits for more), the room they leave must
    let reading resume until the backlog holds the bound. Failed on c6ead1a: StreamQueue.take
    releases the bytes through RequestBytes.release, which called back (Peer._task_done)
    only when ``used`` itself crossed the limit; ``used`` was below it (the backlog's bytes
    made it full), so nothing gave the peer a turn and reading stayed paused (the backlog
    at about 550 kB until the test's timeout)."""
    limit = 1 * MB
    options = rpc.Options(max_request_bytes=limit, **OPTIONS)
    reg = echo_registry()
    go = asyncio.Event()
    taken: list[Any] = []

    @reg.handle_stream("upload")
    async def upload(parts: Any) -> int:
        await go.wait()
        async for part in parts:
            taken.append(part)
        return len(taken)

    sid = (1).to_bytes(4, "big")
    part = b'"' + b"p" * 100_000 + b'"'
    upload_msgs = gotalk.encode(gotalk.StreamRequest(sid, "upload", b"")) + b"".join(
        gotalk.encode(gotalk.StreamRequestPart(sid, part)) for _ in range(7)
    )
    echo = b'"' + b"e" * 60_000 + b'"'
    flood = b"".join(gotalk_request(1000 + i, "echo", echo) for i in range(100))
    url = "tcp+gotalk://127.0.0.1:0"
    async with rpc.serve(url, registry=reg, options=options) as srv:
        async with non_reader(srv.url.port) as writer:
            writer.write(b"01" + upload_msgs + blockers() + flood)
            await until(lambda: len(srv.peers) == 1)
            [peer] = srv.peers
            kept = peer._kept
            await until(lambda: not peer.reading and kept.full, 20)
            assert peer.outbox.blocked and peer._request_bytes.used >= 7 * len(part)
            go.set()
            await until(lambda: len(taken) == 7)
            assert peer._request_bytes.used == 0  # room for the backlog: it must read on
            await until(lambda: kept.bytes >= limit, 5)
            await until(lambda: not peer.reading)  # and it pauses there again
            assert limit <= kept.bytes <= limit + 2 * READ + len(echo) + OVERHEAD


async def test_a_refused_notification_keeps_reading_paused_while_output_waits() -> None:
    """A notification handler refuses (NotificationsHeld, as the Eventer client's deliveries
    do past their bytes) while a task of its own waits: reading pauses with it first in the
    backlog. Our output then backs up (answers to requests that were waiting) and the task
    ends: its end gives the peer a turn, which cannot try the notification again while the
    output waits, yet reading must stay paused until it has run. Failed on e401041: that
    turn found no refusal (the notification was not tried), so reading resumed and the
    flood that followed it was read into the backlog (up to its bound)."""
    reg = echo_registry()
    go, end = asyncio.Event(), asyncio.Event()
    refusals: list[str] = []

    @reg.handle("later")
    async def later(size: int) -> bytes:
        await go.wait()
        return b"x" * size

    @reg.handle_notification("wait")
    async def wait(value: Any) -> None:
        await end.wait()

    @reg.handle_notification("gate")
    def gate(value: Any) -> None:
        refusals.append(value)
        raise NotificationsHeld

    later_requests = b"".join(gotalk_request(i, "later", b"2097152") for i in range(1, 9))
    notifications = b"".join(
        gotalk.encode(gotalk.Notification(name, b'"n"')) for name in ("wait", "gate")
    )
    echo = b'"' + b"e" * 100_000 + b'"'
    flood = b"".join(gotalk_request(1000 + i, "echo", echo) for i in range(40))
    options = rpc.Options(**OPTIONS)
    url = "tcp+gotalk://127.0.0.1:0"
    async with rpc.serve(url, registry=reg, options=options) as srv:
        async with non_reader(srv.url.port) as writer:
            writer.write(b"01" + later_requests + notifications + flood)
            await until(lambda: len(srv.peers) == 1)
            [peer] = srv.peers
            kept = peer._kept
            await until(lambda: refusals and not peer.reading)
            assert peer.handlers_running == 9 and not peer.outbox.blocked
            held = len(kept.messages)
            go.set()  # 16 MiB of answers: the output waits
            await until(lambda: peer.outbox.blocked)
            end.set()  # the task ends: a turn at the backlog
            await until(lambda: not peer._tasks and kept.turn is None)
            assert peer.outbox.blocked and refusals == ["n"]
            assert not peer.reading and len(kept.messages) == held, (len(kept.messages), held)


async def test_a_notification_refused_once_the_output_drained_pauses_reading() -> None:
    """While our output waits the peer is read and a notification is kept; the output then
    drains and the turn that follows runs it: its handler refuses (NotificationsHeld).
    Reading, still on from the wait, must pause there, or every later read is kept (up to
    the backlog's bound) behind a notification that cannot run. Failed on 415a4cb: the turn
    paused nothing, as reading was on already (found in review)."""
    reg = echo_registry()
    refusals: list[str] = []

    @reg.handle_notification("gate")
    def gate(value: Any) -> None:
        refusals.append(value)
        raise NotificationsHeld

    size = 15 * MB  # a result past both sockets' buffers (10 MB here): the output waits
    blocker = gotalk_request(1, "big", str(size).encode())
    notification = gotalk.encode(gotalk.Notification("gate", b'"n"'))
    options = rpc.Options(**OPTIONS)
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, options=options) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.url.port)
        try:
            writer.write(b"01" + blocker + notification)
            await until(lambda: len(srv.peers) == 1)
            [peer] = srv.peers
            await until(lambda: peer.outbox.blocked and len(peer._kept.messages) == 1)
            assert peer.reading and not refusals  # kept, unrun, while the output waits
            drained = asyncio.ensure_future(reader.readexactly(2 + 13 + size))
            await until(lambda: refusals)  # drained: the turn ran the notification
            assert not peer.reading and peer._kept.refused is not None
            assert len(await drained) == 2 + 13 + size
        finally:
            writer.transport.abort()
