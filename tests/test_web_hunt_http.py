"""HTTP semantics of the WebSocket server's small web server (found by a defect hunt), on
asyncio and uvloop: HEAD answers carry no body, methods other than GET and
HEAD get 405, and ``Accept-Encoding`` q-values are honoured (``gzip;q=0``: no gzip);
files named as compressed (``x.json.gz``) are served as they are."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.test_web_hostile import recorder_server, serves_a_websocket
from tests.test_web_malformed import reply_to
from transports.web_http import HttpOptions

pytestmark = pytest.mark.both_loops

PAGE = "<p>hello</p>\n" * 100


def split(reply: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """(status line, headers by lower-case name, body) of one HTTP response."""
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


async def test_head_gets_the_get_answer_without_its_body(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(PAGE)
    server, _, port = await recorder_server(http=HttpOptions(static_dir=tmp_path))
    try:
        for path in (b"/gotalk/gotalk.js", b"/", b"/", b"/missing", b"/gotalk/"):
            request = b" %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path
            # HEAD first: the first "/" waits for its file to load, the second is cached
            status, headers, body = split(await reply_to(port, b"HEAD" + request))
            got_status, got_headers, got_body = split(await reply_to(port, b"GET" + request))
            assert status == got_status, (path, status)
            assert body == b"", (path, body[:80])  # RFC 9110 9.3.2: no content
            assert headers[b"content-length"] == str(len(got_body)).encode(), path
            assert headers.get(b"etag") == got_headers.get(b"etag"), path
    finally:
        server.close()
        await server.wait_closed()


async def test_methods_other_than_get_and_head_get_405(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(PAGE)
    http = HttpOptions(static_dir=tmp_path, allow_missing_origin=True)
    server, sinks, port = await recorder_server(http=http)
    try:
        for method in (b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"get"):
            for path in (b"/", b"/gotalk/gotalk.js", b"/gotalk/"):
                reply = await reply_to(
                    port,
                    b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
                    % (method, path),
                )
                status, headers, body = split(reply)
                assert status.startswith(b"HTTP/1.1 405 "), (method, path, reply[:120])
                assert headers[b"allow"] == b"GET, HEAD", (method, path)
                assert b"hello" not in body and b"gotalk" not in body.lower()
        await serves_a_websocket(port, sinks)  # the endpoint still upgrades GETs
    finally:
        server.close()
        await server.wait_closed()


async def test_accept_encoding_q_values_are_honoured(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(PAGE)
    server, _, port = await recorder_server(http=HttpOptions(static_dir=tmp_path))
    try:
        for value, zipped in (
            (b"gzip;q=0", False),
            (b"gzip; q=0.000, deflate", False),
            (b"identity", False),
            (b"br, *;q=0", False),
            (b"*;q=0.1, gzip;q=0", False),
            (b"gzip;q=0.5", True),
            (b"GZIP", True),
            (b"deflate, x-gzip", True),
            (b"br, *", True),
            (b"gzip", True),
        ):
            for path in (b"/", b"/gotalk/gotalk.js"):
                reply = await reply_to(
                    port,
                    b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: %s\r\n\r\n"
                    % (path, value),
                )
                status, headers, body = split(reply)
                assert status.startswith(b"HTTP/1.1 200 "), (value, path)
                assert (headers.get(b"content-encoding") == b"gzip") is zipped, (value, path)
                if path == b"/":
                    assert (gzip.decompress(body) if zipped else body) == PAGE.encode()
    finally:
        server.close()
        await server.wait_closed()


async def test_compressed_files_are_served_as_they_are(tmp_path: Path) -> None:
    """``data.json.gz`` is a gzip file, not JSON: served byte for byte with a type of its
    compression, never gzipped again (it was ``application/json``, and gzipped twice for
    clients that accept gzip: they decoded it once and got gzip bytes as JSON)."""
    data = b'{"values": [' + b"1, " * 2000 + b"1]}"
    files = {
        "data.json.gz": (gzip.compress(data), b"application/gzip"),
        "app.js.br": (b"\x1b\x03\x00\xf8" + data, b"application/octet-stream"),
        "notes.txt.bz2": (b"BZh91AY&SY" + data, b"application/x-bzip2"),
    }
    for name, (body, _) in files.items():
        (tmp_path / name).write_bytes(body)
    server, _, port = await recorder_server(http=HttpOptions(static_dir=tmp_path))
    try:
        for name, (body, ctype) in files.items():
            reply = await reply_to(
                port,
                b"GET /%s HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip\r\n\r\n"
                % name.encode(),
            )
            status, headers, got = split(reply)
            assert status.startswith(b"HTTP/1.1 200 "), (name, status)
            assert headers[b"content-type"] == ctype, (name, headers[b"content-type"])
            assert b"content-encoding" not in headers and got == body, name
    finally:
        server.close()
        await server.wait_closed()


async def test_dotfiles_under_static_dir_are_not_served(tmp_path: Path) -> None:
    """``.env``, ``.git/config`` and the like in a served folder are 404, as missing files
    are (before, they were served like any other file)."""
    (tmp_path / "index.html").write_text(PAGE)
    (tmp_path / ".env").write_text("SECRET=1\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n")
    (tmp_path / "page.html").symlink_to(tmp_path / ".env")
    server, _, port = await recorder_server(http=HttpOptions(static_dir=tmp_path))
    try:
        for path in (b"/.env", b"/.git/config", b"/%2eenv", b"/page.html", b"/x/../.env"):
            request = b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path
            status, _, body = split(await reply_to(port, request))
            assert status.split()[1] == b"404" and b"SECRET" not in body, (path, status)
        status, _, body = split(await reply_to(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
        assert status.split()[1] == b"200" and body == PAGE.encode()
    finally:
        server.close()
        await server.wait_closed()


async def test_the_gzipped_body_has_a_tag_of_its_own(tmp_path: Path) -> None:
    """RFC 9110 8.8.3: the gzipped and the plain body are two representations, each with
    its tag; a tag answers 304 only for its own (before, both shared one strong tag)."""
    (tmp_path / "index.html").write_text(PAGE)
    server, _, port = await recorder_server(http=HttpOptions(static_dir=tmp_path))
    get = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    gzip_ok = get + b"Accept-Encoding: gzip\r\n"
    try:
        _, plain, body = split(await reply_to(port, get + b"\r\n"))
        _, packed, packed_body = split(await reply_to(port, gzip_ok + b"\r\n"))
        assert body == PAGE.encode() and gzip.decompress(packed_body) == body
        assert plain[b"etag"] != packed[b"etag"]
        for request, tag, status in (
            (gzip_ok, packed[b"etag"], b"304"),
            (gzip_ok, plain[b"etag"], b"200"),
            (get, plain[b"etag"], b"304"),
            (get, packed[b"etag"], b"200"),
        ):
            answer = await reply_to(port, request + b"If-None-Match: %s\r\n\r\n" % tag)
            assert split(answer)[0].split()[1] == status, (request, tag)
    finally:
        server.close()
        await server.wait_closed()
