"""During a graceful close the backlog's look for what may run now goes over every kept
message, not only those kept whole since its last look (``Backlog.unlooked``, tests/
test_backlog_looks.py): what the close turns away changes for messages looked over before,
as a stream is forgotten past ``ENDED_STREAMS`` (its kept part is then dropped as it runs)
or our calls in flight end. Real sockets on 127.0.0.1; the waits are bounded, none is a
fixed sleep."""

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


async def test_a_part_of_a_stream_forgotten_during_the_close_is_dropped_at_the_next_look() -> None:
    """Our output waits (the client does not read), request 2 is kept (read before the
    close), the close begins. Stream request 10 is turned away (remembered in ``_ended``)
    and its part, read with it, is kept behind request 2: ``_runs_now`` is False for it
    (its stream is "served" and the output waits); a look over the whole backlog (a read
    past a turn's worth) finds so too. Then 300 stream requests in one read,
    turned away: stream 10 is forgotten, so its part now runs now (dropped), and the read,
    past a turn's 256 messages, is kept whole in part and looked over at the next turn: that
    look goes over the whole backlog (the close began) and drops the part; a look over
    the read's last 44 messages alone (review 210 of 8b4f796) kept it."""
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
            # a read past a turn's worth, turned away (ending in a stream request): the
            # look at the next turn goes over the whole backlog (the close began), the part
            # of stream 10 too, which does not run now
            turned = [encode(Request(_rid(i), "work", b"0")) for i in range(1000, 1299)]
            writer.write(b"".join(turned) + encode(StreamRequest(_rid(5000), "total", b"0")))
            await wait_until(lambda: _rid(5000) in served._ended and kept.sorted, 5)
            assert len(kept.messages) == 2
            ids = range(100, 100 + ENDED_STREAMS + 44)
            writer.write(b"".join(encode(StreamRequest(_rid(i), "total", b"0")) for i in ids))
            await wait_until(lambda: _rid(ids[-1]) in served._ended and kept.sorted, 5)
            assert _rid(10) not in served._ended  # forgotten: its part runs now
            assert served.outbox.blocked  # (nothing rechecked the backlog)
            assert len(kept.messages) == 1, list(kept.messages)  # request 2 alone
        finally:
            writer.close()
            if closing is not None:
                closing.cancel()
