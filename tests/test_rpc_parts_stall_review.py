"""Review of rpc.stream_hold.RoomStall (b095a3b, by helper-104): a pause that began before
the bytes filled was never armed, so the stream handler that never reads still held the
input for good; and a check failed every queue that took nothing, a handler waiting for a
reply that the pause held among them. Both failed on b095a3b."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc import gotalk_peer
from rpc.backlog import MESSAGES_PER_TURN
from tests.gotalk_raw import served_raw
from tests.rpc_helpers import wait_until
from tests.test_rpc_parts_stall import add_asker, ignoring
from wire import gotalk

pytestmark = pytest.mark.both_loops


def _encoded(*messages: Any) -> bytes:
    return b"".join(b"".join(gotalk.encode_parts(m)) for m in messages)


async def test_bytes_filled_after_a_turn_cut_still_fail_the_stalled_stream() -> None:
    """One read of more than MESSAGES_PER_TURN messages: the first 256 (the stream request
    and notifications nobody handles) run, the rest is kept for the next turn with
    max_request_bytes not yet full, so InputFlow._keep does not arm RoomStall. That turn
    (InputFlow._continue) runs the parts: they fill the bytes, the rest is set aside for
    room, the backlog's share is full and reading stays paused, with nothing armed: the
    cancellation after them is never read."""
    cancelled = asyncio.Event()
    options = rpc.Options(max_request_bytes=10_000, timeout=0.5)
    async with served_raw(ignoring(cancelled), options, retry_results=False) as (raw, peer):
        await wait_until(lambda: peer.adapter.cancels)
        filler = [gotalk.Notification("nobody", b"") for _ in range(MESSAGES_PER_TURN)]
        part = b'"' + b"p" * 998 + b'"'
        parts = [gotalk.StreamRequestPart(b"0001", part) for _ in range(20)]  # 20 kB
        # one write of ~24 kB: one read on 127.0.0.1
        raw.writer.write(_encoded(gotalk.StreamRequest(b"0001", "ignore", b""), *filler, *parts))
        await wait_until(lambda: not peer.reading and peer._request_bytes.full)
        raw.write(gotalk.Notification(gotalk_peer.CANCEL, b"0001"))
        async with asyncio.timeout(5):  # ten stall limits
            await cancelled.wait()
        await wait_until(lambda: peer._request_bytes.used == 0)


async def test_a_handler_waiting_for_a_reply_behind_the_pause_is_not_failed_with_it() -> None:
    """Two streams hold the bytes while reading is paused: ``ignore`` never reads; ``ask``
    read a part and waits for the peer's reply to its call back, which the pause holds
    unread (the docs promise such handlers their replies). At the stall check both took
    nothing, and RoomStall fails both at once; failing ``ignore`` alone gives the bytes
    back, reading resumes and ``ask`` gets its reply and reads on."""
    cancelled = asyncio.Event()
    reg = ignoring(cancelled)

    add_asker(reg)

    options = rpc.Options(max_request_bytes=100_000, timeout=0.5)
    part = b'"' + b"p" * 19_998 + b'"'
    async with served_raw(reg, options, retry_results=False) as (raw, peer):
        await wait_until(lambda: peer.adapter.cancels)
        raw.write(gotalk.StreamRequest(b"0001", "ignore", b""))
        for _ in range(3):  # 60 kB, never read
            raw.write(gotalk.StreamRequestPart(b"0001", part))
        raw.write(gotalk.StreamRequest(b"0002", "ask", part))
        raw.write(gotalk.StreamRequestPart(b"0002", part))
        callback = await raw.answer()  # ask took its first part and calls back
        assert isinstance(callback, gotalk.Request)
        assert callback.op == "back"
        for _ in range(3):  # past the 100 kB; then 40 kB set aside: past the 25-kB share
            raw.write(gotalk.StreamRequestPart(b"0001", part))
        await wait_until(lambda: not peer.reading and peer._request_bytes.full)
        raw.write(gotalk.StreamRequestPart(b"0002", b""))  # ask's end
        raw.write(gotalk.Result(callback.id, b"null"))  # unread until the pause ends
        while True:  # ask: each part's callback answered, then its result
            message = await raw.answer()
            if isinstance(message, gotalk.Request):
                raw.write(gotalk.Result(message.id, b"null"))
            elif message.id == b"0002":
                break
        assert message == gotalk.StreamResult(b"0002", b"2")  # both parts read
        raw.write(gotalk.Notification(gotalk_peer.CANCEL, b"0001"))
        async with asyncio.timeout(5):
            await cancelled.wait()
