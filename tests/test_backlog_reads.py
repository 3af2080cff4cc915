"""A byte stream reads 4 KiB at a time while its backlog keeps messages
(``rpc.backlog.KEPT_READ_SIZE``): what that bounds, as docs/limits.md states it, and large
requests kept meanwhile still arriving whole, over TCP and TLS (from review 203 of
c329770)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator

import pytest

import rpc
from rpc.backlog import KEPT_READ_SIZE, MAX_MESSAGES
from tests.certs import Pki
from tests.rpc_helpers import echo_registry
from tests.rpc_helpers import wait_until as until
from transports.stream import server_ssl_context
from wire import gotalk

pytestmark = pytest.mark.timeout(30)
MB = 1024 * 1024


@contextlib.asynccontextmanager
async def raw_connection(port: int) -> AsyncIterator[asyncio.StreamWriter]:
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield writer
    finally:
        writer.transport.abort()


@pytest.mark.both_loops
async def test_a_kept_read_of_the_smallest_messages_passes_the_bound_by_at_most_a_read() -> None:
    """Once the backlog keeps messages a read takes 4 KiB (rpc.backlog.KEPT_READ_SIZE): a
    Gotalk notification with a one-character name and no payload is 13 bytes, so the read
    that fills the backlog passes MAX_MESSAGES by up to 315 of them (with 16-KiB reads, up
    to 1,260, not "at most about 900" as c329770's docs said)."""
    options = rpc.Options(high_water=64 * 1024, low_water=16 * 1024, max_request_bytes=64 * MB)
    big = [gotalk.encode(gotalk.Request(i.to_bytes(4, "big"), "big", b"1048576")) for i in range(8)]
    tiny = gotalk.encode(gotalk.Notification("x", b""))
    assert len(tiny) == 13
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=echo_registry(), options=options
    ) as srv:
        async with raw_connection(srv.url.port) as writer:
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            writer.write(b"01" + b"".join(big) + tiny * 40_000)
            await until(lambda: any(not p.reading and p._kept.full for p in srv.peers))
            [attacker] = srv.peers
            kept = len(attacker._kept.messages)
            assert MAX_MESSAGES <= kept <= MAX_MESSAGES + KEPT_READ_SIZE // len(tiny), kept


@pytest.mark.both_loops
async def test_the_read_that_starts_the_backlog_is_decoded_a_slice_at_a_time() -> None:
    """The read in which our output comes to wait starts with an empty backlog, so it
    takes up to 256 KiB (up to 20,164 tiny notifications), but is decoded 4 KiB at a time
    (``rpc.peer.Peer._read``): the rest waits undecoded, and the backlog passes
    MAX_MESSAGES by at most a slice, as with 4-KiB reads. (Before, the whole read was
    decoded and kept at once: 17,633 kept here on asyncio's loop.)"""
    options = rpc.Options(high_water=64 * 1024, low_water=16 * 1024, max_request_bytes=64 * MB)
    # eight: the kernel's send buffer (autotuned up to 4 MiB) takes fewer of the 1 MiB answers
    big = b"".join(
        gotalk.encode(gotalk.Request(i.to_bytes(4, "big"), "big", b"1048576")) for i in range(8)
    )
    tiny = gotalk.encode(gotalk.Notification("x", b""))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MB)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=echo_registry(), options=options
    ) as srv:
        try:
            sock.connect(("127.0.0.1", srv.url.port))
            await until(lambda: len(srv.peers) == 1)
            [attacker] = srv.peers
            theirs = attacker.transport.get_extra_info("socket")
            theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MB)
            sock.settimeout(5)
            sock.sendall(b"01" + big + tiny * 20_000)  # all in the server's buffer: one read
            await until(lambda: not attacker.reading and attacker._kept.full)
            kept = len(attacker._kept.messages)
            assert MAX_MESSAGES <= kept <= MAX_MESSAGES + KEPT_READ_SIZE // len(tiny), kept
        finally:
            sock.close()


@pytest.mark.both_loops
@pytest.mark.parametrize("scheme", ["tcp", "ssl"])
async def test_large_requests_read_in_small_reads_while_kept_arrive_whole(
    scheme: str, pki: Pki
) -> None:
    """Requests of 300 kB and 4 MB kept while our output waits (a client that reads its
    first, 1 MB, answer late) are read 4 KiB at a time, over TCP and TLS, and still
    arrive whole and are answered once it reads."""
    options = rpc.Options(high_water=64 * 1024, low_water=16 * 1024, max_size=32 * MB)
    server_ssl = client_ssl = None
    if scheme == "ssl":
        server_ssl = server_ssl_context(pki.server_cert, pki.server_key)
        client_ssl = ssl.create_default_context(cafile=str(pki.ca))
    payloads = [b'"' + bytes([97 + i]) * size + b'"' for i, size in enumerate([300_000, 4 * MB])]
    async with rpc.serve(
        f"{scheme}+gotalk://127.0.0.1:0", registry=echo_registry(), options=options, ssl=server_ssl
    ) as srv:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", srv.url.port))
        reader, writer = await asyncio.open_connection(
            sock=sock,
            ssl=client_ssl,
            server_hostname="localhost" if client_ssl else None,
            limit=16 * MB,
        )
        try:
            writer.transport.pause_reading()
            bigs = [gotalk.Request(b"%04d" % i, "big", b"12582912") for i in range(2)]
            # (two: over TLS the first write goes to the socket's transport whole, unseen)
            writer.write(b"01" + b"".join(map(gotalk.encode, bigs)))
            await until(lambda: any(p.outbox.blocked for p in srv.peers))
            [peer] = srv.peers
            for i, payload in enumerate(payloads, 1):
                writer.write(gotalk.encode(gotalk.Request(b"%04d" % (i + 1), "echo", payload)))
            kept = peer._kept.messages  # (the second "big" too, when it came in the same read)
            await until(lambda: kept and kept[-1].id == b"0003", timeout=10)
            writer.transport.resume_reading()
            codec = gotalk.GotalkConnection(max_size=32 * MB)
            got: list[gotalk.Message] = []
            while len(got) < 2 + len(payloads):
                got += codec.receive_data(await asyncio.wait_for(reader.read(1 << 20), 10))
            assert [m.id for m in got] == [b"0000", b"0001", b"0002", b"0003"]
            assert [m.payload for m in got[2:]] == payloads  # type: ignore[union-attr]
        finally:
            writer.close()
