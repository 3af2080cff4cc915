"""A message begun must keep coming, over TCP and TLS: :class:`~transports.slow_input.SlowInput`
on the peer's decoded input.

While the peer's input ends in an unfinished message (the codec's buffered bytes), it must
send at least ``Options.min_receive_rate`` bytes a second (default 1,024), on average since
that began, once ``Options.receive_grace`` seconds (default 10 s) have passed. Past that the
connection is closed with the protocol's answer (the adapter's ``last_word``: Gotalk sends
``f00000003``, as for its read timeout; Chatter has none) and a warning on the violations
log. Time while we hold its input (reading paused, whatever the reason) does not count.
Bytes come to the codec in whole TLS records (up to 16 KiB, credited over TLS).

Over WebSocket the codec sees a frame only once it is whole (a Gotalk message's payload is a
frame of its own), so the connection does this check on its frames' payload bytes instead,
with the same options (:mod:`transports.ws_input_rate`); :attr:`MessageStall.unfinished`
(the peer's ``input_unfinished``) tells it when the codec holds part of a message, whose
rest may come a byte a WebSocket message.

The timer is slot ``"message"`` of the peer's deadlines, coarse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rpc.logs import violations
from transports.slow_input import TLS_RECORD, SlowInput


class MessageStall:
    """One connection's check on unfinished input: the owner of its
    :class:`~transports.slow_input.SlowInput`."""

    __slots__ = ("_last_word", "_peer", "check", "unfinished")

    def __init__(self, peer: Any, last_word: Callable[[], bytes] | None = None) -> None:
        self._peer = peer
        options = peer.options
        self.check = SlowInput(self, options.min_receive_rate, options.receive_grace)
        self._last_word = last_word
        """The bytes sent before closing, if the protocol has any."""
        self.unfinished = False
        """The last read left a message unfinished."""

    def start(self) -> None:
        """The connection is made: no check over WebSocket (the connection's own), a
        record's credit over TLS."""
        peer = self._peer
        if peer.outbox.framed:
            self.check.rate = None
        elif peer.transport.get_extra_info("ssl_object") is not None:
            self.check.credit = TLS_RECORD

    def read(self, at: float, size: int, buffered: int) -> None:
        """A read of ``size`` bytes at loop time ``at`` left ``buffered`` bytes of a message
        unfinished (0: none)."""
        self.unfinished = buffered > 0
        self.check.read(at, size, buffered)

    # --- InputOwner ------------------------------------------------------------------------

    def now(self) -> float:
        return float(self._peer.deadlines.now())

    def schedule(self, when: float, coarse: bool) -> None:
        self._peer.deadlines.set("message", when, self._due, coarse=coarse)

    def unschedule(self) -> None:
        self._peer.deadlines.clear("message")

    def held_since(self, begun: float) -> bool:
        peer = self._peer
        return not peer.reading or bool(peer.resumed_at > begun)

    def too_slow(self, received: int, seconds: float) -> None:
        peer = self._peer
        violations.warning(
            "%s peer %s: %d bytes in %.1f s with a message unfinished, under %s bytes a "
            "second (min_receive_rate); closing",
            peer.protocol_name,
            peer.remote_address,
            received,
            seconds,
            self.check.rate,
        )
        if self._last_word is not None:
            peer.outbox.push(self._last_word())
        peer.abort(
            TimeoutError(
                f"{received} bytes in {seconds:.1f} s with a message unfinished"
                " (under min_receive_rate)"
            )
        )

    def _due(self) -> None:
        if self._peer.is_open:
            self.check.due()
