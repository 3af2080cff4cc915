"""A large read is decoded a slice at a time (``rpc.peer.Peer._read``): up to
``KEPT_READ_SIZE`` bytes past the message in progress per slice, and after a turn's worth
of messages the rest waits undecoded for the connection's next turn. What arrives in such a
read is still answered whole and in order, over TCP and TLS, and a graceful close that
begins while the rest waits still runs it (it was read before the close). Over WebSocket
a slice cut inside a request does not count as input the peer left unfinished (review 219:
an idle client was closed as too slow, 1008)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

import pytest
from websockets.frames import Close, Opcode

import rpc
from tests.certs import Pki
from tests.rpc_helpers import echo_registry
from tests.rpc_helpers import wait_until as until
from tests.test_ws_slow_input import ws_client
from transports.stream import server_ssl_context
from wire import gotalk

pytestmark = pytest.mark.timeout(60)
MB = 1024 * 1024


def requests(first: int, count: int, payload: bytes = b'"ab"') -> list[bytes]:
    return [
        gotalk.encode(gotalk.Request(b"%04x" % i, "echo", payload))
        for i in range(first, first + count)
    ]


async def read_replies(reader: asyncio.StreamReader, count: int) -> list[gotalk.Message]:
    codec = gotalk.GotalkConnection(max_size=4 * MB)
    got: list[gotalk.Message] = []
    while len(got) < count:
        data = await asyncio.wait_for(reader.read(1 << 20), 20)
        assert data, f"closed after {len(got)} of {count} replies"
        got += codec.receive_data(data)
    return got


@pytest.mark.both_loops
@pytest.mark.parametrize("scheme", ["tcp", "ssl"])
async def test_every_request_of_large_reads_is_answered_in_order(scheme: str, pki: Pki) -> None:
    """20,000 small requests with a 1 MB one among them, written at once: reads of up to
    256 KiB, each decoded in slices, a slice cut past the large request's end. Every
    request is answered once, in order, with its own payload."""
    server_ssl = client_ssl = None
    if scheme == "ssl":
        server_ssl = server_ssl_context(pki.server_cert, pki.server_key)
        client_ssl = ssl.create_default_context(cafile=str(pki.ca))
    large = b'"' + b"L" * MB + b'"'
    frames = requests(0, 10_000) + requests(10_000, 1, large) + requests(10_001, 9_999)
    async with rpc.serve(
        f"{scheme}+gotalk://127.0.0.1:0",
        registry=echo_registry(),
        options=rpc.Options(max_size=4 * MB),
        ssl=server_ssl,
    ) as srv:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1",
            srv.url.port,
            ssl=client_ssl,
            server_hostname="localhost" if client_ssl else None,
            limit=4 * MB,
        )
        try:
            writer.write(b"01" + b"".join(frames))
            got = await read_replies(reader, len(frames))
        finally:
            writer.close()
    assert [m.id for m in got] == [b"%04x" % i for i in range(20_000)]
    payloads: list[Any] = [m.payload for m in got]  # type: ignore[union-attr]
    assert payloads[10_000] == large
    assert set(payloads[:10_000] + payloads[10_001:]) == {b'"ab"'}


@pytest.mark.both_loops
async def test_a_graceful_close_runs_the_rest_of_a_read_that_waits_undecoded() -> None:
    """The first request of a 256 KiB read begins a graceful close (in a task: at the next
    loop iteration, when the rest of the read waits undecoded for a turn). The close keeps
    that rest, read before it, and waits for it: all 8,000 requests are answered, then the
    connection closes (a raw Gotalk client takes no retry results: a request refused by
    the close would get no answer)."""
    reg = echo_registry()
    closes: list[asyncio.Task[None]] = []

    @reg.handle("close")
    def close(_value: Any) -> str:
        closes.append(asyncio.get_running_loop().create_task(rpc.current_peer.get().close()))
        return "closing"

    frames = [gotalk.encode(gotalk.Request(b"0000", "close", b"null")), *requests(1, 7_999)]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MB)
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as srv:
        sock.connect(("127.0.0.1", srv.url.port))
        await until(lambda: any(p.transport is not None for p in srv.peers))
        [theirs] = srv.peers  # its receive buffer takes the whole write: one read of 256 KiB
        theirs.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MB
        )
        sock.sendall(b"01" + b"".join(frames))
        reader, writer = await asyncio.open_connection(sock=sock, limit=4 * MB)
        try:
            got = await read_replies(reader, len(frames))
            assert await asyncio.wait_for(reader.read(), 10) == b""  # then it closed
        finally:
            writer.close()
        await asyncio.gather(*closes)
    assert [m.id for m in got] == [b"%04x" % i for i in range(8_000)]


@pytest.mark.both_loops
async def test_an_idle_ws_client_after_a_sliced_message_is_not_closed() -> None:
    """2,000 echo requests (24 bytes each, 48 KB) in one WebSocket message, all answered;
    then the client says nothing for 1 s (the grace is 0.3 s): it must not be closed. (The
    slice cut past the turn's 256 messages ends inside a request; before, the WebSocket
    connection's input-rate check counted from then, was never told the rest ended whole,
    and closed the client one grace or two later.)"""
    frames = [gotalk.encode(gotalk.Request(b"%04x" % i, "echo", b'"ab"')) for i in range(2000)]
    async with ws_client() as client:
        client.ws.send_binary(b"".join(frames))
        client.flush()
        got = await client.gotalk_results(len(frames))
        assert [m.id for m in got] == [b"%04x" % i for i in range(2000)]
        seen = len(client.frames)
        try:  # idle: nothing should come, and above all no close
            async with asyncio.timeout(1.0):
                await client.read_until_closed()
        except TimeoutError:
            pass
        closes = [Close.parse(f.data) for f in client.frames[seen:] if f.opcode is Opcode.CLOSE]
        assert not closes, f"an idle client was closed: {closes}"
