"""Review 217 (of 0afc1cb): during a graceful close, every stream that ran during it asks a
look over the whole backlog as it ends (``ServedStreams._end_stream`` ->
``_look_again_in_close``), whether or not a part of it is kept, so the stream requests a
peer had kept before the close cost one whole look each as they run: quadratic in the
backlog (measured: 2,000 kept, one slot, 1,997,001 messages looked over, 1.4 s; 4,000 kept,
7,994,001 looked over, 5.5 s, the loop busy; 0 and 0.12 s before 8fb7467, which brought the
marks this look replaced). "Bounded by handler slots" bounds the ends at a time, not the
looks: each end frees the slot the next kept stream request takes.
Real sockets on 127.0.0.1; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc.backlog import Backlog
from tests.rpc_helpers import wait_until
from wire.gotalk.encoding import encode
from wire.gotalk.messages import Request, StreamRequest

pytestmark = pytest.mark.both_loops

KEPT = 1500


def _rid(i: int) -> bytes:
    return i.to_bytes(4, "big")


async def test_kept_stream_requests_run_in_a_close_ask_no_whole_look_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One slot held by a request, ``KEPT`` stream requests (no parts) kept behind it,
    then the close begins and the slot frees: each runs and ends in turn. A look per
    message is fine; one over the whole backlog per stream served is not."""
    looked = [0]
    real = Backlog.run_replies

    def counted(self: Backlog, *args: Any) -> int:  # the real look, counted
        looked[0] += len(self.messages) if self.unlooked < 0 else self.unlooked
        return real(self, *args)

    monkeypatch.setattr(Backlog, "run_replies", counted)
    go = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(value: Any) -> Any:
        await go.wait()
        return value

    @reg.handle_stream("early")
    async def early(values: Any) -> int:
        return 0  # answers without reading its parts (none come)

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        closing: asyncio.Future[None] | None = None
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            requests = [StreamRequest(_rid(i), "early", b"0") for i in range(10, 10 + KEPT)]
            writer.write(b"".join(encode(m) for m in [Request(_rid(1), "hold", b"0"), *requests]))
            await wait_until(lambda: bool(server.peers), 5)
            [served] = server.peers
            await wait_until(lambda: len(served._kept.messages) == KEPT, 5)  # read before
            closing = asyncio.ensure_future(served.close(drain_timeout=60.0))
            await wait_until(lambda: served.gave_up is not None, 2)
            looked[0] = 0
            go.set()  # the slot frees: the kept stream requests run, one at a time
            await wait_until(lambda: not served._kept.messages and not served.handlers_running, 20)
            assert len(served._ended) == min(KEPT, 256)  # (they ran and ended)
            assert looked[0] <= 4 * KEPT, looked[0]
        finally:
            writer.close()
            if closing is not None:
                closing.cancel()
