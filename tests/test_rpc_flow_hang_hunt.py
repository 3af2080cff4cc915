"""Hunt of the hang helper-106's randomized input-flow search left unexamined (gotalk,
``max_concurrent=1``, ``max_request_bytes`` 6 KiB: a running stream, ``kept.sorted`` False,
no turn due), by helper-107.

One handler holds the only slot (no retry results). One read brings a request that waits
for that slot, parts of it large enough to fill the backlog, and then what the running
handler waits for: the rest of its stream's parts, or the reply to its call back.
``Backlog.take`` stops just past the message that filled the backlog and ``InputFlow._hold``
keeps the rest of the read whole (not ``sorted``), reading paused, with no turn due: the
messages that would run now (``run_replies`` in ``_continue``) wait for a turn that only
the running handler's end would give, and it waits for them. Input held until the
handler's deadline (30 s here) or the connection's end, though what it waits for was read.
All four cases failed on 62035c3 and on 5a8c9be; the rest of a read kept there now gets a
turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rpc
from tests.gotalk_raw import served_raw
from tests.rpc_helpers import wait_until
from wire import gotalk

pytestmark = pytest.mark.both_loops

BIG = b'"' + b"p" * 3998 + b'"'
"""A part of 4 kB: two of them pass the backlog's bound (6 KiB, nothing else held)."""


def registry(called_back: asyncio.Event) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle_stream("collect")
    async def collect(parts: Any) -> int:
        return len([p async for p in parts])

    @reg.handle("ask")
    async def ask(value: Any) -> Any:
        called_back.set()
        return await rpc.current_peer.get().request("back", value, timeout=30)

    @reg.handle_stream("waiting")
    async def waiting(parts: Any) -> int:  # kept: the only slot is taken
        return len([p async for p in parts])

    return reg


def waiting_and_filling() -> list[Any]:
    """A stream request kept for the slot, then parts of it that fill the backlog."""
    return [
        gotalk.StreamRequest(b"0002", "waiting", b"1"),
        gotalk.StreamRequestPart(b"0002", BIG),
        gotalk.StreamRequestPart(b"0002", BIG),
        gotalk.StreamRequestPart(b"0002", b""),
    ]


async def send_as_one_read(raw: Any, messages: list[Any]) -> None:
    raw.writer.write(b"".join(b"".join(gotalk.encode_parts(m)) for m in messages))
    await raw.writer.drain()


async def answer(raw: Any) -> Any:
    """The next message but a notification (as RawGotalk.answer, absent at 62035c3)."""
    while isinstance(message := await raw.next(), gotalk.Notification):
        pass
    return message


async def results(raw: Any, count: int) -> dict[bytes, bytes]:
    """The first result of ``count`` calls (a stream handler's value, before its end)."""
    got: dict[bytes, bytes] = {}
    async with asyncio.timeout(5):  # (the handlers' deadlines: 30 s)
        while len(got) < count:
            message = await answer(raw)
            got.setdefault(message.id, message.payload)
    return got


async def test_a_running_streams_parts_kept_past_the_full_mark_still_run() -> None:
    options = rpc.Options(max_concurrent=1, max_request_bytes=6 * 1024)
    async with served_raw(registry(asyncio.Event()), options, retry_results=False) as (raw, peer):
        await wait_until(lambda: peer.adapter.cancels)
        raw.write(gotalk.StreamRequest(b"0001", "collect", b"0"))
        await wait_until(lambda: peer.handlers_running == 1)  # it holds the only slot
        parts = [gotalk.StreamRequestPart(b"0001", b"%d" % i) for i in range(1, 4)]
        end = gotalk.StreamRequestPart(b"0001", b"")
        await send_as_one_read(raw, [*waiting_and_filling(), *parts, end])
        assert await results(raw, 2) == {b"0001": b"4", b"0002": b"3"}
        await wait_until(lambda: peer.handlers_running == 0 and not len(peer._kept))


async def test_a_reply_kept_past_the_full_mark_still_runs() -> None:
    called_back = asyncio.Event()
    options = rpc.Options(max_concurrent=1, max_request_bytes=6 * 1024)
    async with served_raw(registry(called_back), options, retry_results=False) as (raw, peer):
        await wait_until(lambda: peer.adapter.cancels)
        raw.write(gotalk.Request(b"0001", "ask", b'"v"'))
        callback = await answer(raw)  # the handler holds the only slot, waits for this
        assert isinstance(callback, gotalk.Request)
        assert callback.op == "back"
        reply = gotalk.Result(callback.id, b'"v!"')
        await send_as_one_read(raw, [*waiting_and_filling(), reply])
        assert await results(raw, 2) == {b"0001": b'"v!"', b"0002": b"3"}
        await wait_until(lambda: peer.handlers_running == 0 and not len(peer._kept))
