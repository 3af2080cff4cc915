"""A message begun must keep coming: the least rate at which the peer sends the rest.

The silence limits (Gotalk's read timeout, Chatter's Ping) count from the latest byte, so a
peer that begins a message and then sends a byte now and then holds the connection, and
up to ``max_size`` bytes of it, for as long as it likes. While the peer's input ends in an
unfinished message, it must send at least ``Options.min_receive_rate`` bytes a second
(default 1,024), on average since that began, once ``Options.receive_grace`` seconds
(default 10 s) have passed, as HTTP servers bound the rate of a request's body. Past that
the connection is closed with the protocol's answer (the adapter's ``last_word``: Gotalk
sends ``f00000003``, as for its read timeout; Chatter has none) and a warning on the
violations log.

Only the peer's time counts: while we hold its input (reading paused, whatever the
reason), its bytes wait unread, and the count starts again, with a new grace, once
reading resumes. Per read this costs a look at the codec's buffered bytes; the deadline
(slot ``"message"`` of the peer's deadlines, coarse) is set once when input begins to end
unfinished and moved on only when it comes due, so input that keeps ending mid-message
(large messages, reads cut anywhere) arms no timer per read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rpc.logs import violations


class MessageStall:
    """One connection's check on unfinished input (see the module doc)."""

    __slots__ = ("_begun", "_last_word", "_peer", "_received", "grace", "rate")

    def __init__(self, peer: Any, last_word: Callable[[], bytes] | None = None) -> None:
        self._peer = peer
        self.rate = peer.options.min_receive_rate
        """Bytes a second (None: no check)."""
        self.grace = peer.options.receive_grace
        self._last_word = last_word
        """The bytes sent before closing, if the protocol has any."""
        self._begun: float | None = None
        """Loop time the input began to end unfinished (None while it ends whole)."""
        self._received = 0
        """Bytes read since then."""

    def read(self, at: float, size: int, buffered: int) -> None:
        """A read of ``size`` bytes at loop time ``at`` left ``buffered`` bytes of a message
        unfinished (0: none)."""
        if not buffered:
            if self._begun is not None:
                self._begun = None
                self._peer.deadlines.clear("message")
        elif self._begun is not None:
            self._received += size
        elif self.rate:
            self._begin(at, buffered)

    def _begin(self, at: float, received: int) -> None:
        self._begun = at
        self._received = received
        self._peer.deadlines.set("message", at + self.grace, self._due, coarse=True)

    def _due(self) -> None:
        begun = self._begun
        peer = self._peer
        if begun is None or not self.rate or not peer.is_open:
            return
        deadlines = peer.deadlines
        now = deadlines.now()
        if not peer.reading or peer.resumed_at > begun:  # we held its input meanwhile
            self._begin(now, 0)
            return
        due = begun + max(self.grace, self._received / self.rate)
        if due > now:  # it kept up
            deadlines.set("message", due, self._due, coarse=True)
            return
        violations.warning(
            "%s peer %s: %d bytes in %.1f s with a message unfinished, under %s bytes a "
            "second (min_receive_rate); closing",
            peer.protocol_name,
            peer.remote_address,
            self._received,
            now - begun,
            self.rate,
        )
        if self._last_word is not None:
            peer.outbox.push(self._last_word())
        peer.abort()
