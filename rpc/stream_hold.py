"""Backpressure for streams: a stream whose reader falls behind holds the connection's input.

A stream's items wait in its :class:`~rpc.streaming.StreamQueue` until its reader takes
them: the results of a stream of ours, or the parts of a stream request to one of our
handlers. Neither Gotalk nor Chatter has flow control per stream, so when an item comes for
a queue that already holds ``max_stream_queue`` (default 256) unread items, or ``max_size``
bytes of them (16 MiB: large items must not make a stream hold 256 times that), the
connection stops reading: that item and the rest of its read wait in the peer's backlog,
the peer's further output waits in TCP, and its sender slows down. Reading resumes once the
reader has taken the queue down to half. A reader that goes its queue's ``stall`` seconds without
taking an item while it holds (a stream of ours: its ``item_timeout``; a stream request:
the connection's request timeout) fails its stream alone, and reading resumes; a slow
reader that keeps taking never does.

The parts of stream requests also hold bytes of ``max_request_bytes``: past it, a part waits
for room (:class:`NoRoom`) and the peer reads on, up to its backlog's bound, where reading
pauses. A handler that never reads its parts would then hold the connection's input for
good, and with it what the peer sent to end that (its cancellation). :class:`RoomStall`
gives those readers the same stall limit: while reading is paused with ``max_request_bytes``
taken, a stream whose reader took no part for its ``stall`` seconds fails, and its parts are
dropped, their bytes given back.

While one stream holds, nothing else from that peer is read: results of other calls wait
behind it (the price of one byte stream without windows per stream). One read of a fast
sender can hold many items; without the hold a reader that keeps up, but had no turn of the
loop in between (uvloop reads a full socket again before it runs other callbacks), saw its
stream fail.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any, NoReturn

from rpc.deadlines import Deadlines
from rpc.streaming import StreamQueue

SLOT = "stream-hold"
"""The :class:`~rpc.deadlines.Deadlines` slot of the hold's stall limit."""
ROOM_SLOT = "room-stall"
"""The slot of :class:`RoomStall`'s check."""


class InputHeld(Exception):
    """Raised by a handler of one message, before it acts on it, when the message must wait:
    the peer keeps it and the rest of its read in its backlog, reading paused, until the
    cause ends and something gives the peer a turn. Raised only then, so that the loop
    over a read's messages checks nothing for it."""


class NoRoom(InputHeld):
    """Raised for a stream request's part while ``max_request_bytes`` is taken: unlike a
    refusal, which pauses reading until the message runs, the peer reads on (replies run,
    the rest is kept in order: the handlers holding the bytes may wait for replies), and
    the part runs once handlers take or finish enough (:mod:`rpc.request_bytes`)."""


class StreamHold:
    """The one stream whose full queue holds a connection's input (nothing else is handled
    while it holds, so there is never a second). Owned by the peer; ``resume`` gives the
    peer a turn at its backlog."""

    __slots__ = ("_deadlines", "_fail", "_queue", "_resume")

    def __init__(self, deadlines: Deadlines, resume: Callable[[], None]) -> None:
        self._deadlines = deadlines
        self._resume = resume
        self._queue: StreamQueue | None = None
        self._fail: Callable[[], None] | None = None

    @property
    def active(self) -> bool:
        return self._queue is not None

    def hold(self, queue: StreamQueue, fail: Callable[[], None]) -> NoReturn:
        """Hold input until ``queue``'s reader has taken it down to half, or ``fail()`` its
        stream once it went ``queue.stall`` seconds without taking an item. Raises
        :class:`InputHeld`, for the message that found the queue full."""
        if self._queue is None:
            self._queue, self._fail = queue, fail
            queue.when_room(len(queue) // 2, self._room)
            self._deadlines.set(SLOT, queue.taken_at + queue.stall, self._stalled)
        raise InputHeld

    def drop(self, queue: StreamQueue) -> None:
        """``queue``'s reader is gone (the stream given up on, the handler ended): it will
        make no room, so a hold for it ends now."""
        if queue is self._queue:
            queue.when_room(0, None)
            self._room()

    def clear(self) -> None:
        """The connection is gone: forget the hold (its deadline went with the others)."""
        if self._queue is not None:
            self._queue.when_room(0, None)
        self._queue = self._fail = None

    def _room(self) -> None:
        self._deadlines.clear(SLOT)
        self._queue = self._fail = None
        self._resume()

    def _stalled(self) -> None:
        queue = self._queue
        if queue is None:
            return
        due = queue.taken_at + queue.stall
        if due > self._deadlines.now():  # it took one since: a slow reader, not a stalled one
            self._deadlines.set(SLOT, due, self._stalled)
            return
        fail = self._fail
        self.clear()
        if fail is not None:
            fail()
        self._resume()


class RoomStall:
    """While reading is paused with ``max_request_bytes`` taken (``stuck()``), a stream
    handler that took none of its queued parts for its queue's ``stall`` seconds fails
    (``fail(key)``: its stream ends with an error, its parts are dropped and their bytes go
    back). One check per stall limit while it lasts, no timer otherwise: of the queues
    holding bytes when it began (or at the check before) that took none since, the one whose
    handler took a part longest ago (or never) fails first, then the next only while still
    stuck (a handler that read and now waits for a reply the pause holds takes none either,
    and reading may resume without failing it); those that began holding later are judged
    at the next check (within twice the limit). Armed by the peer wherever it leaves
    reading paused with the bytes taken."""

    __slots__ = ("_deadlines", "_fail", "_seen", "_streams", "_stuck")

    def __init__(
        self,
        deadlines: Deadlines,
        streams: Mapping[Any, StreamQueue],
        stuck: Callable[[], bool],
        fail: Callable[[Any], None],
    ) -> None:
        self._deadlines = deadlines
        self._streams = streams
        self._stuck = stuck
        self._fail = fail
        self._seen: dict[Hashable, tuple[StreamQueue, int]] | None = None
        """Each queue holding bytes at the last look, and its last take's stamp then
        (:attr:`~rpc.streaming.StreamQueue.taken`; None: not armed)."""

    def arm(self) -> None:
        """Reading paused with the bytes taken: look again one stall limit from now."""
        if self._seen is None:
            self._look()

    def disarm(self) -> None:
        """Reading resumed."""
        if self._seen is not None:
            self._seen = None
            self._deadlines.clear(ROOM_SLOT)

    def _look(self) -> None:
        seen = {key: (q, q.taken) for key, q in self._streams.items() if q.bytes}
        if not seen:
            self._seen = None
            return
        self._seen = seen
        stall = min(queue.stall for queue, _ in seen.values())
        self._deadlines.set(ROOM_SLOT, self._deadlines.now() + stall, self._check)

    def _check(self) -> None:
        seen, self._seen = self._seen, None
        if seen is None:
            return
        streams = self._streams
        stalled = [
            (taken, -queue.bytes, index, key)
            for index, (key, (queue, taken)) in enumerate(seen.items())
            if streams.get(key) is queue and queue.bytes and queue.taken == taken
        ]
        stalled.sort()  # (the longest since a take first: never; then the largest holder)
        for *_, key in stalled:
            if not self._stuck():
                break
            self._fail(key)
        if self._stuck():
            self._look()
