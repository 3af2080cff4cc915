"""Replies that wait for a Chatter conversation's token.

Chatter lets only the token holder send in a conversation. While a caller streams request
parts it keeps the token, so results a stream handler produces meanwhile cannot go out
yet; they wait here, in order, until the caller's End hands the token over. The codec
knows the token is back once it has decoded the End, which may be before the End runs
(kept behind parts that wait); results meanwhile wait behind those already waiting, so
that none overtakes them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

WAITING_STREAMS = 256
"""Streams whose replies may wait at once; past it the oldest stream's replies are dropped,
its error kept in their place (it fails: its caller is told, not left with a gap)."""
FAILED_STREAMS = 4096
"""Streams whose replies were dropped, each waiting with its error alone (a reply's worth
of memory); past it the oldest is forgotten, its error unsent."""
LENIENT_STREAMS = 4096
"""Incoming streams a ``strict=False`` connection remembers as still sending parts."""

Send = Callable[..., None]


class TokenWaits:
    """Per connection: the replies of each stream that wait for its token. At most
    ``per_stream`` replies a stream and ``max_bytes`` bytes of payload over all streams
    (past either, a stream's replies become one error, sent instead), and
    ``WAITING_STREAMS`` streams; freed when the token comes back, the conversation ends
    without it, or the connection goes. The requester decides how long they wait. Bytes
    are those of ``bytes`` payloads: a stream's final ``rpc.Reply`` (one per stream) counts
    as none. Past ``WAITING_STREAMS`` the oldest stream's replies are dropped unsent and
    become one error, as past ``per_stream``: the stream fails when its token comes back
    (before, its later replies went out as if none had been dropped). Such failed
    streams, their error alone waiting, are at most ``FAILED_STREAMS``."""

    __slots__ = (
        "_bytes",
        "_error",
        "_failed",
        "_live",
        "_max_bytes",
        "_open_streams",
        "_per_stream",
        "waiting",
    )

    def __init__(self, per_stream: int, max_bytes: int, error: Send) -> None:
        self._per_stream = per_stream
        self._max_bytes = max_bytes
        self._error = error
        self._bytes = 0
        self.waiting: OrderedDict[Hashable, list[tuple[Send, tuple[Any, ...]]]] = OrderedDict()
        """The replies waiting, by stream (read, never changed, by the replies' hot path:
        while a stream's replies wait, later ones wait behind them)."""
        self._live: OrderedDict[Hashable, None] = OrderedDict()
        """The streams of ``waiting`` whose replies wait (oldest first)."""
        self._failed: OrderedDict[Hashable, None] = OrderedDict()
        """The streams of ``waiting`` that failed: their error alone waits (oldest first)."""
        self._open_streams: OrderedDict[Hashable, None] = OrderedDict()
        """``strict=False`` connections only (no token tracked): incoming streams whose
        requester has not sent its End nor ended the conversation (the oldest forgotten
        past :data:`LENIENT_STREAMS`)."""

    def stream_opened(self, key: Hashable) -> None:
        """A lenient connection's incoming stream ``key`` began: replies wait for its End."""
        self._open_streams[key] = None
        if len(self._open_streams) > LENIENT_STREAMS:
            self._open_streams.popitem(last=False)

    def stream_ended(self, key: Hashable) -> None:
        """Its requester sent the End (:meth:`release` then sends what waited)."""
        self._open_streams.pop(key, None)

    def keeps(self, key: Hashable) -> bool:
        """A lenient connection's reply in ``key`` must wait: the stream still takes parts,
        or replies already wait (they go first)."""
        return key in self._open_streams or key in self.waiting

    def hold(self, key: Hashable, send: Send, args: tuple[Any, ...]) -> None:
        """Keep ``send(*args)`` for when ``key``'s token comes back."""
        if key in self._failed:
            return  # the stream has failed: nothing more of it is kept
        waiting = self.waiting.get(key)
        if waiting is None:
            waiting = self.waiting[key] = []
            live = self._live
            live[key] = None
            if len(live) > WAITING_STREAMS:
                message = f"more than {WAITING_STREAMS} streams' results waiting for their ends"
                self._fail(next(iter(live)), message)
        size = _size([(send, args)])
        if len(waiting) < self._per_stream and self._bytes + size <= self._max_bytes:
            waiting.append((send, args))
            self._bytes += size
            return
        if len(waiting) >= self._per_stream:
            message = f"more than {self._per_stream} results before the stream's end"
        else:
            message = f"more than {self._max_bytes} bytes of results waiting for streams' ends"
        self._fail(key, message)

    def _fail(self, key: Hashable, message: str) -> None:
        """Drop ``key``'s waiting replies: its error alone waits in their place."""
        self._live.pop(key, None)
        waiting = self.waiting[key]
        self._bytes -= _size(waiting)
        waiting[:] = [(self._error, (key, message))]
        failed = self._failed
        failed[key] = None
        if len(failed) > FAILED_STREAMS:
            del self.waiting[failed.popitem(last=False)[0]]

    def release(self, key: Hashable) -> None:
        """``key``'s token is back: send what waited for it, in order."""
        waiting = self.waiting.pop(key, None)
        if waiting is not None:
            self._forget(key, waiting)
            for send, args in waiting:
                send(*args)

    def _forget(self, key: Hashable, waiting: list[tuple[Send, tuple[Any, ...]]]) -> None:
        """``key``'s replies, just taken out of ``waiting``, no longer wait."""
        self._bytes -= _size(waiting)
        self._live.pop(key, None)
        self._failed.pop(key, None)

    def drop(self, key: Hashable) -> None:
        """``key``'s conversation ended without handing the token over: what waited for it
        can never be sent."""
        self._open_streams.pop(key, None)
        waiting = self.waiting.pop(key, None)
        if waiting is not None:
            self._forget(key, waiting)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.waiting

    def clear(self) -> None:
        self.waiting.clear()
        self._live.clear()
        self._failed.clear()
        self._open_streams.clear()
        self._bytes = 0

    @property
    def held_bytes(self) -> int:
        """Bytes of payload waiting, over all streams."""
        return self._bytes


def _size(replies: list[tuple[Send, tuple[Any, ...]]]) -> int:
    """Bytes of the payloads (bytes arguments) of ``replies``."""
    return sum(len(a) for _, args in replies for a in args if isinstance(a, bytes | bytearray))
