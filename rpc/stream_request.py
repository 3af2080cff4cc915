"""Sending a stream request of ours while its results are read.

A handler may answer each part as it comes (``async for p in parts: yield p``). Were every
part sent before the caller read a result, a long stream would deadlock: its results fill
the caller's queue, the connection's reading pauses (:mod:`rpc.stream_hold`), the peer's
output backs up, it stops reading, our parts stop going out, and the stream fails only at
its ``item_timeout``. So :func:`send` sends the request with its first part and registers
the call; a plain iterable's parts follow at once while the transport takes them (no
await: a small stream costs what it did, and with no other call in flight is written at
once with its end, see :meth:`rpc.outbox.Outbox.hold`); from the first wait on (the
transport is full, or the source is an async iterable) a task of the call's own, its
*feeder*, sends the rest, and the caller reads results meanwhile.

The feeder is owned by the call (``_Call.feeder``, see :mod:`rpc.calls`) and ends with it:
the call answered (a result, an error; its parts stop quietly, as before), forgotten (its
reader left, timed out or was cancelled) or failed with the connection cancels it, so it
never outlives the connection. Its own failures (the source raising, a part over
``max_size``, RequestTimeout waiting for the peer to take our output or for the source
past the stream's deadline, ConnectionClosed) go to the stream's reader after the results
queued before them, and the call is forgotten (a peer that takes cancellation is told): it
never ends with an exception no one retrieves. While it sends, the reader's wait for a
result has the stream's deadline alone (:class:`~rpc.streaming.ResultWait`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from rpc.payload import encode_value
from rpc.streaming import END, PARTS_PER_TURN, PartSource, ResultWait, StreamQueue

if TYPE_CHECKING:
    from rpc.calls import Caller, _Call

K = TypeVar("K")


async def send(
    caller: Caller[K],
    op: str,
    parts: Iterable[Any] | AsyncIterable[Any],
    queue: StreamQueue,
    wait: ResultWait,
    send_first: Callable[[bytes], K],
) -> K:
    """Send a stream request of ours and register ``queue`` for its results; its key.
    ``send_first(data)`` sends the request with its first part (the plain and the
    middleware paths encode and check it their own ways). A failure before the feeder
    starts (the source, an oversized part, the deadline) forgets the call (which tells the
    peer) and raises here; a connection lost while the first part is awaited raises
    ConnectionClosed once it comes."""
    source = PartSource(parts, wait)
    first = await source.next()
    caller._check_open()  # the connection may have gone while the source waited
    outbox = caller.outbox
    # taking a plain iterable's part never returns to the loop: the hold is kept
    held = not source.awaits and not caller._calls and outbox.hold()
    try:
        key = send_first(b"" if first is END else encode_value(first))
        call = caller._stream_call(key, queue)
        try:
            if first is END or (not source.awaits and _send_ready(caller, key, op, source)):
                caller.adapter.send_request_end(key)
                return key
        except BaseException:
            caller._forget(key)
            raise
    finally:
        if held:  # before the feeder's first wait for the transport to drain
            outbox.release()
    wait.feeding += 1  # undone when the task is done, even if cancelled before it ran
    feeder = call.feeder = caller._loop.create_task(_feed(caller, key, call, source, queue, wait))
    feeder.add_done_callback(lambda _: _fed(wait, queue))
    return key


def _fed(wait: ResultWait, queue: StreamQueue) -> None:
    wait.feeding -= 1
    queue.wake()  # its reader's item_timeout counts from now


def _send_ready(caller: Caller[K], key: K, op: str, source: PartSource) -> bool:
    """Send a plain iterable's parts while the transport takes them, at most
    :data:`PARTS_PER_TURN`: True once all went."""
    outbox, adapter = caller.outbox, caller.adapter
    for _ in range(PARTS_PER_TURN):
        if outbox.blocked:
            return False
        part = source.take()
        if part is END:
            return True
        adapter.send_request_part(key, caller._checked_payload(op, encode_value(part)))
    return False


async def _feed(
    caller: Caller[K],
    key: K,
    call: _Call,
    source: PartSource,
    queue: StreamQueue,
    wait: ResultWait,
) -> None:
    """The rest of ``key``'s parts and its end, each sent once the transport takes more
    (within ``item`` seconds and the deadline); see the module doc for how it ends."""
    calls, outbox, adapter, op = caller._calls, caller.outbox, caller.adapter, wait.op
    sent = 0
    try:
        while (part := await source.next()) is not END:
            if outbox.blocked:
                wait.check()  # past the deadline: no coroutine made
                await wait.bounded(outbox.wait_writable(), each=True)  # a turn too
                sent = 0
            elif sent >= PARTS_PER_TURN:  # a source that never waits yields the loop
                sent = 0
                await asyncio.sleep(0)
            if key not in calls:  # answered or gone (a cancel usually comes first)
                return
            caller._check_open()
            adapter.send_request_part(key, caller._checked_payload(op, encode_value(part)))
            sent += 1
        if key in calls:
            adapter.send_request_end(key)
    except Exception as exc:  # to the reader, as the stream's end
        call.feeder = None  # not cancelled by the forgetting below: it ends here anyway
        if key in calls:  # else answered or gone: its reader has its end already
            queue.put(exc)
            caller._forget(key)
    finally:
        call.feeder = None
