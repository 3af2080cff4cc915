"""helper-166's review of 5aded28, 294f430, e45ca3f, 06294e1 and cf4d9fd: real sockets on
127.0.0.1, no fixed sleeps."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rpc import eventer
from rpc.eventer import common
from tests.chatter_socket import ChatterSocket
from tests.peers.eventer_helpers import json_event, port_of, server_config
from tests.rpc_helpers import wait_until
from wire.chatter import Dialect

pytestmark = pytest.mark.both_loops


def _query_bytes() -> bytes:
    """A HatEventer query of the latest ``big/*`` events, as a raw client sends it."""
    params = common.QueryLatestParams([("big", "*")])
    return common.encode(common.MSG_QUERY_REQ, common.query_params_to_sbs(params))


async def test_a_query_read_before_the_close_but_kept_is_answered(tmp_path: Path) -> None:
    """06294e1: a query read once the server drains its connections is not run (the
    connection closes), those read before are answered. It was decided as the query ran,
    not as it was read: one read before the close and kept in the connection's backlog
    (our output to the client backed up: requests wait then) ran once the client read,
    after the draining began, and went unanswered. Before 06294e1 it ran during the drain
    (the second query, still running, kept the drain going) and was answered."""
    server = await eventer.EventerServer(server_config(tmp_path, system_events=False)).start()
    closing: asyncio.Task[None] | None = None
    sock = await ChatterSocket.connect("127.0.0.1", port_of(server), Dialect.CURRENT)
    try:
        await server.register([json_event(("big", str(i)), "x" * (1 << 20)) for i in range(12)])
        init = common.init_req_to_sbs("raw", None, [], None, False)
        sock.conn.send(common.MSG_INIT_REQ, common.encode(common.MSG_INIT_REQ, init), last=False)
        sock.flush()
        assert (await sock.receive()).type == common.MSG_INIT_RES
        sent = [sock.conn.send(common.MSG_QUERY_REQ, _query_bytes(), last=False) for _ in range(2)]
        sock.flush()
        peer = server.clients[0].peer
        codec = peer.adapter.codec
        # the first 12-MiB answer waits in our output (the client does not read), the
        # second query waits for it to drain: requests read from now on are kept
        await wait_until(lambda: peer.write_buffer_size > 256 * 1024)
        assert codec.open_conversations == 1  # the second query's
        sent.append(sock.conn.send(common.MSG_QUERY_REQ, _query_bytes(), last=False))
        sock.flush()
        await wait_until(lambda: codec.open_conversations == 2)  # read, and kept
        closing = asyncio.create_task(server.close())
        await wait_until(lambda: server.status is eventer.Status.STANDBY)  # draining now
        answered: list[int] = []
        with pytest.raises(ConnectionError):  # read until the server closes
            while True:
                msg = await sock.receive(timeout=3)
                if msg.type == common.MSG_QUERY_RES:
                    answered.append(msg.first)
        assert answered == [m.id for m in sent]
        await asyncio.wait_for(closing, 3)
    finally:
        if closing is not None:
            await asyncio.gather(asyncio.wait_for(closing, 5), return_exceptions=True)
        await server.close()
        await sock.close()
