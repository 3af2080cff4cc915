"""Review 205 of f93a48f..HEAD: defects found, each shown by a failing test."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

from tests.browser import eventually
from tests.certs import Pki
from tests.test_web_hostile import recorder_server
from transports.stream import server_ssl_context

pytestmark = [
    pytest.mark.both_loops,
    pytest.mark.xfail(strict=True, reason="review 205: found, not fixed (cut 5.4 s late)"),
]

PING_INTERVAL = PING_TIMEOUT = 0.2


async def test_a_vanished_wss_peer_is_cut_at_the_keepalive_limit(pki: Pki) -> None:
    """02e3f22 and docs/limits.md: a WebSocket peer failed for its silence has its socket
    closed once our close frame is written. Over TLS the close waits for the peer's
    close_notify, which a vanished peer (no FIN, reads nothing) never sends: the connection
    lives TLS_SHUTDOWN_TIMEOUT (5 s) more, as the plain-TCP one did close_timeout more
    (5.4 s after the stop here, on both loops, with a 0.4-s keepalive)."""
    server, sinks, port = await recorder_server(
        ssl_context=server_ssl_context(pki.server_cert, pki.server_key),
        ping_interval=PING_INTERVAL,
        ping_timeout=PING_TIMEOUT,
    )
    client_ssl = ssl.create_default_context(cafile=str(pki.ca))
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client_ssl, server_hostname="localhost"
    )
    try:
        ws = ClientProtocol(parse_uri(f"wss://127.0.0.1:{port}/gotalk/"), max_size=None)
        ws.send_request(ws.connect())
        for chunk in ws.data_to_send():
            writer.write(chunk)
        while ws.state.name == "CONNECTING":
            ws.receive_data(await asyncio.wait_for(reader.read(65536), 5))
        writer.transport.pause_reading()  # vanished: from now on reads nothing, sends nothing
        limit = PING_INTERVAL + PING_TIMEOUT + 1.0
        await eventually(lambda: sinks and sinks[0].lost, "the vanished peer cut", limit)
    finally:
        writer.transport.abort()
        server.close()
        await server.wait_closed()
