"""A wss peer failed by the keepalive because it stopped reading, though alive: the TLS
socket is closed, not aborted, so the output still queued under TLS and the close frame
reach it when it reads again (review 206: 90be55e's abort lost them)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import ssl
import struct
import termios

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Close, CloseCode, Frame, Opcode
from websockets.uri import parse_uri

from tests.browser import eventually
from tests.certs import Pki
from tests.test_web_hostile import recorder_server
from transports.stream import server_ssl_context

pytestmark = pytest.mark.both_loops

PING_INTERVAL = PING_TIMEOUT = 0.2


def _unsent(sock: socket.socket) -> int:
    """Bytes in the kernel's send queue of ``sock`` (not yet acknowledged)."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])


async def test_a_slow_wss_peer_failed_by_the_keepalive_still_gets_the_close_frame(
    pki: Pki,
) -> None:
    """90be55e aborted the TLS socket when ``raw.get_write_buffer_size()`` was 0, taking that
    for "the close frame is in the socket layer". The TLS transport counts only its own
    buffers, not the TCP transport's under it: with the kernel's buffers full and less than
    the TCP transport's high-water mark (64 KiB) waiting there, the size is 0 and abort()
    drops that output with the close frame. A live peer that was only slow (reads again)
    gets a truncated stream and no close 1011; raw.close() delivered both."""
    loop = asyncio.get_running_loop()
    server, sinks, port = await recorder_server(
        ssl_context=server_ssl_context(pki.server_cert, pki.server_key),
        ping_interval=PING_INTERVAL,
        ping_timeout=PING_TIMEOUT,
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    tls = ssl.create_default_context(cafile=str(pki.ca))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_obj = tls.wrap_bio(incoming, outgoing, server_hostname="localhost")

    async def flush() -> None:
        await loop.sock_sendall(sock, outgoing.read())

    async def feed() -> bool:
        data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 2)
        if data:
            incoming.write(data)
        else:
            incoming.write_eof()
        return bool(data)

    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        while True:  # TLS handshake, by hand: the test alone decides when the socket is read
            try:
                tls_obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await flush()
                await feed()
        await flush()
        ws = ClientProtocol(parse_uri(f"wss://127.0.0.1:{port}/gotalk/"), max_size=None)
        ws.send_request(ws.connect())
        for chunk in ws.data_to_send():
            tls_obj.write(chunk)
        await flush()
        while ws.state.name == "CONNECTING":
            await feed()
            with contextlib.suppress(ssl.SSLWantReadError):
                ws.receive_data(tls_obj.read(65536))
        ws.events_received()  # the handshake's response
        # from now on the client reads nothing: fill the kernel's buffers, then leave 16 KiB
        # in the server's TCP transport (under its high-water mark: no pause, TLS size 0)
        await eventually(lambda: sinks and sinks[0].transport is not None, "connected")
        theirs = sinks[0].transport.get_extra_info("socket")
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sent, still = 0, 0
        while still < 5 and sent < 4 * 2**20:  # the kernel's queue stops growing: full
            before = _unsent(theirs)
            sinks[0].transport.write(b"x" * 1024)
            sent += 1024
            for _ in range(3):
                await asyncio.sleep(0)
            still = still + 1 if _unsent(theirs) == before else 0
        sinks[0].transport.write(b"y" * 16 * 1024)
        sent += 16 * 1024
        await eventually(lambda: sinks[0].transport.is_closing(), "failed for its silence", 2)
        events: list[Frame] = []  # the slow peer reads again, up to the close frame or EOF
        while not any(e.opcode is Opcode.CLOSE for e in events) and await feed():
            try:
                while chunk := tls_obj.read(65536):
                    ws.receive_data(chunk)
            except (ssl.SSLWantReadError, ssl.SSLEOFError):
                pass
            events += [e for e in ws.events_received() if isinstance(e, Frame)]
        got = sum(len(e.data) for e in events if e.opcode is Opcode.BINARY)
        closes = [Close.parse(e.data).code for e in events if e.opcode is Opcode.CLOSE]
        assert (got, closes) == (sent, [CloseCode.INTERNAL_ERROR])
    finally:
        sock.close()
        server.close()
        await server.wait_closed()
