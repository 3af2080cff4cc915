"""``peerwire top`` against an endpoint slow for a while: it does not scrape back to back to
catch up with the refreshes it missed (helper-P's hunt)."""

from __future__ import annotations

import asyncio
import io
import itertools
import time

from rpc import top

BODY = b"peerwire_connections_open 1\n"


async def test_a_slow_scrape_is_not_followed_by_a_burst() -> None:
    """Interval 0.1 s, the first answer 0.8 s late: the refreshes missed meanwhile were made
    at once after it, seven scrapes within a few ms, each frame's rates over that sliver
    of time (and a slow endpoint hammered)."""
    arrivals: list[float] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        arrivals.append(time.monotonic())
        if len(arrivals) == 1:
            await asyncio.sleep(0.8)  # the slow first answer itself (not a wait)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    out = io.StringIO()
    try:
        await asyncio.to_thread(top.run, url, interval=0.1, count=5, plain=True, out=out)
    finally:
        server.close()
    assert out.getvalue().count("connections open 1") == 5
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert len(gaps) == 4 and gaps[0] >= 0.8
    assert min(gaps[1:]) >= 0.08, gaps
