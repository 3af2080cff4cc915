"""Hunt of rpc.stream_hold.RoomStall (b095a3b, 0f7e81a), by helper-106. Both fail on 0f7e81a.

- The stalled queues fail largest first, so a handler that read its parts and now waits
  for the peer's reply to its call back (a reply the pause itself holds unread) is failed
  instead of the handler that stopped reading whenever its queue holds more bytes
  (tests/test_rpc_parts_stall_review.py has the sizes the other way round).
- With every handler slot taken (no retry results), the failed stream's parts set aside
  for room wait for a slot its own handler holds: reading never resumes.

RoomStall now fails first the handler that took a part longest ago, and parts of a stream
that ended lately run at once (they are dropped) without a slot."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc import gotalk_peer
from tests.gotalk_raw import served_raw
from tests.rpc_helpers import wait_until
from tests.test_rpc_parts_stall import add_asker, ignoring
from wire import gotalk

pytestmark = pytest.mark.both_loops


async def test_the_larger_handler_waiting_for_a_held_reply_is_not_failed_first() -> None:
    """``stop`` read its first part, then never reads again, and holds 40 kB; ``ask`` read
    its first part, calls back and waits (timeout 10 s) for the reply, while 60 kB of its
    parts wait in its queue: 100 kB, the limit. Two more parts of ``stop`` are set aside
    for room, past the backlog's 25-kB share: reading pauses with the reply unread behind
    them. At the stall check (0.5 s) both took nothing since the pause, both took a part
    before; ``ask`` holds more, is failed, and its 60 kB suffice for reading to resume:
    ``stop`` stays, and ``ask``'s caller gets an error though it read every part it could."""
    cancelled = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle_stream("stop")
    async def stop(parts: Any) -> None:
        try:
            async for _ in parts:
                await asyncio.Event().wait()  # reads one part, then no more
        except asyncio.CancelledError:
            cancelled.set()
            raise

    add_asker(reg)

    options = rpc.Options(max_request_bytes=100_000, timeout=0.5)
    part = b'"' + b"p" * 19_998 + b'"'
    async with served_raw(reg, options, retry_results=False) as (raw, peer):
        await wait_until(lambda: peer.adapter.cancels)
        raw.write(gotalk.StreamRequest(b"0001", "stop", part))  # read
        for _ in range(2):  # 40 kB, never read
            raw.write(gotalk.StreamRequestPart(b"0001", part))
        raw.write(gotalk.StreamRequest(b"0002", "ask", part))
        callback = await raw.answer()  # ask took its first part and calls back
        assert isinstance(callback, gotalk.Request)
        assert callback.op == "back"
        for _ in range(3):  # 60 kB in ask's queue: the 100 kB taken
            raw.write(gotalk.StreamRequestPart(b"0002", part))
        for _ in range(2):  # 40 kB of stop's set aside: past the 25-kB share
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
        assert message == gotalk.StreamResult(b"0002", b"4")  # all four parts read
        raw.write(gotalk.Notification(gotalk_peer.CANCEL, b"0001"))
        async with asyncio.timeout(5):
            await cancelled.wait()


@pytest.mark.parametrize("max_concurrent", [1, 2])
async def test_a_failed_streams_parts_set_aside_do_not_wait_for_its_own_slot(
    max_concurrent: int,
) -> None:
    """tests/test_rpc_parts_stall.py's never-reading handler with every handler slot taken
    (``max_concurrent`` streams, the raw peer takes no retry results): RoomStall fails its
    stream and drops its queued parts, but the parts set aside for room come back to the
    backlog where, no longer parts of a running stream (``serves_running`` is False for an
    ended one), they wait for a handler slot, which the failed handler (still running: it
    never reads the error) holds; they still count against the backlog's share, so reading
    stays paused for good and the cancellation sent once the stream failed is never read:
    the input held until the connection closes, what RoomStall was made to end. (With a
    slot free the parts run, are dropped, and reading resumes.)"""
    cancelled = asyncio.Event()
    reg = ignoring(cancelled)

    @reg.handle_stream("idle")
    async def idle(parts: Any) -> int:
        return len([p async for p in parts])  # reads all it gets: it just gets none yet

    options = rpc.Options(max_request_bytes=100_000, timeout=0.5, max_concurrent=max_concurrent)
    part = b'"' + b"p" * 19_998 + b'"'
    async with served_raw(reg, options, retry_results=False) as (raw, peer):
        await wait_until(lambda: peer.adapter.cancels)
        for i in range(1, max_concurrent):  # the other slots: streams still open
            raw.write(gotalk.StreamRequest(b"%04d" % (i + 1), "idle", b""))
        raw.write(gotalk.StreamRequest(b"0001", "ignore", b""))
        for _ in range(10):  # 100 kB: the limit; then 100 kB set aside: past the share
            raw.write(gotalk.StreamRequestPart(b"0001", part))
        await wait_until(lambda: not peer.reading and peer._request_bytes.full)
        await wait_until(lambda: not peer.has_stream(b"0001"))  # RoomStall failed it
        raw.write(gotalk.Notification(gotalk_peer.CANCEL, b"0001"))
        async with asyncio.timeout(5):  # ten stall limits
            await cancelled.wait()
        await wait_until(lambda: peer._request_bytes.used == 0)  # its bytes went back
