"""The RPC core against the real Chatter references, both directions, both dialects."""

from __future__ import annotations

import asyncio
import json
import subprocess

import hat.sbs
import pytest
from hat.drivers import chatter as hat_chatter
from hat.drivers import net

import rpc
from tests.rpc_helpers import wait_until
from tests.test_chatter_interop import LEGACY_PEER, legacy_python, run_legacy_client
from wire import schemas

pytestmark = pytest.mark.interop

PW_TEST = "module PwTest\nMsgReq = Bytes\nMsgRes = Bytes\n"


def registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("greet")
    def greet(params: dict) -> dict:
        return {"greeting": f"Hello {params['name']}"}

    @reg.handle("PwTest.MsgReq")
    def legacy_echo(data: bytes) -> rpc.Reply:
        return rpc.Reply("PwTest.MsgRes", data + b"!")

    return reg


async def test_hat_drivers_client_calls_our_handlers() -> None:
    seen: asyncio.Queue = asyncio.Queue()
    reg = registry()

    @reg.handle_notification("hello")
    def hello(value):
        seen.put_nowait(value)

    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=reg) as server:
        conn = await hat_chatter.connect(net.TcpAddress("127.0.0.1", server.url.port))
        try:
            conv = await conn.send(hat_chatter.Data("greet", b'{"name":"Hat"}'), last=False)
            reply = await asyncio.wait_for(conn.receive(), 5)
            assert reply.conv == conv and reply.last
            assert reply.data.type == "PeerwireRpc.Result"
            assert json.loads(reply.data.data) == {"greeting": "Hello Hat"}

            conv = await conn.send(hat_chatter.Data("missing", b""), last=False)
            reply = await asyncio.wait_for(conn.receive(), 5)
            assert reply.data.type == "PeerwireRpc.Error"
            repo = schemas.repository()
            assert (
                repo.decode("PeerwireRpc.Error", reply.data.data) == 'unknown operation "missing"'
            )

            await conn.send(hat_chatter.Data("hello", b'"there"'))  # one-message conversation
            assert await asyncio.wait_for(seen.get(), 5) == "there"
        finally:
            await conn.async_close()


async def test_our_client_calls_hat_drivers_service() -> None:
    notes: asyncio.Queue = asyncio.Queue()
    client_reg = rpc.Registry()

    @client_reg.handle_notification("Tick")
    def tick(data: bytes) -> None:
        notes.put_nowait(data)

    async def on_conn(conn: hat_chatter.Connection) -> None:
        while True:
            msg = await conn.receive()
            await conn.send(hat_chatter.Data("Reply", msg.data.data.upper()), conv=msg.conv)
            await conn.send(hat_chatter.Data("Tick", b"t"))

    srv = await hat_chatter.listen(on_conn, net.TcpAddress("127.0.0.1", 0))
    port = srv.info.addresses[0].port
    try:
        url = f"tcp+sbs://127.0.0.1:{port}?dialect=HatChatter"
        async with rpc.connect(url, registry=client_reg) as peer:
            assert await peer.request("Anything", b"abc", raw=True) == b"ABC"
            assert await asyncio.wait_for(notes.get(), 5) == b"t"
            results = await asyncio.gather(
                *(peer.request("X", b"%d" % i, raw=True) for i in range(50))
            )
            assert results == [b"%d" % i for i in range(50)]
    finally:
        await srv.async_close()


async def test_legacy_client_calls_our_handlers() -> None:
    repo = hat.sbs.Repository(schemas.repository(), PW_TEST)
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry(), sbs_repo=repo) as server:
        # the legacy client pings every 0.3 s and closes 0.3 s after a ping without a pong:
        # a third ping means the first was answered
        lines = await run_legacy_client(
            server.url.port,
            3,
            lambda: any(p.adapter.codec.pings_received >= 3 for p in server.peers),
        )
    assert lines[:3] == [
        {"module": "PwTest", "type": "MsgRes", "data": f"req{i}!", "same_conv": True, "last": True}
        for i in range(3)
    ]
    assert lines[3] == {"open": True}  # our pongs kept it open while idle


async def test_our_client_calls_legacy_service() -> None:
    repo = hat.sbs.Repository(schemas.repository(), PW_TEST)
    proc = await asyncio.create_subprocess_exec(
        legacy_python(), str(LEGACY_PEER), "server", stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout and proc.stdin
    try:
        port = int((await asyncio.wait_for(proc.stdout.readline(), 30)).split()[1])
        url = f"tcp+sbs://127.0.0.1:{port}"  # the default dialect is the legacy one
        async with rpc.connect(
            url, sbs_repo=repo, ping_interval=0.2, ping_timeout=1, reconnect=False
        ) as peer:
            assert await peer.request("PwTest.MsgReq", b"hello") == b"hello"
            got = await asyncio.gather(
                *(peer.request("PwTest.MsgReq", b"%d" % i) for i in range(20))
            )
            assert got == [b"%d" % i for i in range(20)]
            # both sides ping: the legacy server every 0.3 s (closing 0.3 s after a ping
            # without a pong), we after 0.2 s of silence; a third ping from it and a pong
            # for ours show both answered
            codec = peer.adapter.codec
            await wait_until(lambda: codec.pings_received >= 3 and codec.pongs_received >= 1)
            assert peer.is_open
            assert await peer.request("PwTest.MsgReq", b"again") == b"again"
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 10)
