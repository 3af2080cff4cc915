"""Replies that wait for a Chatter conversation's token.

Chatter lets only the token holder send in a conversation. While a caller streams request
parts it keeps the token, so results a stream handler produces meanwhile cannot go out
yet; they wait here, in order, until the caller's End hands the token over.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

WAITING_STREAMS = 256
"""Streams whose replies may wait at once; past it the oldest stream's replies are dropped."""

Send = Callable[..., None]


class TokenWaits:
    """Per connection: the replies of each stream that wait for its token. At most
    ``per_stream`` replies a stream (past it they become one error, sent instead) and
    ``WAITING_STREAMS`` streams; freed when the token comes back, the conversation ends
    without it, or the connection goes."""

    __slots__ = ("_error", "_per_stream", "_waiting")

    def __init__(self, per_stream: int, error: Send) -> None:
        self._per_stream = per_stream
        self._error = error
        self._waiting: OrderedDict[Hashable, list[tuple[Send, tuple[Any, ...]]]] = OrderedDict()

    def hold(self, key: Hashable, send: Send, args: tuple[Any, ...]) -> None:
        """Keep ``send(*args)`` for when ``key``'s token comes back."""
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = []
            if len(self._waiting) > WAITING_STREAMS:
                self._waiting.popitem(last=False)
        if len(waiting) < self._per_stream:
            waiting.append((send, args))
        elif waiting[-1][0] != self._error:
            message = f"more than {self._per_stream} results before the stream's end"
            waiting[:] = [(self._error, (key, message))]

    def release(self, key: Hashable) -> None:
        """``key``'s token is back: send what waited for it, in order."""
        waiting = self._waiting.pop(key, None)
        if waiting is not None:
            for send, args in waiting:
                send(*args)

    def drop(self, key: Hashable) -> None:
        """``key``'s conversation ended without handing the token over: what waited for it
        can never be sent."""
        self._waiting.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._waiting

    def clear(self) -> None:
        self._waiting.clear()
