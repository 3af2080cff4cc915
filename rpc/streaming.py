"""What streams are made of: the queue a stream's items wait in until their one reader
takes them, the waits that bound a stream of ours, and the parts of a stream request of
ours. :class:`~rpc.calls.Caller` and :class:`~rpc.responder.Responder` build on these.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import warnings
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
)
from typing import TYPE_CHECKING, Any, TypeVar, cast

from rpc.errors import RequestTimeout

if TYPE_CHECKING:
    from rpc.request_bytes import RequestBytes

T = TypeVar("T")

PARTS_PER_TURN = 256
"""Parts of a stream sent in one go at most, a streamed result's (:mod:`rpc.handler_results`) or
a stream request's (:mod:`rpc.stream_request`): then the loop gets a turn (the connection's
other work, the caller's cancel), even from a source that never waits."""

END = object()
"""Ends the queue of a stream's results (ours) or of a stream request's parts (served)."""


_TAKES = itertools.count(1)
"""Stamps of :attr:`StreamQueue.taken`."""


class StreamQueue:
    """One stream's items in arrival order until its one reader takes them: the results
    of a stream of ours (read by :meth:`~rpc.calls.Caller.stream`), or the parts of a stream
    request to us (read by its handler). A deque and at most one waiting reader, lighter than
    an ``asyncio.Queue``, which every item passed through twice. Unbounded here: past
    ``options.max_stream_queue`` unread items the writers hold the connection's input until
    the reader makes room (:mod:`rpc.stream_hold`). ``stall``: the seconds its reader may
    go without taking an item while it holds (a stream of ours: its ``item_timeout``; a
    stream request's parts: the connection's request timeout). One reader: a
    second waiting at the same time would replace the first's waiter (each stream has one
    generator reading it, and a generator cannot be run by two tasks at once)."""

    __slots__ = (
        "_held",
        "_items",
        "_loop",
        "_on_room",
        "_room_at",
        "_waiter",
        "bytes",
        "stall",
        "taken",
        "taken_at",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, stall: float, held: RequestBytes | None = None
    ) -> None:
        self._loop = loop
        self._held = held
        """A stream request's parts: the connection's count of bytes held for requests,
        which its ``bytes`` are part of until :meth:`release_held`."""
        self._items: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[bool] | None = None
        self._on_room: Callable[[], None] | None = None
        self._room_at = 0
        self.stall = stall
        self.taken = 0
        """When the reader last took an item, as a stamp that grows with every take in the
        process (0: never), so that readers compare by how long ago they took one
        (:mod:`rpc.stream_hold`)."""
        self.taken_at = 0.0
        """Loop time of the reader's last take while a room callback is set."""
        self.bytes = 0
        """Bytes of the ``bytes`` items waiting (payloads as received; others count 0)."""

    def __len__(self) -> int:
        return len(self._items)

    def ended(self) -> bool:
        """Its end (:data:`END`) is queued: nothing more comes."""
        return bool(self._items) and self._items[-1] is END

    def put(self, item: Any) -> None:
        if item.__class__ is bytes:
            self.bytes += len(item)
            if self._held is not None:
                self._held.take(len(item))
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def take(self) -> Any:
        """The oldest item; IndexError when there is none."""
        item = self._items.popleft()
        self.taken = next(_TAKES)
        if item.__class__ is bytes:
            self.bytes -= len(item)
            if self._held is not None:
                self._held.release(len(item))
        if self._on_room is not None:  # a hold waits for room: the reader is alive
            self.taken_at = self._loop.time()
            if len(self._items) <= self._room_at:
                on_room, self._on_room = self._on_room, None
                on_room()
        return item

    def drop(self) -> None:
        """Forget the items waiting (a stalled reader's: its stream failed), and the bytes
        they held for the connection's requests."""
        self._items.clear()
        held, size = self._held, self.bytes
        self.bytes = 0
        if held is not None and size:
            held.release(size)

    def release_held(self) -> None:
        """Its reader is done (the handler's job ended, or it never had one): the items
        left no longer count as held for the connection's requests."""
        held, self._held = self._held, None
        if held is not None and self.bytes:
            held.release(self.bytes)

    def when_room(self, at: int, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` once, from the reader's :meth:`take`, when at most ``at``
        items are left (None: forget the callback set before); until then each take's
        time is kept in :attr:`taken_at` (from now)."""
        self._on_room = callback
        self._room_at = at
        self.taken_at = self._loop.time()

    def wake(self) -> None:
        """Wake a waiting reader without an item (its :meth:`wait` returns True with none
        queued): what it waits for has changed (:attr:`ResultWait.feeding`)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: for as long as it takes) for an item; one
        timer, no task. False when none came; True with none queued after :meth:`wake`.
        One reader at a time."""
        if self._items:
            return True
        loop = self._loop
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _time_up, waiter)
        try:
            return await waiter or bool(self._items)
        finally:
            if timer is not None:
                timer.cancel()
            self._waiter = None


def _time_up(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class ResultWait:
    """How long a stream of ours waits: ``item`` seconds for each next result, and never
    past ``timeout`` seconds from its start (None: no deadline for the whole stream).
    While its request's parts are still being sent (:attr:`feeding`), the wait for a
    result has the deadline alone: the sending is bounded on its own (``item`` seconds for
    the peer to take our output, the deadline for the source), as it was when the caller
    read no result before the last part had gone; ``item`` counts again from the end."""

    __slots__ = ("deadline", "feeding", "item", "loop", "op", "timeout")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, op: str, timeout: float | None, item: float
    ) -> None:
        self.loop = loop
        self.op = op
        self.timeout = timeout
        self.item = item
        self.deadline = None if timeout is None else loop.time() + timeout
        self.feeding = 0
        """Feeders (:mod:`rpc.stream_request`) sending this stream's parts: each one
        :meth:`StreamQueue.wake` s the reader when it ends."""

    def _left(self, deadline: float) -> float:
        """Seconds left before ``deadline``; raises RequestTimeout once it passed."""
        left = deadline - self.loop.time()
        if left <= 0:
            raise self._overdue()
        return left

    def check(self) -> None:
        """Raise RequestTimeout once the whole stream's deadline has passed (checked before
        a request is sent: an overdue stream sends nothing)."""
        if self.deadline is not None:
            self._left(self.deadline)

    def _overdue(self) -> RequestTimeout:
        return RequestTimeout(f"{self.op}: stream not done within {self.timeout} s")

    async def bounded(self, awaitable: Awaitable[T], *, each: bool = False) -> T:
        """``await awaitable``, within the stream's deadline (in the caller's task: a
        timer, no task of its own); ``each``: within ``item`` seconds too (a wait for the
        peer to take our output, which a peer that stopped reading would otherwise hold
        for good on a stream without a deadline). Call :meth:`check` first where the
        awaitable is a coroutine: past the deadline this raises without awaiting it. A
        TimeoutError of the awaitable's own goes through as it is."""
        deadline = self.deadline
        if deadline is None and not each:
            return await awaitable
        left = None if deadline is None else self._left(deadline)
        item_first = each and (left is None or self.item < left)
        timeout = asyncio.timeout(self.item if item_first else left)
        try:
            async with timeout:
                return await awaitable
        except TimeoutError:
            if not timeout.expired():
                raise
            if item_first:
                raise RequestTimeout(
                    f"{self.op}: the peer took none of our output within {self.item} s"
                ) from None
            raise self._overdue() from None

    async def next(self, queue: StreamQueue) -> Any:
        """The next item of ``queue``, within ``item`` seconds (once no part is being sent)
        and the deadline. An item already queued (results that came in one read) is taken
        without a timer, the deadline checked all the same unless the stream's end came
        (a reader slower than its peer may never find its queue empty: such a stream
        outlived its deadline; one that ended in time is read out, as a request's result
        is taken whenever it is awaited)."""
        if len(queue):
            deadline = self.deadline  # _left written out: once per queued result
            if deadline is not None and self.loop.time() >= deadline and not queue.ended():
                raise self._overdue()
            return queue.take()
        while True:
            by_item = not self.feeding
            wait = self.item if by_item else None
            if self.deadline is not None:
                left = self._left(self.deadline)
                if wait is None or left < wait:
                    wait, by_item = left, False
            if await queue.wait(wait):
                if len(queue):
                    return queue.take()
                continue  # woken: the parts have all gone, and ``item`` counts from now
            if not by_item:  # the deadline came first
                raise self._overdue()
            raise RequestTimeout(f"{self.op}: no result within {self.item} s")


def legacy_stream_args(legacy: tuple[Any, ...], parts: Any, value: Any) -> tuple[Any, Any]:
    """``stream(op, parts, value)``, the positional form before keyword-only arguments."""
    if len(legacy) > 2 or (parts is not None) or (len(legacy) == 2 and value is not None):
        raise TypeError("stream() takes parts and value as keywords (parts=, value=)")
    warnings.warn(
        "stream(op, parts, value) is deprecated: pass parts= and value= as keywords",
        DeprecationWarning,
        stacklevel=3,
    )
    return legacy[0], legacy[1] if len(legacy) == 2 else value


_NOT_PARTS = (str, bytes, bytearray, memoryview)
"""What ``parts`` may not be: iterable, but one part per character or byte."""


class PartSource:
    """The parts of a stream request of ours: an iterable's are taken as they are, an
    async iterable's each awaited within the stream's deadline. (No async generator around
    an iterable: the loop tracks every one made, and each part would pass through it.)"""

    __slots__ = ("_async", "_sync", "_wait", "awaits")

    def __init__(self, parts: Iterable[Any] | AsyncIterable[Any], wait: ResultWait) -> None:
        """TypeError for a ``str`` or bytes-like ``parts``: one part per character or
        byte is never what the caller meant (``[data]`` is one part)."""
        if isinstance(parts, _NOT_PARTS):
            kind = type(parts).__name__
            raise TypeError(f"parts: an iterable of parts, not a {kind} (one part: [{kind}])")
        self._wait = wait
        if isinstance(parts, AsyncIterable):
            self._async: AsyncIterator[Any] | None = aiter(parts)
            self._sync: Iterator[Any] | None = None
        else:
            self._async, self._sync = None, iter(parts)
        self.awaits = self._async is not None
        """True when taking a part may wait (an async iterable's)."""

    def take(self) -> Any:
        """A plain iterable's next part (no coroutine made), or ``END`` after the last;
        RequestTimeout once the stream's deadline has passed."""
        wait = self._wait
        if wait.deadline is not None:
            wait.check()
        return next(cast(Iterator[Any], self._sync), END)

    async def next(self) -> Any:
        """The next part, or ``END`` after the last; RequestTimeout once the stream's
        deadline has passed (checked before each part is taken, from either kind)."""
        if self._sync is not None:
            return self.take()
        wait = self._wait
        if wait.deadline is not None:
            wait.check()
        return await wait.bounded(anext(cast(AsyncIterator[Any], self._async), END))
