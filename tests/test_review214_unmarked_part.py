"""Review 214 of 60a419c: a kept part of a stream the graceful close forgets escapes
``_ended``'s mark when ``InputFlow._runs_now`` looked at it while the stream was not in
``_ended`` with a close running: kept before the close began (``_runs_now`` returns False
before its is_part branch, and the close's start asks no look), or kept during the close
while the stream's handler ran (it ended after). Forgetting that stream past
``ENDED_STREAMS`` then asks no look: the part stays kept behind a request read before the
close while our output waits, and the close waits for it (``Backlog.emptied``) up to its
``drain_timeout``. Both FAIL on 60a419c..0961965 and pass with e035c06's
served_streams.py (a look at every stream a close forgets). Real sockets on 127.0.0.1;
the waits are bounded, none is a fixed sleep."""

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


async def test_a_part_kept_before_the_close_is_dropped_once_its_stream_is_forgotten() -> None:
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
            await wait_until(lambda: _rid(10) in served._ended, 5)  # ended, remembered
            writer.write(encode(Request(_rid(1), "big", b"0")))
            await wait_until(lambda: served.outbox.blocked, 5)
            kept = served._kept
            writer.write(encode(Request(_rid(2), "big", b"2")))  # kept first: waits
            await wait_until(lambda: len(kept.messages) == 1, 5)
            writer.write(encode(StreamRequestPart(_rid(10), b"1")))  # kept: output waits
            await wait_until(lambda: len(kept.messages) == 2 and served.reading, 5)
            closing = asyncio.ensure_future(served.close(drain_timeout=8.0))
            await wait_until(lambda: served.gave_up is not None, 2)
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


async def test_a_part_kept_while_its_stream_ran_is_dropped_once_it_is_forgotten() -> None:
    """The same for a part kept during the close while its stream's handler ran
    (``_runs_now`` marks nothing: the stream is not in ``_ended`` yet), the handler
    then answering without it."""
    go = asyncio.Event()
    reg = _registry()

    @reg.handle_stream("waits")
    async def waits(values: Any) -> int:
        await go.wait()  # answers without reading its parts
        return 0

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, retry_results=False) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        closing: asyncio.Future[None] | None = None
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(encode(StreamRequest(_rid(10), "waits", b"0")))
            await wait_until(lambda: bool(server.peers), 5)
            [served] = server.peers
            await wait_until(lambda: _rid(10) in served._streams, 5)  # its handler runs
            writer.write(encode(Request(_rid(1), "big", b"0")))
            await wait_until(lambda: served.outbox.blocked, 5)
            kept = served._kept
            writer.write(encode(Request(_rid(2), "big", b"2")))  # kept first: waits
            await wait_until(lambda: len(kept.messages) == 1, 5)
            closing = asyncio.ensure_future(served.close(drain_timeout=8.0))
            await wait_until(lambda: served.gave_up is not None, 2)
            writer.write(encode(StreamRequestPart(_rid(10), b"1")))  # kept: output waits
            await wait_until(lambda: len(kept.messages) == 2 and served.reading, 5)
            go.set()
            await wait_until(lambda: _rid(10) in served._ended, 5)  # answered: ended
            ids = range(100, 100 + ENDED_STREAMS + 44)  # turned away as read: forget 10
            writer.write(b"".join(encode(StreamRequest(_rid(i), "total", b"0")) for i in ids))
            await wait_until(lambda: _rid(ids[-1]) in served._ended, 5)
            assert _rid(10) not in served._ended  # forgotten: its part runs now (dropped)
            assert served.outbox.blocked
            await wait_until(lambda: len(kept.messages) == 1, 1)
        finally:
            writer.close()
            if closing is not None:
                closing.cancel()
