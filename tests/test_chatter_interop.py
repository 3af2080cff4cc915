"""Our Chatter codec against the real references, on loopback, both directions.

- current dialect: hat-drivers 0.10.10 ``hat.drivers.chatter``, in this process;
- legacy dialect: hat-chatter 0.5.11, which pins hat-sbs 0.6, in its own venv
  (``.venv-legacy``, made by ``make test``; override with PEERWIRE_LEGACY_PYTHON).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from hat.drivers import chatter as hat_chatter
from hat.drivers import net

from tests.chatter_socket import ChatterSocket
from tests.rpc_helpers import wait_until
from wire.chatter import ChatterConnection, Conversation, Dialect

pytestmark = pytest.mark.interop
ROOT = Path(__file__).resolve().parent.parent
LEGACY_PEER = Path(__file__).parent / "peers" / "legacy_chatter_peer.py"


def legacy_python() -> str:
    python = os.environ.get("PEERWIRE_LEGACY_PYTHON", str(ROOT / ".venv-legacy" / "bin" / "python"))
    if not Path(python).exists():
        pytest.fail(f"legacy hat-chatter venv missing at {python}: run `make test` (it builds it)")
    return python


async def test_our_client_against_hat_drivers_server() -> None:
    received: list[hat_chatter.Msg] = []

    async def on_conn(conn: hat_chatter.Connection) -> None:
        while True:
            msg = await conn.receive()
            received.append(msg)
            if not msg.last:
                await conn.send(hat_chatter.Data("Res", msg.data.data[::-1]), conv=msg.conv)

    srv = await hat_chatter.listen(
        on_conn, net.TcpAddress("127.0.0.1", 0), ping_delay=0.2, ping_timeout=1
    )
    port = srv.info.addresses[0].port
    sock = await ChatterSocket.connect("127.0.0.1", port, Dialect.CURRENT)
    try:
        for i in range(3):
            sent = sock.conn.send("Req", b"abc%d" % i, last=False)
            sock.flush()
            reply = await sock.receive()
            assert (reply.type, reply.data, reply.last) == ("Res", b"%dcba" % i, True)
            assert Conversation.of_received(reply) == Conversation(True, sent.id)
        sock.conn.send("Note", b"n")  # one-message conversation
        sock.flush()
        # the server pings us after 0.2 s of silence; we answer, so it pings again
        await sock.pump_until(lambda: sock.conn.pings_received >= 2)
        sock.conn.send_ping()
        sock.flush()
        await sock.pump_until(lambda: sock.conn.pongs_received == 1)
        await wait_until(lambda: len(received) == 4)
        assert [m.data.type for m in received] == ["Req", "Req", "Req", "Note"]
        assert received[0].first and received[-1].last
        assert not srv.is_closing
    finally:
        await sock.close()
        await srv.async_close()


async def test_hat_drivers_client_against_our_server() -> None:
    results: list[bytes] = []
    done = asyncio.Event()
    socks: list[ChatterSocket] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = ChatterSocket(reader, writer, ChatterConnection())  # dialect detected
        socks.append(sock)
        try:
            while True:
                msg = await sock.receive(timeout=10)
                results.append(msg.data)
                if not msg.last:
                    sock.conn.send(
                        "Res", msg.data.upper(), conversation=Conversation.of_received(msg)
                    )
                    sock.flush()
        except ConnectionError:
            done.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = await hat_chatter.connect(
        net.TcpAddress("127.0.0.1", port), ping_delay=0.2, ping_timeout=1
    )
    try:
        for word in (b"hello", b"world"):
            conv = await conn.send(hat_chatter.Data("Req", word), last=False)
            reply = await asyncio.wait_for(conn.receive(), 5)
            assert reply.conv == conv and reply.last
            assert (reply.data.type, reply.data.data) == ("Res", word.upper())
        # their pings get our pongs (read while we wait for the next message): a second
        # ping comes only after the first was answered
        await wait_until(lambda: socks[0].conn.pings_received >= 2)
        assert not conn.is_closing
    finally:
        await conn.async_close()
        await asyncio.wait_for(done.wait(), 5)
        server.close()
    assert results == [b"hello", b"world"]


async def test_our_client_against_legacy_server() -> None:
    proc = await asyncio.create_subprocess_exec(
        legacy_python(), str(LEGACY_PEER), "server", stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout and proc.stdin
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        port = int(line.split()[1])
        sock = await ChatterSocket.connect("127.0.0.1", port, Dialect.LEGACY)
        for i in range(3):
            # PwTest.MsgReq = Bytes: the SBS payload is a length-prefixed byte string
            payload = b"x" * i
            sbs = bytes(((len(payload) & 0x7F) | 0x80,)) + payload
            sent = sock.conn.send("MsgReq", sbs, module="PwTest", last=False)
            sock.flush()
            reply = await sock.receive()
            assert (reply.module, reply.type, reply.data, reply.last) == (
                "PwTest",
                "MsgRes",
                sbs,
                True,
            )
            assert reply.first == sent.id
        # legacy pings every 0.3 s unconditionally
        await sock.pump_until(lambda: sock.conn.pings_received >= 2)
        await sock.close()
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 10)


async def test_legacy_client_against_our_server() -> None:
    socks: list[ChatterSocket] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = ChatterSocket(reader, writer, ChatterConnection())
        socks.append(sock)
        try:
            while True:
                msg = await sock.receive(timeout=10)
                assert sock.conn.dialect is Dialect.LEGACY
                sock.conn.send(
                    "MsgRes",
                    msg.data,
                    module=msg.module,
                    conversation=Conversation.of_received(msg),
                )
                sock.flush()
        except ConnectionError:
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # the legacy client pings every 0.3 s and closes 0.3 s after a ping without a pong: a
    # third ping means the first was answered
    lines = await run_legacy_client(port, 3, lambda: socks[0].conn.pings_received >= 3)
    server.close()
    assert lines[:3] == [
        {"module": "PwTest", "type": "MsgRes", "data": f"req{i}", "same_conv": True, "last": True}
        for i in range(3)
    ]
    assert lines[3] == {"open": True}


async def run_legacy_client(port: int, count: int, pinged: Callable[[], object]) -> list[dict]:
    """Run the legacy client peer against ``port``: its ``count`` reply lines, then (once
    ``pinged()`` holds) its report of whether the connection is still open."""
    proc = await asyncio.create_subprocess_exec(
        legacy_python(),
        str(LEGACY_PEER),
        "client",
        f"tcp+sbs://127.0.0.1:{port}",
        str(count),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin and proc.stdout
    try:
        lines = [await asyncio.wait_for(proc.stdout.readline(), 30) for _ in range(count)]
        await wait_until(pinged)
        proc.stdin.write(b"report\n")
        lines.append(await asyncio.wait_for(proc.stdout.readline(), 10))
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return [json.loads(line) for line in lines]
