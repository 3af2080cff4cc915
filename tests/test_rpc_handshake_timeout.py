"""``handshake_timeout`` on a server counts from the accept: a TLS or WebSocket handshake
counts toward it (a slow client does not get the handshake's time and a whole limit more)."""

from __future__ import annotations

import asyncio
import base64
import os
import socket

import pytest

import rpc
from tests.certs import Pki
from tests.rpc_helpers import wait_until
from tests.test_rpc_tls import registry
from transports.stream import client_ssl_context, server_ssl_context

LIMIT = 1.0
SLOW = 0.7
"""How long the slow client takes over its handshake: most of the limit, on purpose."""


@pytest.mark.both_loops
async def test_the_tls_handshake_counts_toward_handshake_timeout(pki: Pki) -> None:
    """A client that takes most of ``handshake_timeout`` over its TLS handshake and then
    says nothing is closed at the limit counted from the accept, not a whole limit later."""
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key)
    async with rpc.serve(
        "ssl+gotalk://127.0.0.1:0",
        registry=registry(),
        ssl=server_ctx,
        options=rpc.Options(handshake_timeout=LIMIT),
    ) as srv:
        loop = asyncio.get_running_loop()
        raw = socket.create_connection(("127.0.0.1", srv.url.port))
        accepted = loop.time()
        await wait_until(lambda: len(srv.peers) == 1)
        await asyncio.sleep(SLOW)  # the slow handshake itself
        reader, writer = await asyncio.open_connection(
            sock=raw, ssl=client_ssl_context(cafile=pki.ca), server_hostname="localhost"
        )
        async with asyncio.timeout(3):
            while await reader.read(100):  # the server's version; it closes at the limit
                pass
        closed_after = loop.time() - accepted
        writer.close()
        assert closed_after < LIMIT + 0.35, closed_after  # was 1.7 s: the limit again


@pytest.mark.both_loops
async def test_the_websocket_upgrade_counts_toward_handshake_timeout() -> None:
    """A client that takes most of the limit to send its upgrade request and then says
    nothing is told to go (the close frame) at the limit counted from the accept."""
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=registry(),
        options=rpc.Options(handshake_timeout=LIMIT),
    ) as srv:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.url.port)
        accepted = loop.time()
        await asyncio.sleep(SLOW)  # the slow upgrade itself
        key = base64.b64encode(os.urandom(16)).decode()
        host = f"127.0.0.1:{srv.url.port}"
        writer.write(
            f"GET /gotalk/ HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\nOrigin: http://{host}\r\n\r\n".encode()
        )
        received = b""
        async with asyncio.timeout(5):
            while b"\x88" not in received.partition(b"\r\n\r\n")[2][4:]:  # after "01"
                data = await reader.read(1000)
                assert data, received
                received += data
        told_after = loop.time() - accepted
        writer.transport.abort()
        assert received.startswith(b"HTTP/1.1 101"), received
        assert told_after < LIMIT + 0.35, told_after  # was 1.8 s: the limit from the upgrade
