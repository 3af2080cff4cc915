"""One connection's output: coalesced writes and the high/low-water state of the transport.

Bytes pushed here go out with the next :meth:`Outbox.flush`: the peer flushes once at the
end of every ``data_received`` and, for output produced later (async handlers, requests),
once per loop iteration. A flush is forced earlier when ``FLUSH_EVERY`` pieces or
``FLUSH_BYTES`` bytes are queued, so a burst of replies reaches the wire while the rest are
being encoded, and a large result never sits in two buffers at once. A request with no
other call in flight (a stream's too, and a stream request's parts from a plain iterable
with its end), and the last word of a handler's job when it is the only one (a
coroutine's single reply, a streamed result's end), are written at once (see
:meth:`Outbox.hold`): nothing would join them but the wait.

Writability follows the transport: ``pause_writing`` (its buffer passed the high-water mark)
marks the outbox blocked until ``resume_writing`` (drained below the low-water mark). While
blocked the peer handles no input but replies to its calls (see :mod:`rpc.input_flow`);
:meth:`wait_writable` lets senders wait, and wakes them one at a time, in order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

FLUSH_EVERY = 16
"""Pieces queued before a flush is forced (measured +20-30% with 100 requests in flight)."""
FLUSH_BYTES = 64 * 1024
"""Bytes queued before a flush is forced."""


class WriteTransport(Protocol):
    """What the outbox writes to: asyncio's and uvloop's stream transports, WebSocket's."""

    def write(self, data: bytes) -> None: ...
    def writelines(self, list_of_data: Iterable[bytes]) -> None: ...
    def is_closing(self) -> bool: ...
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...
    def get_write_buffer_size(self) -> int: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...


class Outbox:
    """Coalesces a connection's writes; tracks whether its transport accepts more.

    ``framed`` transports (WebSocket) take every pushed piece as one message of their own
    (``writelines``); byte streams get the pieces joined into one ``write``.
    """

    __slots__ = (
        "_count",
        "_dead",
        "_framed",
        "_handle",
        "_held",
        "_loop",
        "_lost",
        "_pieces",
        "_size",
        "_transport",
        "_waiters",
        "_waking",
        "blocked",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: WriteTransport | None = None
        self._framed = False
        self._pieces: list[bytes] = []
        self._count = 0
        self._size = 0
        self._handle: asyncio.Handle | None = None
        self._held = False
        self._waiters: deque[asyncio.Future[None]] = deque()
        """Senders waiting for the transport to take more, in the order they came."""
        self._waking: asyncio.Handle | None = None
        self._dead = 0
        """Waiters in ``_waiters`` whose senders gave up (cancelled, timed out): past half
        of them the deque is compacted, so abandoned waits cost no memory for long."""
        self._lost: BaseException | None = None
        self.blocked = False
        """True while the transport's buffer is above its high-water mark."""

    def attach(self, transport: WriteTransport, *, high_water: int, low_water: int) -> None:
        """Start writing to ``transport`` with the given water marks (bytes)."""
        self._transport = transport
        self._framed = bool(transport.get_extra_info("message_framed", False))
        transport.set_write_buffer_limits(high=high_water, low=low_water)

    @property
    def framed(self) -> bool:
        """True when every pushed piece travels as one transport message (WebSocket)."""
        return self._framed

    def push(self, data: bytes) -> None:
        """Queue one message's ``data``; it goes out with the next flush, which is forced
        now past the limits, else scheduled once this iteration (or left to the holder)."""
        self._pieces.append(data)
        self._size += len(data)
        self._count += 1
        if self._count >= FLUSH_EVERY or self._size >= FLUSH_BYTES:
            self.flush()
        elif self._handle is None and not self._held:
            self._handle = self._loop.call_soon(self.flush)

    def push_message(self, pieces: list[bytes]) -> None:
        """Queue one message given as pieces (a frame header and its parts): a byte stream
        takes them as they are (joined once, at the flush); a framed transport gets them
        joined into one message."""
        if self._framed:
            self.push(b"".join(pieces))
            return
        if len(pieces) > 1:  # all but the last queued here, counted with it by push
            head = pieces[:-1]
            self._pieces += head
            self._size += sum(map(len, head))
        self.push(pieces[-1])

    def hold(self) -> bool:
        """The caller flushes before it returns to the loop: until :meth:`release`, pushes
        schedule no flush of their own. True when this call took the hold; False when it
        was held already, and then the outer holder releases it (the caller must not).

        Held by the peer around each read (a loop callback made and cancelled per read,
        for nothing, otherwise), by a request or a stream's request with no other call in
        flight, and for a stream request with a plain iterable's parts until its end is
        queued or it must wait for the transport to drain (:class:`rpc.calls.Caller`),
        and by the last word of a handler's job that is the only one, a coroutine's single
        reply or a streamed result's end (:class:`rpc.handler_results.HandlerResults`): nothing is
        coming to join those, and the other side waits for them, so they are written at
        once instead of by a flush one loop iteration later, which every round trip of a
        caller making one call at a time would pay.
        """
        if self._held:
            return False
        self._held = True
        return True

    def release(self, *, flush: bool = True) -> None:
        """End :meth:`hold` and write what is queued; ``flush=False`` when the caller is
        closing the connection, whose abort writes or drops it at once."""
        self._held = False
        if flush:
            self.flush()

    @property
    def held(self) -> bool:
        """True between a :meth:`hold` that took the hold and its :meth:`release`."""
        return self._held

    @property
    def queued(self) -> int:
        """Bytes pushed and not yet handed to the transport."""
        return self._size

    def flush(self) -> None:
        """Write everything queued, in one call to the transport."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        pieces = self._pieces
        if not pieces:
            return
        self._pieces = []
        self._count = self._size = 0
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._framed:
            transport.writelines(pieces)
        else:
            transport.write(pieces[0] if len(pieces) == 1 else b"".join(pieces))

    @property
    def buffered(self) -> int:
        """Bytes queued here plus those the transport holds unsent."""
        held = self._transport.get_write_buffer_size() if self._transport is not None else 0
        return self._size + held

    # --- writability ----------------------------------------------------------------------

    def pause(self) -> None:
        self.blocked = True

    def resume(self) -> None:
        self.blocked = False
        if self._waking is None:
            self._wake_next()

    def _wake_next(self) -> None:
        """Wake the sender that has waited longest; once it has run (and written what it
        had), the next, while the transport still takes more. One sender a turn, in order:
        woken all at once at every resume, each of thousands of senders would find the
        buffer full again after the first few, and wait again (a resume's cost grew with
        the senders waiting)."""
        self._waking = None
        waiters = self._waiters
        while waiters and not self.blocked:
            waiter = waiters.popleft()
            if not waiter.done():  # else cancelled while it waited
                waiter.set_result(None)  # its task runs before the call below
                self._waking = self._loop.call_soon(self._wake_next)
                return

    async def wait_writable(self) -> None:
        """Return once the transport accepts more (waiting senders go in the order they
        came); raise the loss error if it is gone."""
        first = True
        while self.blocked:
            if self._lost is not None:
                raise self._lost
            waiter = self._loop.create_future()
            if first:
                self._waiters.append(waiter)
                first = False
            else:  # woken, and blocked again before it ran: it keeps its place
                self._waiters.appendleft(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                self._gave_up()
                raise
        if self._lost is not None:
            raise self._lost

    def _gave_up(self) -> None:
        self._dead += 1
        waiters = self._waiters
        if self._dead > len(waiters) // 2:
            self._waiters = deque(waiter for waiter in waiters if not waiter.done())
            self._dead = 0

    def lost(self, error: BaseException) -> None:
        """The connection is gone: drop queued bytes, wake every waiter with ``error``."""
        self._lost = error
        self._transport = None
        self._pieces = []
        self._count = self._size = 0
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._waking is not None:
            self._waking.cancel()
            self._waking = None
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
                waiter.exception()  # retrieved: waiters re-raise it themselves
