"""A stream handler that never reads its parts, while they hold ``max_request_bytes`` and
more of them fill the backlog's share: reading pauses, so what the peer sends next (here
its cancellation of that stream) is not read. The handler's stream now fails once it took
no part for its stall limit (the request timeout, as for a full stream queue): its parts'
bytes go back, reading resumes, and the cancellation reaches the handler. Before (62035c3)
the handler held its slot, and the connection its input, until the connection closed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc import gotalk_peer
from tests.gotalk_raw import served_raw
from tests.rpc_helpers import wait_until
from wire import gotalk

pytestmark = pytest.mark.both_loops


def ignoring(cancelled: asyncio.Event) -> rpc.Registry:
    """A registry whose stream handler ``ignore`` never reads its parts; ``cancelled`` is
    set when it is cancelled."""
    reg = rpc.Registry()

    @reg.handle_stream("ignore")
    async def ignore(parts: Any) -> None:
        try:
            await asyncio.Event().wait()  # never reads its parts
        except asyncio.CancelledError:
            cancelled.set()
            raise

    return reg


def add_asker(reg: rpc.Registry) -> None:
    """Adds ``ask``: a stream handler that, for each part it reads, calls the peer back
    (``back``, timeout 10 s) and waits for the reply; returns how many parts it read."""

    @reg.handle_stream("ask")
    async def ask(parts: Any) -> int:
        count = 0
        async for _ in parts:
            count += 1
            await rpc.current_peer.get().request("back", None, timeout=10)
        return count


@pytest.mark.parametrize("then", ["parts", "requests"])
async def test_a_stream_handler_that_never_reads_is_failed_and_its_cancel_read(then: str) -> None:
    """Its parts take the 100 kB of request bytes; then more parts (set aside for room), or
    requests (kept: the raw peer takes no retry results), fill the backlog's 25-kB share."""
    cancelled = asyncio.Event()
    reg = ignoring(cancelled)

    @reg.handle("echo")
    async def echo(value: Any) -> Any:
        return value

    # a stall limit of 0.5 s (the request timeout); 100 kB of request bytes, a 25-kB share
    options = rpc.Options(max_request_bytes=100_000, timeout=0.5)
    # (requests past the bytes are kept, not retried, as for a browser's gotalk.js)
    async with served_raw(reg, options, retry_results=False) as (raw, peer):
        await wait_until(lambda: peer.adapter.cancels)
        raw.write(gotalk.StreamRequest(b"0001", "ignore", b""))
        part = b'"' + b"p" * 19_998 + b'"'
        for _ in range(5):  # 100 kB: the limit
            raw.write(gotalk.StreamRequestPart(b"0001", part))
        for i in range(5):  # 100 kB more: past the share
            if then == "parts":
                raw.write(gotalk.StreamRequestPart(b"0001", part))
            else:
                raw.request_alone(b"%04d" % (i + 2), "echo", part)
        raw.write(gotalk.Notification(gotalk_peer.CANCEL, b"0001"))
        async with asyncio.timeout(5):
            await cancelled.wait()
        await wait_until(lambda: peer._request_bytes.used == 0)  # its bytes went back
