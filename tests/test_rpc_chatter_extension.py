"""How two Hat Chatter peers agree on peerwire's extension level (see
:mod:`rpc.chatter_extension`): the client's hello, the server's echo and offer, the client's
confirmation; peers written by hand on real sockets where the Pings on the wire are the
point."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest

import rpc
from rpc import chatter_extension
from tests.chatter_socket import ChatterSocket
from tests.rpc_helpers import timing_registry, wait_until
from wire import metadata, schemas
from wire.chatter import ChatterConnection, Conversation, Dialect

pytestmark = pytest.mark.timeout(30)

REPO = schemas.repository()
OFFER = b"peerwire-ext/3"


@pytest.mark.parametrize("offer", [True, False], ids=["level-3-server", "level-2-server"])
async def test_our_chatter_client_takes_level_3_only_when_offered(offer: bool) -> None:
    """A server written by hand: its codec echoes our hello, as every peerwire server's does,
    whatever level it speaks. Only a server that offers level 3 in a Ping of its own gets
    the default (and our confirmation); one that only echoes gets metadata per request."""
    accepted: asyncio.Queue[ChatterSocket] = asyncio.Queue()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(ChatterSocket(reader, writer, ChatterConnection(None)))

    async def answered_chatter(sock: ChatterSocket, call: Awaitable[Any]) -> list[Any]:
        task = asyncio.ensure_future(call)
        seen: list[Any] = []
        while True:
            msg = await sock.receive()
            if msg.type == "PeerwireRpc.Timeout":
                seen.append(metadata.decode_timeout_sbs(msg.data))
            elif msg.type == "PeerwireRpc.Meta":
                seen.append(("meta", metadata.decode_sbs(msg.data)[1].timeout_ms))
            else:
                seen.append(msg.type)
                reply_in = Conversation.of_received(msg)
                sock.conn.send("PeerwireRpc.Result", b"1", conversation=reply_in)
                sock.flush()
                await task
                return seen

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        url = f"tcp+sbs://127.0.0.1:{port}?dialect=HatChatter"
        async with rpc.connect(url, reconnect=False) as peer:
            sock = await accepted.get()
            await sock.pump_until(lambda: sock.conn.pings_received)
            assert sock.conn.last_ping_data == chatter_extension.HELLO == b"peerwire-ext/2"
            await wait_until(lambda: peer.adapter.metadata)  # our hello echoed: level 2
            if offer:
                sock.conn.send_ping(b"peerwire-ext/3")
                sock.flush()
                await sock.pump_until(lambda: sock.conn.pings_received == 2)
                assert sock.conn.last_ping_data == b"peerwire-ext/3"  # our confirmation
                assert peer.adapter.timeout_defaults
                [first, op] = await answered_chatter(sock, peer.request("op", timeout=2.0))
                assert 1995 <= first <= 2001 and op == "op"
                assert await answered_chatter(sock, peer.request("op", timeout=2.0)) == ["op"]
                assert await answered_chatter(sock, peer.request("op")) == [None, "op"]
            else:
                assert not peer.adapter.timeout_defaults
                for _ in range(2):
                    [meta, op] = await answered_chatter(sock, peer.request("op", timeout=2.0))
                    assert meta[0] == "meta" and 1990 <= meta[1] <= 2000 and op == "op"
            await sock.close()


@pytest.mark.parametrize("level", [3, 2])
async def test_our_chatter_server_bounds_requests_by_the_default(level: int) -> None:
    """Our server takes a client's hello (level 2) and offers level 3 in a Ping of its own;
    a client that confirms it has its requests without metadata bounded by its default. One
    that does not (a level-2 client: its codec only echoes the offer) has its
    ``PeerwireRpc.Timeout`` taken as an ordinary notification."""
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=timing_registry()) as server:
        sock = await ChatterSocket.connect("127.0.0.1", server.url.port, Dialect.CURRENT)
        conn = sock.conn

        def send(op: str, data: bytes, **kwargs: Any) -> int:
            msg = conn.send(op, data, **kwargs)
            sock.flush()
            return msg.id

        async def reply_to(first: int) -> tuple[str, Any]:
            msg = await sock.receive()
            assert msg.first == first and msg.last
            if msg.type == "PeerwireRpc.Error":
                return msg.type, REPO.decode(msg.type, msg.data)
            return msg.type, msg.data

        try:
            conn.send_ping(chatter_extension.HELLO)
            sock.flush()
            await sock.pump_until(lambda: conn.pongs_received and conn.pings_received)
            assert conn.last_ping_data == b"peerwire-ext/3"  # the server's offer
            if level == 3:
                conn.send_ping(b"peerwire-ext/3")  # the confirmation
            send("PeerwireRpc.Timeout", metadata.encode_timeout_sbs(300))
            if level == 2:  # served as if no default had come
                assert await reply_to(send("left", b"null", last=False)) == (
                    "PeerwireRpc.Result",
                    b"null",
                )
                return
            error = await reply_to(send("hang", b"null", last=False))
            assert error == ("PeerwireRpc.Error", "hang: the caller's deadline passed")
            left_type, left = await reply_to(send("left", b"null", last=False))
            assert left_type == "PeerwireRpc.Result" and 0 < float(left) <= 0.3 + 1e-6
            send("PeerwireRpc.Timeout", metadata.encode_timeout_sbs(None))
            assert await reply_to(send("left", b"null", last=False)) == (
                "PeerwireRpc.Result",
                b"null",
            )
        finally:
            await sock.close()


def test_a_chatter_hello_names_a_level() -> None:
    level_of = chatter_extension.level_of
    assert [level_of(b"peerwire-ext/%d" % n) for n in (1, 2, 3, 10)] == [1, 2, 3, 10]
    for junk in (b"", b"peerwire-ext/", b"peerwire-ext/x", b"peerwire-ext/" + b"9" * 5000):
        assert level_of(junk) is None


async def test_a_hello_or_a_confirmation_among_other_pings_is_seen() -> None:
    """The hello and the confirmation each come in one write with an empty Ping after them
    (one read): neither is hidden by it. The offer goes out once, however often the client
    says hello."""
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=timing_registry()) as server:
        sock = await ChatterSocket.connect("127.0.0.1", server.url.port, Dialect.CURRENT)
        conn = sock.conn
        try:
            conn.send_ping(chatter_extension.HELLO)
            conn.send_ping(b"")
            sock.flush()
            await sock.pump_until(lambda: conn.pings_received)
            assert conn.take_ping_data()[0] == [OFFER]
            conn.send_ping(OFFER)  # the confirmation
            conn.send_ping(b"")
            conn.send_ping(chatter_extension.HELLO)  # again: no second offer
            conn.send("PeerwireRpc.Timeout", metadata.encode_timeout_sbs(300))
            request = conn.send("hang", b"null", last=False)
            sock.flush()
            reply = await sock.receive()
            assert (reply.first, reply.type) == (request.id, "PeerwireRpc.Error")
            assert REPO.decode(reply.type, reply.data) == "hang: the caller's deadline passed"
            assert conn.take_ping_data()[0] == []  # no Ping with data since the offer
            [server_peer] = server.peers
            assert server_peer.adapter.handshake.level == 3
        finally:
            await sock.close()


async def test_a_server_made_with_extensions_on_answers_as_a_server() -> None:
    """``extensions`` only makes a peer that connects say hello: a server given it still
    takes a client's hello and offers level 3."""
    url = "tcp+sbs://127.0.0.1:0"
    async with rpc.serve(url, registry=timing_registry(), extensions=True) as server:
        client_url = f"tcp+sbs://127.0.0.1:{server.url.port}?dialect=HatChatter"
        async with rpc.connect(client_url, reconnect=False) as peer:
            await wait_until(lambda: peer.adapter.timeout_defaults)
            [server_peer] = server.peers
            await wait_until(lambda: server_peer.adapter.handshake.level == 3)
            left = await peer.request("left", timeout=2.0)
            assert 1.0 < left <= 2.0 + metadata.TIMEOUT_SLACK_MS / 1000


async def test_ping_data_in_the_legacy_dialect_is_no_hello() -> None:
    """The legacy dialect has no extension: a ``MsgPing`` carrying a hello's bytes (no Hat
    peer sends data) is answered with a Pong and nothing else; the connection goes on."""
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=timing_registry()) as server:
        sock = await ChatterSocket.connect("127.0.0.1", server.url.port, Dialect.LEGACY)
        conn = sock.conn
        try:
            conn.send("MsgPing", chatter_extension.HELLO, module="HatPing", token=True, last=False)
            request = conn.send("echo", b'"still"', last=False)
            sock.flush()
            reply = await sock.receive()
            assert (reply.first, reply.data) == (request.id, b'"still"')
            assert conn.pongs_received == 1 and conn.pings_received == 0  # no offer
            [server_peer] = server.peers
            assert server_peer.adapter.handshake.level == 0
        finally:
            await sock.close()
