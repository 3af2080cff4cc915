"""Hostile peers against the transports of a real ``rpc.serve`` server, on asyncio and
uvloop: attacks the other hostile tests do not cover.

A large static file asked for by peers that never read: websockets serializes a response
into one bytes object, head and body, and the transport kept what the socket did not take,
about the whole file per connection until its close timeout (``transports.ws_body``). A
WebSocket upgrade dribbled in: ``rpc.Options.handshake_timeout`` bounds it (it had the HTTP
side's own 10 s whatever the Options said).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import tracemalloc
from pathlib import Path

import pytest

import rpc
from tests.certs import Pki
from tests.rpc_helpers import gotalk_peer_registry
from transports.stream import client_ssl_context, server_ssl_context
from transports.web_http import HttpOptions

pytestmark = pytest.mark.both_loops

FILE_BYTES = 6 * 1024 * 1024
NON_READERS = 4


def get(path: str, port: int) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


async def non_reader(port: int, ctx: ssl.SSLContext | None) -> asyncio.StreamWriter:
    """A connection whose socket takes little and that reads only an answer's first bytes
    (over TLS the stream's reader then stops the reading of the socket at its limit)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    host = "localhost" if ctx is not None else None
    reader, writer = await asyncio.open_connection(sock=sock, ssl=ctx, server_hostname=host)
    writer.write(get("/big.bin", port))
    # its first bytes: the server has written what it would at once
    assert (await asyncio.wait_for(reader.readexactly(12), 5)).startswith(b"HTTP/1.1 200")
    return writer


@pytest.mark.parametrize("scheme", ["ws", "wss"])
async def test_a_large_static_file_to_peers_that_never_read_is_not_copied_for_each(
    tmp_path: Path, pki: Pki, scheme: str
) -> None:
    body = os.urandom(FILE_BYTES)
    (tmp_path / "big.bin").write_bytes(body)
    url = f"{scheme}+gotalk://127.0.0.1:0/gotalk/"
    web = HttpOptions(static_dir=tmp_path)
    tls = server_ssl_context(pki.server_cert, pki.server_key) if scheme == "wss" else None
    ctx = client_ssl_context(cafile=pki.ca) if scheme == "wss" else None
    async with rpc.serve(url, registry=gotalk_peer_registry(), web=web, ssl=tls) as server:
        port = server.url.port
        # a reader gets the file whole, then the end of the response (and the cache has it)
        host = "localhost" if ctx is not None else None
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname=host
        )
        writer.write(get("/big.bin", port))
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        head, _, got = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and f"{FILE_BYTES}".encode() in head
        assert got == body

        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        writers: list[asyncio.StreamWriter] = []
        try:
            for _ in range(NON_READERS):
                writers.append(await non_reader(port, ctx))
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        try:
            # at most the high-water mark (256 KiB) and a chunk each (TLS: and its records),
            # not the file each; the clients' own stream buffers (128 KiB each) count too
            assert held < NON_READERS * 3 * 1024 * 1024 // 2, held
            client_url = f"{scheme}+gotalk://localhost:{port}/gotalk/"
            async with rpc.connect(client_url, ssl=ctx) as client:  # the server serves on
                answer = await client.request("greet", {"name": "canary"})
                assert answer == {"greeting": "Hello canary"}
        finally:
            for each in writers:
                each.transport.abort()


async def test_options_handshake_timeout_bounds_a_websocket_upgrade_dribbled_in() -> None:
    """``rpc.Options.handshake_timeout`` counts from the accept (docs/limits.md), the
    upgrade included: a client that dribbles its request a byte at a time is closed at it.
    Before, the upgrade had ``HttpOptions.handshake_timeout`` (10 s) whatever the Options
    said, and the peer's own limit began only after it."""
    limit = 0.5
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=gotalk_peer_registry(),
        options=rpc.Options(handshake_timeout=limit),
    ) as server:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        began = loop.time()
        request = get("/gotalk/", server.url.port)[:-2] + b"X-Pad: " + b"a" * 200

        async def dribble() -> None:
            for byte in request:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.02)

        dribbling = asyncio.create_task(dribble())
        try:
            async with asyncio.timeout(3):
                assert await reader.read() == b""  # closed, nothing answered
        finally:
            dribbling.cancel()
            writer.close()
        assert loop.time() - began < limit + 0.4
        async with rpc.connect(str(server.url)) as client:  # a prompt client gets in
            assert await client.request("greet", {"name": "x"}) == {"greeting": "Hello x"}
