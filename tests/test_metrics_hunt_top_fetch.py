"""``peerwire top`` against hostile or broken endpoints: its scrape is bounded in time and in
size, and every failure is one line (helper-P's hunt)."""

from __future__ import annotations

import asyncio
import time

import pytest

from rpc import top


async def serving(reply: object) -> tuple[asyncio.Server, str]:
    """A server on port 0 that reads one request and hands the connection to ``reply``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            await reply(writer)  # type: ignore[operator]
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"


@pytest.mark.parametrize(
    ("head", "byte"), [(b"HTTP/1.0 200 OK\r\n\r\n", b"#"), (b"HTTP/1.0 200 OK\r\n", b"X")]
)
async def test_a_trickling_answer_fails_at_the_scrape_timeout(head: bytes, byte: bytes) -> None:
    """A byte every 0.1 s, in the body or in the headers: each read came within the
    timeout, so the scrape went on for as long as the endpoint liked (here 4 s; a slowloris
    endpoint: for ever)."""

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(head)
        for _ in range(40):
            writer.write(byte)
            await writer.drain()
            await asyncio.sleep(0.1)

    server, url = await serving(trickle)
    try:
        start = time.monotonic()
        with pytest.raises(OSError, match=r"within 1\.0 s"):
            await asyncio.to_thread(top.fetch, url, 1.0)
        assert time.monotonic() - start < 2.0
    finally:
        server.close()


async def test_a_body_past_the_bound_is_refused_not_read_whole() -> None:
    """An endless (here: the bound and a bit) body was read whole into memory: 5 GB in 15 s
    from an endpoint that never stops."""
    sent = {"bytes": 0}
    line = b"# " + b"x" * 65_533 + b"\n"  # 64 KiB of comment

    async def huge(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.0 200 OK\r\n\r\n")
        while sent["bytes"] <= top.MAX_BODY + 4 * len(line):
            writer.write(line)
            sent["bytes"] += len(line)
            await writer.drain()

    server, url = await serving(huge)
    try:
        with pytest.raises(top.NotMetrics, match=f"more than {top.MAX_BODY:,} bytes"):
            await asyncio.to_thread(top.fetch, url, 5.0)
    finally:
        server.close()


async def test_a_body_within_the_bound_is_read() -> None:
    text = b"peerwire_connections_open 3\n"

    async def small(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(text), text))
        await writer.drain()

    server, url = await serving(small)
    try:
        body = await asyncio.to_thread(top.fetch, url, 5.0)
        assert top.parse(body).connections_open == 3
    finally:
        server.close()


async def test_a_redirect_loop_is_said_in_one_line() -> None:
    """urllib's error for a redirect loop is three lines; the CLI prints its text."""

    async def loop(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.0 302 Found\r\nLocation: /metrics\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    server, url = await serving(loop)
    try:
        with pytest.raises(OSError) as info:
            await asyncio.to_thread(top.fetch, url, 5.0)
        assert "302" in str(info.value) and "\n" not in str(info.value), str(info.value)
    finally:
        server.close()
