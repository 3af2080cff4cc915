"""Hunt of ``InputFlow._run``'s room path (helper-108): a part of a stream whose parts wait
for ``max_request_bytes`` room is set aside there, and when that fills the backlog the
rest of the read was kept, reading paused, with no turn due (as ``_hold`` before 4703590).

A handler's payload takes all of ``max_request_bytes`` (no stream queue holds bytes, so
:class:`~rpc.stream_hold.RoomStall` has nothing to fail); a running stream's first part
finds no room and is set aside (reading goes on: the backlog has room). One read then
brings a larger part of that stream, which fills the backlog, and what the handler
holding the bytes waits for: the reply to its call back, or its cancellation. Kept unrun
with no turn due, they waited for a turn that only that handler's end (or room) would
give: input held until its call's deadline (30 s here) or the connection's end. All four
cases failed, on both loops, before the rest of such a read got a turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from rpc import gotalk_peer
from tests.gotalk_raw import RawGotalk, served_raw
from tests.rpc_helpers import wait_until
from wire import gotalk

pytestmark = pytest.mark.both_loops

LIMIT = 6 * 1024
"""``max_request_bytes``: the backlog is full at a quarter of it (1.5 KiB) once the
handlers' payloads take it all."""

TAKES_ALL = b'"' + b"x" * 7998 + b'"'
"""A request payload of 8 kB: more than the limit (the first payload is always taken)."""

FILLS = b'"' + b"p" * 1998 + b'"'
"""A part of 2 kB: set aside for room, it fills the backlog."""


def registry(cancelled: asyncio.Event) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle_stream("collect")
    async def collect(parts: Any) -> int:
        return len([p async for p in parts])

    @reg.handle("ask")
    async def ask(value: Any) -> Any:
        return await rpc.current_peer.get().request("back", len(value), timeout=30)

    @reg.handle("hold")
    async def hold(value: Any) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    return reg


def one_read(raw: RawGotalk, messages: list[Any]) -> None:
    """Write ``messages`` at once: they arrive in one read."""
    raw.writer.write(b"".join(b"".join(gotalk.encode_parts(m)) for m in messages))


async def results(raw: RawGotalk, count: int) -> dict[bytes, Any]:
    """The results of ``count`` calls, by id (the handlers' deadlines: 30 s)."""
    got: dict[bytes, Any] = {}
    async with asyncio.timeout(5):
        while len(got) < count:
            message = await raw.answer()
            got[message.id] = message
    return got


async def room_taken(raw: RawGotalk, peer: Any, rid: bytes, op: str) -> None:
    """A running stream ``0001``; ``op``'s payload takes ``max_request_bytes``; a first
    part of the stream is set aside for room, with reading going on."""
    await wait_until(lambda: peer.adapter.cancels)
    raw.write(gotalk.StreamRequest(b"0001", "collect", b""))
    await wait_until(lambda: peer.handlers_running == 1)
    raw.request_alone(rid, op, TAKES_ALL)
    await wait_until(lambda: peer._request_bytes.full)
    raw.write(gotalk.StreamRequestPart(b"0001", b"1"))
    await wait_until(lambda: bool(peer._kept.room))
    assert peer.reading and not peer._kept.full


@pytest.mark.parametrize("retry_results", [True, False])
async def test_a_reply_after_a_part_that_fills_the_backlog_still_runs(
    retry_results: bool,
) -> None:
    reg = registry(asyncio.Event())
    options = rpc.Options(max_request_bytes=LIMIT)
    async with served_raw(reg, options, retry_results=retry_results) as (raw, peer):
        await room_taken(raw, peer, b"0002", "ask")
        callback = await raw.answer()  # ask holds the bytes and waits for this
        assert isinstance(callback, gotalk.Request)
        assert callback.op == "back"
        end = gotalk.StreamRequestPart(b"0001", b"")
        reply = gotalk.Result(callback.id, b'"v!"')
        one_read(raw, [gotalk.StreamRequestPart(b"0001", FILLS), reply, end])
        assert await results(raw, 2) == {
            b"0002": gotalk.Result(b"0002", b'"v!"'),
            b"0001": gotalk.StreamResult(b"0001", b"2"),
        }
        await wait_until(lambda: peer.handlers_running == 0 and not len(peer._kept))


@pytest.mark.parametrize("retry_results", [True, False])
async def test_a_cancellation_after_a_part_that_fills_the_backlog_still_runs(
    retry_results: bool,
) -> None:
    cancelled = asyncio.Event()
    options = rpc.Options(max_request_bytes=LIMIT)
    async with served_raw(registry(cancelled), options, retry_results=retry_results) as (
        raw,
        peer,
    ):
        await room_taken(raw, peer, b"0002", "hold")
        end = gotalk.StreamRequestPart(b"0001", b"")
        cancel = gotalk.Notification(gotalk_peer.CANCEL, b"0002")
        one_read(raw, [gotalk.StreamRequestPart(b"0001", FILLS), cancel, end])
        async with asyncio.timeout(5):
            await cancelled.wait()
        got = await results(raw, 2)
        assert isinstance(got[b"0002"], gotalk.ErrorResult)  # cancelled
        assert got[b"0001"] == gotalk.StreamResult(b"0001", b"2")
        await wait_until(lambda: peer.handlers_running == 0 and not len(peer._kept))
