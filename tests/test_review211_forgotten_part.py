"""Review 211 of 2e32e5d/4bb2df4: during a graceful close (a peer without retry results),
a kept part of a stream the close turned away is to be dropped once the stream is forgotten
past ``ENDED_STREAMS`` (tests/test_backlog_looks_close.py). Forgetting the stream makes no
look happen, though: ``Backlog.look_again`` acts only at a look, and a look comes only when
a read is kept whole (the backlog not ``sorted``). Turned-away requests read a few at a
time (under a turn's 256 messages, as every 4-KiB read now is) all run at once, nothing is
kept, and the part stays kept while our output waits. Real sockets on 127.0.0.1; bounded
waits, no fixed sleep. FAILS on main (and on 2e32e5d, whatever KEPT_READ_SIZE)."""

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

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    @reg.handle_stream("total")
    async def total(values: Any) -> int:
        return sum([value async for value in values])

    return reg


async def test_forgetting_a_turned_away_stream_drops_its_kept_part() -> None:
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=_registry(), retry_results=False
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        closing: asyncio.Future[None] | None = None
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(encode(Request(_rid(1), "big", b"0")))
            await wait_until(lambda: any(p.outbox.blocked for p in server.peers), 5)
            [served] = server.peers
            kept = served._kept
            writer.write(encode(Request(_rid(2), "work", b"2")))
            await wait_until(lambda: len(kept.messages) == 1, 5)
            closing = asyncio.ensure_future(served.close(drain_timeout=4.0))
            await wait_until(lambda: served.gave_up is not None, 2)
            writer.write(
                encode(StreamRequest(_rid(10), "total", b"0"))
                + encode(StreamRequestPart(_rid(10), b"1"))
            )
            await wait_until(lambda: len(kept.messages) == 2, 5)
            assert _rid(10) in served._ended  # turned away, remembered: its part is kept
            ids = list(range(100, 100 + ENDED_STREAMS + 44))
            for start in range(0, len(ids), 50):  # reads of 50 stream requests
                chunk = ids[start : start + 50]
                writer.write(b"".join(encode(StreamRequest(_rid(i), "total", b"0")) for i in chunk))
                last = _rid(chunk[-1])
                await wait_until(lambda: last in served._ended, 5)  # noqa: B023
            assert _rid(10) not in served._ended  # forgotten: its part runs now (dropped)
            assert served.outbox.blocked
            await wait_until(lambda: len(kept.messages) == 1, 1)  # request 2 alone
        finally:
            writer.close()
            if closing is not None:
                closing.cancel()
