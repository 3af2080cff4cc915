"""A stream's ``timeout`` bounds the whole stream even while its results keep coming: a
reader that never finds its queue empty (a fast peer, a reader that gives the loop a turn
per result) still gets RequestTimeout at the deadline. A Go-like server written by hand
(no request metadata, so the deadline is ours alone to keep) sends a burst of results."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.gotalk_raw import RawGotalk
from tests.rpc_helpers import served
from wire import gotalk

BURST = 3000
DEADLINE = 0.2


@contextlib.asynccontextmanager
async def bursting_server() -> AsyncIterator[str]:
    """Answers every request with ``BURST`` stream results in one write, and no end."""
    ends: list[RawGotalk] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = RawGotalk.accept(reader, writer)
        ends.append(raw)
        with contextlib.suppress(AssertionError, ConnectionError):  # the client closed
            while True:
                message = await raw.next()
                if isinstance(message, gotalk.Request | gotalk.StreamRequest):
                    part = b"".join(gotalk.encode_parts(gotalk.StreamResult(message.id, b"1")))
                    raw.writer.write(part * BURST)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    async with server:
        try:
            yield f"tcp+gotalk://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        finally:
            for raw in ends:
                with contextlib.suppress(ConnectionError):
                    await raw.close()


async def test_the_deadline_holds_while_results_are_always_queued() -> None:
    async with bursting_server() as url, rpc.connect(url) as peer:
        read = 0
        started = time.monotonic()
        with pytest.raises(rpc.RequestTimeout, match="not done within"):
            async for _ in peer.stream("op", timeout=DEADLINE, item_timeout=5):
                read += 1
                time.sleep(0.0005)  # a reader slower than the peer: its queue never empties
                await asyncio.sleep(0)  # the loop's turn: the peer's results come meanwhile
        elapsed = time.monotonic() - started
        # before: every one of the BURST results was read (>= 1.5 s), the deadline unseen
        # until the queue ran dry
        assert read < BURST
        assert elapsed < DEADLINE + 0.5


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_stream_done_within_its_timeout_is_read_to_its_end(flavour: str) -> None:
    """A stream whose results and end all came within ``timeout`` is read to its end by a
    reader slower than the deadline, as a request's result is taken whenever it is
    awaited (helper-131's review: the deadline was checked before the end too, and the
    results received were lost to a RequestTimeout)."""
    reg = rpc.Registry()

    @reg.handle("three")
    async def three(_: Any) -> Any:
        for i in range(3):
            yield i

    async with served(flavour, reg) as (_, peer):
        got = []
        async for x in peer.stream("three", value=None, timeout=0.3, item_timeout=5):
            got.append(x)
            await asyncio.sleep(0.2)  # the reader's own work, after all results came
        assert got == [0, 1, 2]
