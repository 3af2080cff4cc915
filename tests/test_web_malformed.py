"""Malformed HTTP requests to the WebSocket server get a status line or a clean close, never
an exception in the connection's protocol (which the loop would log at ERROR with a
traceback per connection, past the rate-limited warnings), on asyncio and uvloop."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tests.test_web_hostile import closed_by_server, recorder_server, serves_a_websocket
from transports.web_http import HttpOptions

pytestmark = pytest.mark.both_loops

UPGRADE = (
    b"GET /gotalk/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n"
)


async def reply_to(port: int, *parts: bytes) -> bytes:
    """Send ``parts`` (each written and drained before the next), read until closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
        return await closed_by_server(reader)
    finally:
        writer.close()


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_repeated_headers_get_400_or_are_combined(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    (tmp_path / "app.js").write_text("console.log('hi');\n" * 100)
    http = HttpOptions(allow_missing_origin=True, static_dir=tmp_path)
    server, sinks, port = await recorder_server(http=http)
    try:
        get = b"GET /app.js HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        for head in (
            b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1\r\n\r\n",
            UPGRADE + b"Upgrade: websocket\r\n\r\n",
            UPGRADE + b"Origin: http://127.0.0.1\r\nOrigin: http://127.0.0.1\r\n\r\n",
        ):
            reply = await reply_to(port, head)
            assert reply.startswith(b"HTTP/1.1 400 ") and b"repeated" in reply, reply[:200]
        plain = await reply_to(port, get + b"\r\n")
        etag = next(line for line in plain.split(b"\r\n") if line.startswith(b"ETag: "))[6:]
        # list headers may come as several lines (RFC 9110 5.3): they are one list
        reply = await reply_to(
            port, get + b'If-None-Match: "x"\r\nIf-None-Match: %s\r\n\r\n' % etag
        )
        assert reply.startswith(b"HTTP/1.1 304 "), reply[:200]
        reply = await reply_to(port, get + b"Accept-Encoding: br\r\nAccept-Encoding: gzip\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 200 ") and b"Content-Encoding: gzip" in reply
        await serves_a_websocket(port, sinks)
    finally:
        server.close()
        await server.wait_closed()
    assert errors(caplog) == []


async def test_a_nul_byte_in_a_static_path_is_404(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    (tmp_path / "index.html").write_text("<p>hi</p>")
    server, _, port = await recorder_server(http=HttpOptions(static_dir=tmp_path))
    try:
        for path in (b"/a%00b", b"/%00", b"/index.html%00.js"):
            reply = await reply_to(port, b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path)
            assert reply.startswith(b"HTTP/1.1 404 "), (path, reply[:200])
        reply = await reply_to(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"<p>hi</p>")
    finally:
        server.close()
        await server.wait_closed()
    assert errors(caplog) == []


async def test_unparsable_requests_then_more_bytes_are_closed_without_431(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """websockets could not parse the request (and closed, or answered 414/431 itself):
    the bytes that follow, past ``max_request_head``, get no second answer."""
    caplog.set_level(logging.WARNING)
    server, sinks, port = await recorder_server()
    filler = b"x" * 17_000  # past the default max_request_head (16 KiB)
    try:
        assert await reply_to(port, b"GARBAGE\r\n\r\n", filler) == b""
        reply = await reply_to(port, b"GET /" + b"a" * 9000, filler)  # request line too long
        assert reply.startswith(b"HTTP/1.1 414 ") and reply.count(b"HTTP/1.1") == 1, reply
        long_header = b"GET / HTTP/1.1\r\nX-Long: " + b"b" * 9000
        reply = await reply_to(port, long_header, filler)
        assert reply.startswith(b"HTTP/1.1 431 ") and reply.count(b"HTTP/1.1") == 1, reply
        # a second request behind the first (pipelining): the first is answered, which
        # ends the connection; behind a 101 it is no frame: close 1002 (protocol error)
        get = b"GET /gotalk/gotalk.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        reply = await reply_to(port, get + get)
        assert reply.startswith(b"HTTP/1.1 200 ") and reply.count(b"HTTP/1.1 ") == 1
        reply = await reply_to(port, UPGRADE + b"\r\n" + get)
        head, _, frame = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 ") and frame[:1] == b"\x88", reply
        assert frame[2:4] == b"\x03\xea", reply  # close 1002
        await serves_a_websocket(port, sinks)
    finally:
        server.close()
        await server.wait_closed()
    assert errors(caplog) == []
