"""Review 213 of e035c06: during a graceful close (a peer without retry results, our output
waiting), every stream request the close turns away past ``ENDED_STREAMS`` forgets one, and
``ServedStreams._end_stream`` then asks a look over the whole backlog, whether or not a part
of the forgotten stream is kept. A peer that sends turned-away stream requests, a few per
read, so makes the server look over its whole backlog once per read (the next read is kept
whole and reading pauses until that look): 7,990 kept requests, 3 s of such reads cost 713
looks (5.7 million ``_runs_now`` calls, 2.3 s of CPU in ``run_replies``) against 1 look on
e035c06^. Nothing kept belongs to a forgotten stream here, so no look is needed. Real
sockets on 127.0.0.1; bounded waits, no fixed sleep. FAILS on main (e035c06)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc.backlog import Backlog
from rpc.served_streams import ENDED_STREAMS
from tests.rpc_helpers import wait_until
from wire.gotalk.encoding import encode
from wire.gotalk.messages import Request, StreamRequest

pytestmark = pytest.mark.both_loops

KEPT = 2000
READS = 20
PER_READ = 100


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


async def test_forgetting_streams_with_no_kept_part_asks_no_whole_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked = [0]
    real = Backlog.run_replies

    def counted(self: Backlog, *args: Any) -> int:  # the real look, counted
        looked[0] += len(self.messages) if self.unlooked < 0 else self.unlooked
        return real(self, *args)

    monkeypatch.setattr(Backlog, "run_replies", counted)
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
            requests = (encode(Request(_rid(i), "work", b"0")) for i in range(2, 2 + KEPT))
            writer.write(b"".join(requests))
            await wait_until(lambda: len(kept.messages) == KEPT and served.reading, 5)
            closing = asyncio.ensure_future(served.close(drain_timeout=10.0))
            await wait_until(lambda: served.gave_up is not None, 2)
            looked[0] = 0
            first = 100_000
            for n in range(READS):  # turned away as read; past ENDED_STREAMS each forgets one
                ids = range(first + n * PER_READ, first + (n + 1) * PER_READ)
                writer.write(b"".join(encode(StreamRequest(_rid(i), "total", b"0")) for i in ids))
                last = _rid(ids[-1])
                await wait_until(lambda: last in served._ended and served.reading, 5)  # noqa: B023
            assert READS * PER_READ > 2 * ENDED_STREAMS
            assert len(kept.messages) == KEPT  # the requests read before the close wait
            # a look per message read is fine; one over the whole backlog per read is not
            assert looked[0] <= 2 * KEPT + READS * PER_READ, looked[0]
        finally:
            writer.close()
            if closing is not None:
                closing.cancel()
