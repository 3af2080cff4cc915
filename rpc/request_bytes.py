"""The bytes a connection holds for the peer's requests, and their limit.

What the peer sends us for handlers to read is held until they have read it: the payload of
a request whose coroutine handler has not finished (counted from its admission to the end
of its job, :mod:`rpc.handler_runner`), and the parts queued for stream handlers (from
arrival until taken, :class:`~rpc.streaming.StreamQueue`). Counted in items alone
(``max_concurrent`` requests, ``max_stream_queue`` parts a stream), a peer sending large
payloads could make one connection hold ``max_concurrent`` x ``max_size`` bytes (16 GiB at
the defaults); :class:`RequestBytes` counts them against ``Options.max_request_bytes``.

Past the limit the peer treats new requests as past ``max_concurrent`` (a retry result to a
peer that takes them, else they are kept) and keeps stream parts (NoRoom) until a handler
takes or finishes enough to go below it; meanwhile it reads on, up to its backlog's bound,
and replies to our calls run (the handlers holding the bytes may wait for them). The first
payload is always taken, so a connection holds at most the limit plus one payload
(``max_size``).
Plain function handlers are not counted: they return before the next message is read;
nor are single payloads of at most :data:`UNCOUNTED` bytes: ``max_concurrent`` (1,024) of
them hold at most 4 MiB, and counting them would cost every small request.

The messages the peer keeps unrun while its output waits (:mod:`rpc.backlog`) share the
limit: their bytes are ``reserved`` here, so that the backlog is full once ``used`` and
``reserved`` together reach it, and ``reserved`` a quarter of it (``OWN_SHARE`` there: the
replies the handlers wait for are still read while ``used`` takes it all). ``reserved``
does not count against new requests (``full``): a kept request runs after it leaves the
backlog, and it would otherwise wait for room that only its neighbours in the backlog take,
with no handler running to free any.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rpc.chatter_payloads import Sbs

UNCOUNTED = 4096
"""A single request's payload of at most this many bytes is not counted (see above)."""


class RequestBytes:
    """One connection's count (see the module doc). ``on_room`` runs when a release brings
    ``used``, or ``used`` and ``reserved`` together, back under ``limit`` (the peer then
    handles the input it held, or reads on into its backlog)."""

    __slots__ = ("_on_room", "limit", "reserved", "used")

    def __init__(self, limit: int, on_room: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.used = 0
        self.reserved = 0
        """The bytes of the messages kept in the peer's backlog (changed by it alone)."""
        self._on_room = on_room

    @property
    def full(self) -> bool:
        return self.used >= self.limit

    def take(self, size: int) -> None:
        self.used += size

    def release(self, size: int) -> None:
        used = self.used = self.used - size
        limit = self.limit
        if used < limit and self._on_room is not None:
            total = used + self.reserved
            if limit <= used + size or total < limit <= total + size:
                self._on_room()


def counted_size(payload: Any) -> int:
    """Bytes of a single request's payload as counted: those of ``bytes``, or of a Chatter
    payload of a schema type (its data); 0 for others (an undecodable payload's marker)
    and for at most :data:`UNCOUNTED` bytes."""
    if payload.__class__ is bytes:
        size = len(payload)
    elif payload.__class__ is Sbs:
        size = len(payload.data)
    else:
        return 0
    return size if size > UNCOUNTED else 0


def text_size(text: str) -> int:
    """Bytes a name counts: its length when ASCII, else 4 bytes a character. That is at
    least both its UTF-8 length (as received) and the memory it takes: CPython stores every
    character of a string at the width of its widest one, so one four-byte character among
    16,000 ASCII ones makes 64 kB of 16 kB received."""
    return len(text) if text.isascii() else 4 * len(text)
