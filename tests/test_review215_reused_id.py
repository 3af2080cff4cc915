"""Review 215 of 8fb7467: ``ServedStreams._end_stream`` sets ``_ended[key]`` anew, so a stream
request that reuses the id of a stream ended lately (the peer had its answer: the id is
free again) and is turned away by a graceful close unmarks the old stream's entry. A part
of the old stream kept while our output waits (marked by the close's start) then escapes:
forgetting the id past ``ENDED_STREAMS`` asks no look, and the part stays kept behind a
request read before the close while our output waits (review 214's scene,
tests/test_backlog_looks_close.py). Real sockets on 127.0.0.1; the waits are bounded, none
is a fixed sleep."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc.served_streams import ENDED_STREAMS
from tests.rpc_helpers import wait_until
from wire.gotalk.encoding import encode
from wire.gotalk.messages import Request, StreamRequest, StreamRequestPart

pytestmark = pytest.mark.both_loops


def _rid(i: int) -> bytes:
    return i.to_bytes(4, "big")


def _registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("big")
    def big(value: Any) -> Any:
        return "x" * (8 << 20)  # far above high_water and what the sockets buffer

    @reg.handle_stream("early")
    async def early(values: Any) -> int:
        return 0  # answers without reading its parts: the stream ends early (_ended)

    @reg.handle_stream("total")
    async def total(values: Any) -> int:
        return sum([value async for value in values])

    return reg


async def test_a_reused_stream_id_turned_away_keeps_the_old_parts_mark() -> None:
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=_registry(), retry_results=False
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        closing: asyncio.Future[None] | None = None
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(encode(StreamRequest(_rid(10), "early", b"0")))
            await wait_until(lambda: bool(server.peers), 5)
            [served] = server.peers
            await wait_until(lambda: _rid(10) in served._ended, 5)  # ended, answered
            writer.write(encode(Request(_rid(1), "big", b"0")))
            await wait_until(lambda: served.outbox.blocked, 5)
            kept = served._kept
            writer.write(encode(Request(_rid(2), "big", b"2")))  # kept first: waits
            await wait_until(lambda: len(kept.messages) == 1, 5)
            writer.write(encode(StreamRequestPart(_rid(10), b"1")))  # kept: output waits
            await wait_until(lambda: len(kept.messages) == 2 and served.reading, 5)
            closing = asyncio.ensure_future(served.close(drain_timeout=8.0))
            await wait_until(lambda: served.gave_up is not None, 2)
            assert served._ended[_rid(10)]  # marked by the close's start
            writer.write(encode(StreamRequest(_rid(10), "total", b"0")))  # id 10 again
            ids = range(100, 100 + ENDED_STREAMS + 44)  # turned away as read: forget 10
            writer.write(b"".join(encode(StreamRequest(_rid(i), "total", b"0")) for i in ids))
            await wait_until(lambda: _rid(ids[-1]) in served._ended, 5)
            assert _rid(10) not in served._ended  # forgotten: its part runs now (dropped)
            assert served.outbox.blocked
            # the part goes, request 2 (read before the close) waits for our output
            await wait_until(lambda: len(kept.messages) == 1, 1)
        finally:
            writer.close()
            if closing is not None:
                closing.cancel()
