"""Parts of a running stream set aside for room in ``max_request_bytes`` (rpc.backlog's
room park, 8eef97e): room that comes back in the middle of a read does not let later parts
overtake them, and parts set aside keep reading paused at the backlog's bound. Both failed
on 8eef97e (found in review by helper-101)."""

from __future__ import annotations

import asyncio
from typing import Any

import rpc
from rpc import gotalk_peer
from tests.gotalk_raw import RawGotalk, served_raw
from tests.rpc_helpers import wait_until
from wire import gotalk


async def reply(raw: RawGotalk) -> Any:
    """The next message but a notification (the announcement's answer)."""
    while isinstance(message := await raw.next(), gotalk.Notification):
        pass
    return message


def cancel(raw: RawGotalk, rid: bytes) -> None:
    raw.write(gotalk.Notification(gotalk_peer.CANCEL, rid))


async def test_room_back_while_a_read_is_taken_keeps_the_parts_order() -> None:
    """One read: a stream request, a request whose 150 kB payload takes
    ``max_request_bytes`` (its job not started yet), part 1 (no room: set aside), the
    cancellation of that request (its queued job is dropped at once: room comes back
    during the read), parts 2 and 3, the end. Part 1 must still come first; the rest of
    the read must not run ahead of it (nor the end, after which part 1 would be a part
    for an unknown stream)."""
    reg = rpc.Registry()

    @reg.handle_stream("collect")
    async def collect(parts: Any) -> list[Any]:
        return [part async for part in parts]

    @reg.handle("nap")
    async def nap(value: Any) -> int:
        await asyncio.Event().wait()
        return len(value)

    options = rpc.Options(max_request_bytes=100_000)
    async with served_raw(reg, options, retry_results=True) as (raw, peer):
        await wait_until(lambda: peer.adapter.cancels)
        raw.write(gotalk.StreamRequest(b"0001", "collect", b""))
        raw.request_alone(b"0002", "nap", b'"' + b"x" * 150_000 + b'"')
        raw.write(gotalk.StreamRequestPart(b"0001", b"1"))
        cancel(raw, b"0002")
        raw.write(gotalk.StreamRequestPart(b"0001", b"2"))
        raw.write(gotalk.StreamRequestPart(b"0001", b"3"))
        raw.write(gotalk.StreamRequestPart(b"0001", b""))
        async with asyncio.timeout(5):
            answer = await reply(raw)
        assert answer == gotalk.StreamResult(b"0001", b"[1,2,3]")


async def test_parts_set_aside_for_room_keep_reading_paused_past_the_bound() -> None:
    """Parts of a stream whose handler does not read wait for ``max_request_bytes`` until
    the backlog is full: reading pauses. Each time a handler ends, the backlog gets a turn
    (here, at notifications kept between the parts); with the parts set aside it must
    not read on while they alone fill the bound: a read more each time would let the
    peer grow the backlog past it, one read (256 KiB) per handler that ends."""
    gate = asyncio.Event()
    tokens: asyncio.Queue[None] = asyncio.Queue()
    reg = rpc.Registry()

    @reg.handle_stream("later")
    async def later(parts: Any) -> int:
        await gate.wait()
        return len([part async for part in parts])

    @reg.handle("nap")
    async def nap(value: Any) -> Any:
        await tokens.get()
        return value

    limit = 100_000
    naps = 20
    options = rpc.Options(max_request_bytes=limit)
    async with served_raw(reg, options, retry_results=True) as (raw, peer):
        kept = peer._kept
        raw.write(gotalk.StreamRequest(b"0001", "later", b""))
        for n in range(naps):
            raw.request_alone(b"%04d" % (100 + n), "nap", b"1")
        await wait_until(lambda: peer.handlers_running == naps + 1)
        big = b'"' + b"x" * 60_000 + b'"'
        for _ in range(2):  # max_request_bytes taken, unread by the handler
            raw.write(gotalk.StreamRequestPart(b"0001", big))
        part = b'"' + b"p" * 1000 + b'"'
        for n in range(8000):  # 8 MB: much more than the backlog may keep
            raw.write(gotalk.StreamRequestPart(b"0001", part))
            if n % 50 == 0:
                raw.write(gotalk.Notification("nobody.listens", b""))
        await wait_until(lambda: kept.full and not peer.reading)
        paused_at = kept.bytes
        for _ in range(naps):  # a handler ends: a turn at the backlog
            tokens.put_nowait(None)
            async with asyncio.timeout(5):
                answer = await reply(raw)
            assert isinstance(answer, gotalk.Result)
            for _ in range(50):  # loop iterations: a read that resumed would be in
                await asyncio.sleep(0)
        # at most one read more than when it paused (256 KiB, counted with overhead)
        assert kept.bytes < paused_at + 400_000, (paused_at, kept.bytes, len(kept))
        gate.set()
        await wait_until(lambda: peer.reading, timeout=20)  # room back: it reads on
