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


def quick_limits_server(*, ping_interval: float, ping_timeout: float) -> rpc.Server:
    """A Chatter server with a 0.3-s handshake limit and the given ping limits."""
    return rpc.serve(
        "tcp+sbs://127.0.0.1:0",
        registry=registry(),
        options=rpc.Options(handshake_timeout=0.3),
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
    )


async def test_hat_drivers_client_silent_until_its_first_ping_is_kept() -> None:
    """A Hat client says nothing until its first Ping, after ``ping_delay`` of silence (20 s
    by default, past our 10-s handshake limit): a connection that sent nothing at all is
    left to the ping limits, not closed by the handshake limit."""
    async with quick_limits_server(ping_interval=3.0, ping_timeout=1.0) as server:
        conn = await hat_chatter.connect(
            net.TcpAddress("127.0.0.1", server.url.port), ping_delay=1.0, ping_timeout=2.0
        )
        try:
            await wait_until(lambda: len(server.peers) == 1)
            (peer,) = server.peers
            codec = peer.adapter.codec
            await wait_until(lambda: codec.pings_received >= 1, timeout=10)  # its first Ping
            assert conn.is_open and peer.is_open
            conv = await conn.send(hat_chatter.Data("greet", b'{"name":"Hat"}'), last=False)
            reply = await asyncio.wait_for(conn.receive(), 5)
            assert reply.conv == conv and reply.data.type == "PeerwireRpc.Result"
        finally:
            await conn.async_close()


async def test_silent_chatter_connection_is_closed_at_the_ping_limits() -> None:
    """Nothing at all from the peer: closed once ``ping_interval`` + ``ping_timeout`` pass
    (no Ping can be sent before the dialect is known); a partial frame is a handshake and
    meets the handshake limit."""
    async with quick_limits_server(ping_interval=0.6, ping_timeout=0.3) as server:
        loop = asyncio.get_running_loop()
        silent_reader, silent = await asyncio.open_connection("127.0.0.1", server.url.port)
        partial_reader, partial = await asyncio.open_connection("127.0.0.1", server.url.port)
        started = loop.time()
        partial.write(b"\x01")  # a frame begun, never finished
        assert await asyncio.wait_for(partial_reader.read(), 5) == b""
        partial_closed = loop.time() - started
        assert await asyncio.wait_for(silent_reader.read(), 5) == b""
        silent_closed = loop.time() - started
        assert partial_closed < 0.8 <= silent_closed, (partial_closed, silent_closed)
        for writer in (silent, partial):
            writer.close()


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
