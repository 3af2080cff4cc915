"""Review 215 of 8fb7467: a part of a stream ended before a graceful close, kept (our output
waits) and marked in ``_ended`` by the close's start, escapes when the stream's end comes
during the close: ``InputFlow._runs_now`` lets the end run at once (the stream is in
``_ended`` and not kept), overtaking the kept part, and ``on_request_end`` deletes the
entry, mark and all, asking no look. The part then stays kept behind a request read before
the close while our output waits, as review 214's forgotten streams did (there, forgetting
a marked stream looks again: tests/test_backlog_looks_close.py). Real sockets on
127.0.0.1; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
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

    return reg


async def test_a_kept_part_is_dropped_once_its_streams_end_unmarks_it() -> None:
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
            assert served._ended[_rid(10)]  # marked by the close's start
            writer.write(encode(StreamRequestPart(_rid(10), b"")))  # its end: runs at once
            await wait_until(lambda: _rid(10) not in served._ended, 5)  # entry and mark gone
            assert served.outbox.blocked
            # the part goes, request 2 (read before the close) waits for our output
            await wait_until(lambda: len(kept.messages) == 1, 1)
        finally:
            writer.close()
            if closing is not None:
                closing.cancel()
