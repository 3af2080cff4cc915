"""A plain legacy Hat peer (hat-chatter 0.5: it drops the connection on a message type it
does not know, so it is never sent a ``PeerwireRpc`` type) past the server's limits in its
very first read: the connection learns from its first request that it takes no retry
results, and the request past ``max_concurrent`` in that same read waits for a handler slot
and is answered with the peer's own type once one frees. Before, it was refused with a
retry result that could not be sent (logged), and the peer heard nothing of that call. The
legacy wire is spoken by our sans-I/O codec on a real socket, both requests in one write
(the reference client sends one request at a time: see test_rpc_chatter_legacy_replies.py
for it past the limit in a later read)."""

from __future__ import annotations

import asyncio
from typing import Any

import rpc
from tests.chatter_socket import ChatterSocket
from tests.rpc_helpers import wait_until
from wire.chatter import Dialect


async def test_a_legacy_hat_peers_first_read_past_max_concurrent_waits_for_a_slot() -> None:
    release = asyncio.Event()
    started: list[bytes] = []
    reg = rpc.Registry()

    @reg.handle("PwTest.MsgReq")
    async def request(data: bytes) -> Any:
        started.append(data)
        if data == b"first":
            await release.wait()
        return rpc.Reply("PwTest.MsgRes", data)

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=reg, options=options) as server:
        sock = await ChatterSocket.connect("127.0.0.1", server.url.port, Dialect.LEGACY)
        try:
            ids = {
                sock.conn.send("MsgReq", data, module="PwTest", last=False).id: data
                for data in (b"first", b"second")
            }
            sock.flush()  # one write: the server reads both at once
            await wait_until(lambda: started == [b"first"])
            [served] = server.peers
            await wait_until(lambda: served._backlog)  # "second": kept, not refused
            release.set()
            replies = {}
            for _ in ids:
                msg = await sock.receive()
                replies[msg.first] = (msg.module, msg.type, msg.data, msg.last)
            assert replies == {i: ("PwTest", "MsgRes", data, True) for i, data in ids.items()}
            assert started == [b"first", b"second"]
        finally:
            await sock.close()
