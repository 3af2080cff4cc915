"""Our side against the real reference peers in less common conditions.

- A Chatter side with ``max_conversations`` of its own open (requests waiting for a slow
  Hat service) still takes the peer's Pings and still pings: each side's conversations
  count against its own bound. Before, ours filled the peer's bound too, so hat-drivers'
  first Ping after its ``ping_delay`` of silence closed the connection as "peer opened more
  than N conversations", and our own Ping raised (in the RPC core: inside the connection's
  timer, which then stopped, so no request timed out any more).
- While our server holds a hat-drivers client's input (its handler slot taken, the backlog
  full), it pings the client every half ``ping_timeout``, and each Ping opened one more
  conversation whose Pong waited unread: the table grew for as long as the hold lasted
  (up to ``max_conversations``, after which the Ping raised in the timer). The previous
  unanswered Ping is now abandoned: one stays open.
- gotalk.js (Node's WebSocket) sending a payload over our ``max_size``, refused from its
  header while the payload's bytes still arrive, reads our ``f00000002``. Before, the
  server cut the socket once its last word was written, with the payload unread: the reset
  that sends reached the client before it read the ``f`` (and our close frame), and it saw
  a connection lost with 1006, not why. The WebSocket's closing handshake now runs (the
  linger bounds it), and the rest of the payload is dropped as it comes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hat.drivers import chatter as hat_chatter
from hat.drivers import net

import rpc
from tests.chatter_socket import ChatterSocket
from tests.rpc_helpers import wait_until
from tests.test_web_js_node import run_node
from transports.websocket import HttpOptions
from wire.chatter import ChatterConnection, Dialect

pytestmark = pytest.mark.interop


async def slow_hat_service(
    ping_delay: float,
) -> tuple[net.Server, list[hat_chatter.Msg], list[hat_chatter.Connection]]:
    """A hat-drivers server that takes requests and answers none (Pings: its own plan)."""
    received: list[hat_chatter.Msg] = []
    conns: list[hat_chatter.Connection] = []

    async def on_conn(conn: hat_chatter.Connection) -> None:
        conns.append(conn)
        while True:
            received.append(await conn.receive())

    srv = await hat_chatter.listen(
        on_conn, net.TcpAddress("127.0.0.1", 0), ping_delay=ping_delay, ping_timeout=2
    )
    return srv, received, conns


async def four_requests_open(srv: net.Server) -> ChatterSocket:
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.info.addresses[0].port)
    sock = ChatterSocket(reader, writer, ChatterConnection(Dialect.CURRENT, max_conversations=4))
    for i in range(4):
        sock.conn.send("Req", b"%d" % i, last=False)
    sock.flush()
    assert sock.conn.open_conversations == 4
    return sock


async def test_a_full_table_of_our_requests_takes_hat_drivers_pings() -> None:
    srv, received, conns = await slow_hat_service(ping_delay=0.1)
    sock = await four_requests_open(srv)
    try:
        # 0.1 s of silence from us: hat-drivers pings (a new conversation of its own); it
        # pings again only once it heard from us, so a second Ping means ours was answered
        await sock.pump_until(lambda: sock.conn.pings_received >= 2)
        assert sock.conn.open_conversations == 4  # our Pongs ended its Pings
        assert len(received) == 4 and conns and not conns[0].is_closing
    finally:
        await sock.close()
        await srv.async_close()


async def test_a_full_table_of_our_requests_still_pings_hat_drivers() -> None:
    srv, received, conns = await slow_hat_service(ping_delay=0)  # it never pings
    sock = await four_requests_open(srv)
    try:
        sock.conn.send_ping()
        sock.flush()
        await sock.pump_until(lambda: sock.conn.pongs_received >= 1)
        assert sock.conn.open_conversations == 4  # the requests: its Pong ended our Ping
        assert len(received) == 4 and conns and not conns[0].is_closing
    finally:
        await sock.close()
        await srv.async_close()


async def test_a_held_hat_drivers_client_gets_pings_that_open_one_conversation() -> None:
    release = asyncio.Event()
    registry = rpc.Registry()

    @registry.handle("stuck")
    async def stuck(data: bytes) -> bytes:
        await release.wait()
        return b"done"

    async with rpc.serve(
        "tcp+sbs://127.0.0.1:0",
        registry=registry,
        retry_results=False,  # requests past the slot wait, then reading pauses
        options=rpc.Options(max_concurrent=1, max_request_bytes=64 * 1024),
        ping_interval=0.3,
        ping_timeout=0.2,  # a Ping every 0.1 s while the input is held
    ) as server:
        conn = await hat_chatter.connect(net.TcpAddress("127.0.0.1", server.url.port), ping_delay=0)
        try:
            for _ in range(300):
                await conn.send(hat_chatter.Data("stuck", b"x" * 1024), last=False)
            await wait_until(lambda: len(server.peers) == 1)
            (peer,) = server.peers
            # held once the backlog is full (filled a slice a turn: rpc.peer.Peer._read)
            await wait_until(lambda: peer.holding_input and peer._kept.full)
            codec = peer.adapter.codec
            # nothing else goes out during the hold: each id we send is a Ping
            first_id, held_open = codec.next_id, codec.open_conversations
            await wait_until(lambda: codec.next_id >= first_id + 4)
            assert codec.open_conversations <= held_open + 1
            release.set()
            replies = [await asyncio.wait_for(conn.receive(), 5) for _ in range(300)]
            assert {r.data.data for r in replies} == {b"done"} and peer.is_open
        finally:
            await conn.async_close()


async def test_gotalk_js_refused_from_its_header_reads_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    limit = 4 * 1024 * 1024  # the payload is still arriving when its header is refused
    registry = rpc.Registry()

    @registry.handle("len")
    def length(data: bytes) -> int:
        return len(data)

    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=registry,
        web=HttpOptions(allow_missing_origin=True),  # Node sends no Origin
        options=rpc.Options(max_size=limit),
    ) as server:
        heard = await run_node(
            tmp_path,
            f"""
            const heard = [];
            for (let i = 0; i < 3; i++) {{
              const s = await connect(ADDR);
              heard.push(await within(s.bufferRequest('len', new Uint8Array({limit + 1}))
                .then(() => 'answered', (e) => e.message), 5000));
              s.close();
            }}
            return heard;
            """,
            server.url.websocket_uri,
        )
        await wait_until(lambda: not server.peers)  # each closing handshake ended
    assert heard == ["gotalk protocol error: the server sent f00000002"] * 3
    # one violation each: the payload read during the closing handshake is dropped unread,
    # not refused again (which cut the connection as well)
    refused = [r for r in caplog.records if r.name == "peerwire.rpc.violations"]
    assert len(refused) == 3, [r.getMessage() for r in refused]
