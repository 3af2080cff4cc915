"""HTTP requests pipelined on one connection to the WebSocket server's web side, on asyncio
and uvloop. Every answer but a 101 says ``Connection: close`` and ends the connection, so a
request behind another gets no answer (RFC 9112, 9.6: no request after the one answered
with close is processed): the first is answered, then the server half-closes, reads and
drops what follows, and the client sees a clean end of stream, not a reset. Before, the
whole read went to websockets, which took the second request for a bad frame and failed the
connection before the first was answered: no answer at all (all but the later-segment
test fail on e0e2990). Behind an upgrade the bytes are the WebSocket stream: frames, or a
close 1002."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Close, CloseCode, Frame, Opcode
from websockets.uri import parse_uri

from tests.browser import eventually
from tests.test_web_hostile import recorder_server, serves_a_websocket
from transports.web_files import script_asset
from transports.web_http import HttpOptions

pytestmark = pytest.mark.both_loops

SCRIPT = b"GET /gotalk/gotalk.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
PAGE = b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
BODY = "<p>pipelined</p>\n" * 50


def upgrade_request(port: int) -> bytes:
    ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/gotalk/"))
    ws.send_request(ws.connect())
    (request,) = ws.data_to_send()
    return request


async def exchange(port: int, data: bytes) -> bytes:
    """Write ``data`` in one write (one segment on loopback), read until the server ends
    its side. A reset instead of that end fails the test (ConnectionResetError)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        chunks = []
        async with asyncio.timeout(5):
            while chunk := await reader.read(65536):
                chunks.append(chunk)
        return b"".join(chunks)
    finally:
        writer.close()


def responses(data: bytes) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """The HTTP responses in ``data``, one after another: (status line, headers by
    lower-case name, body by Content-Length). Bytes that are no whole response fail."""
    found = []
    while data:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"not a whole response head: {head[:200]!r}"
        status, *lines = head.split(b"\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers[b"content-length"])
        assert len(data) >= length, (status, length, len(data))
        found.append((status, headers, data[:length]))
        data = data[length:]
    return found


def static(tmp_path: Path) -> HttpOptions:
    (tmp_path / "index.html").write_text(BODY)
    return HttpOptions(static_dir=tmp_path, allow_missing_origin=True)


async def test_two_gets_in_one_segment_get_the_first_answered_then_a_clean_end(
    tmp_path: Path,
) -> None:
    server, sinks, port = await recorder_server(http=static(tmp_path))
    try:
        # the script is answered at once; index.html first waits for its load, then cached
        for first, second in ((SCRIPT, SCRIPT), (PAGE, SCRIPT), (PAGE, PAGE), (SCRIPT, PAGE)):
            (answer,) = responses(await exchange(port, first + second))
            status, headers, body = answer
            assert status == b"HTTP/1.1 200 OK", (first, second, status)
            assert headers[b"connection"] == b"close"
            assert body == (BODY.encode() if first == PAGE else script_asset().body)
            # the client closed its side: the server frees the connection
            await eventually(lambda: not server.connections, "the connection closed")
        await serves_a_websocket(port, sinks)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_request_behind_a_refusal_is_not_answered(tmp_path: Path) -> None:
    server, _, port = await recorder_server(http=static(tmp_path))
    try:
        missing = b"GET /missing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        bad_host = b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n"
        post = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
        for first, status in ((missing, b"404"), (bad_host, b"400"), (post, b"405")):
            (answer,) = responses(await exchange(port, first + SCRIPT))
            assert answer[0].startswith(b"HTTP/1.1 " + status + b" "), (first, answer[0])
    finally:
        server.close()
        await server.wait_closed()


async def test_pipelined_bytes_past_max_request_head_do_not_refuse_the_first_request(
    tmp_path: Path,
) -> None:
    """``max_request_head`` bounds the request's head, not what the peer sends behind it:
    the request is answered, the 20 KiB behind it dropped (no 431)."""
    server, _, port = await recorder_server(http=static(tmp_path))
    try:
        behind = SCRIPT[:-2] + b"X-Pad: " + b"p" * 20_000 + b"\r\n\r\n"
        for first in (SCRIPT, PAGE):
            (answer,) = responses(await exchange(port, first + behind))
            assert answer[0] == b"HTTP/1.1 200 OK", (first, answer[0])
        # a head over the limit still gets 431
        (answer,) = responses(await exchange(port, behind))
        assert answer[0].startswith(b"HTTP/1.1 431 "), answer[0]
    finally:
        server.close()
        await server.wait_closed()


async def test_an_upgrade_behind_a_get_is_not_processed(tmp_path: Path) -> None:
    server, sinks, port = await recorder_server(http=static(tmp_path))
    try:
        for first in (SCRIPT, PAGE):
            (answer,) = responses(await exchange(port, first + upgrade_request(port)))
            assert answer[0] == b"HTTP/1.1 200 OK", (first, answer[0])
        assert not sinks  # no WebSocket opened
    finally:
        server.close()
        await server.wait_closed()


async def test_bytes_behind_an_upgrade_are_read_as_frames_after_the_101() -> None:
    """Frames in the upgrade's segment reach the sink; a request there is no frame: the
    101 goes out, then a close 1002 (protocol error)."""
    server, sinks, port = await recorder_server()
    try:
        frame = Frame(Opcode.BINARY, b"early").serialize(mask=True, extensions=[])
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/gotalk/"))
        ws.send_request(ws.connect())
        (request,) = ws.data_to_send()
        writer.write(request + frame)
        await eventually(lambda: len(sinks) == 1 and sinks[0].data == [b"early"], "the frame")
        writer.close()

        ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/gotalk/"))
        ws.send_request(ws.connect())
        (request,) = ws.data_to_send()
        data = await exchange(port, request + SCRIPT)
        ws.receive_data(data)
        events = ws.events_received()
        assert ws.handshake_exc is None and events, data[:200]
        closes = [Close.parse(e.data) for e in events if getattr(e, "opcode", None) is Opcode.CLOSE]
        assert [c.code for c in closes] == [CloseCode.PROTOCOL_ERROR], events
        await eventually(lambda: len(sinks) == 2 and len(sinks[1].lost) == 1, "the close")
        assert sinks[1].data == []
    finally:
        server.close()
        await server.wait_closed()


async def test_a_request_in_a_later_segment_gets_no_answer_and_a_clean_end() -> None:
    server, _, port = await recorder_server()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(SCRIPT)
        async with asyncio.timeout(5):
            first = await reader.readuntil(b"\r\n\r\n")
            assert first.startswith(b"HTTP/1.1 200 OK")
            writer.write(SCRIPT)  # sent after the answer's head came: a later segment
            rest = await reader.read()  # until the server's end of stream
        ((status, _, _),) = responses(first + rest)
        assert status == b"HTTP/1.1 200 OK"
    finally:
        writer.close()
        server.close()
        await server.wait_closed()
