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
reading resumes; and a check that finds the peer behind looks again one beat later
(:data:`CONFIRM`), after the loop has read what waits (uvloop runs due timers before it
polls the sockets, so a loop kept busy by us would otherwise blame the peer). Bytes come
to the codec in whole TLS records (up to 16 KiB: :data:`TLS_RECORD`, credited over TLS).
The rate is an average since the message began, as HTTP servers count it: a peer that sent
much of it quickly may then go slowly for as long as that average allows.

Over WebSocket there is no such check: the codec sees a frame only once it is whole (a
Gotalk message's payload is a frame of its own), however fast its bytes come, and a peer
that trickles one frame cannot answer our keepalive pings meanwhile, which close it.

Per read this costs a look at the codec's buffered bytes; the deadline (slot ``"message"``
of the peer's deadlines, coarse) is set once when input begins to end unfinished and
moved on only when it comes due, so input that keeps ending mid-message (large messages,
reads cut anywhere) arms no timer per read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rpc.logs import violations

CONFIRM = 0.05
"""Seconds between a check that finds the peer behind and the one that closes it."""

TLS_RECORD = 16 * 1024
"""Bytes credited over TLS: what may wait in a record not yet whole."""


class MessageStall:
    """One connection's check on unfinished input (see the module doc)."""

    __slots__ = (
        "_begun",
        "_behind",
        "_credit",
        "_last_word",
        "_peer",
        "_received",
        "grace",
        "rate",
    )

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
        self._behind = False
        """The last check found the peer behind: the next one closes it, if it still is."""
        self._credit = 0

    def start(self) -> None:
        """The connection is made: no check over WebSocket, a record's credit over TLS."""
        peer = self._peer
        if peer.outbox.framed:
            self.rate = None
        elif peer.transport.get_extra_info("ssl_object") is not None:
            self._credit = TLS_RECORD

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
        self._behind = False
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
        due = begun + max(self.grace, (self._received + self._credit) / self.rate)
        if due > now:  # it kept up
            self._behind = False
            deadlines.set("message", due, self._due, coarse=True)
            return
        if not self._behind:  # once more, after the loop has read what waits
            self._behind = True
            deadlines.set("message", now + CONFIRM, self._due)
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
