"""A TCP peer's FIN closes the connection and cancels what runs for it, at once: a FIN
cannot tell a peer that left from one that only stopped sending (``shutdown(SHUT_WR)``),
and work for one that left would run on for nothing (see ``Peer.eof_received``). A
half-closing client still gets what its read answered at once (plain handlers). Real
servers on 127.0.0.1, both loops; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from tests.gotalk_raw import RawGotalk
from wire import gotalk

pytestmark = pytest.mark.both_loops


def _rid(number: int) -> bytes:
    return number.to_bytes(4, "little")


def _waiting() -> tuple[rpc.Registry, asyncio.Event, asyncio.Event]:
    """A registry whose ``wait`` waits for good, and the events of its start and its
    cancellation."""
    started, cancelled = asyncio.Event(), asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("wait")
    async def wait(value: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()  # set by nothing
        except asyncio.CancelledError:
            cancelled.set()
            raise

    return reg, started, cancelled


async def test_a_fin_cancels_the_handlers_running_for_the_peer_and_closes() -> None:
    """A plain handler's answer, from the read before the FIN, goes out; the coroutine
    handler still waiting is cancelled at the FIN, and the connection closes: it would
    otherwise wait for good (its event is never set)."""
    reg, started, cancelled = _waiting()

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as server:
        raw = await RawGotalk.connect(server.url.port)
        try:
            raw.request_alone(_rid(1), "wait", b"1")
            raw.request_alone(_rid(2), "echo", b"2")
            await asyncio.wait_for(started.wait(), 5)
            raw.writer.write_eof()
            await asyncio.wait_for(cancelled.wait(), 5)
            data = await asyncio.wait_for(raw.reader.read(), 5)  # up to the server's close
        finally:
            await raw.close()
    results = [m for m in raw.codec.receive_data(data) if isinstance(m, gotalk.Result)]
    assert results == [gotalk.Result(_rid(2), b"2")]  # not the cancelled handler's


@pytest.mark.parametrize("scheme", ["tcp+gotalk", "tcp+sbs"])
async def test_a_client_that_closes_has_its_handlers_cancelled(scheme: str) -> None:
    """A peerwire client closing (abort: a FIN, no drain) while its call runs: the
    server's handler is cancelled at once, not left to run for a peer that left."""
    reg, started, cancelled = _waiting()
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=reg) as server:
        client = await rpc.connect(str(server.url), reconnect=False)
        call = asyncio.ensure_future(client.request("wait", 1, timeout=30))
        await asyncio.wait_for(started.wait(), 5)
        client.abort()
        await asyncio.wait_for(cancelled.wait(), 5)
        with pytest.raises(rpc.ConnectionClosed):
            await call
