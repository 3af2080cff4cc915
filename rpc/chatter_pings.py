"""When a Chatter connection sends a Ping, and when it gives up on a silent peer.

After ``interval`` s (default 20 s) of inbound silence we send a Ping; if nothing arrives
within ``timeout`` s (default 20 s) more, the connection is closed. Plans are spread and
one-sided (see :mod:`rpc.deadlines`): a Ping of ours goes after 100-110% of the interval, at
random; a Pong plans the next one at once (no wake-up to find it arrived); a peer's Ping
moves ours to 120%, past the peer's next, so one side pings and the other answers and an
idle connection costs one wake-up per interval. Liveness deadlines are coarse.

Before the first whole frame the dialect is unknown and no Ping can go out. A peer that has
sent nothing at all is left to these limits (closed after ``interval`` + ``timeout``), not
to the handshake limit: Hat peers say nothing until their first Ping, after 20 s of
silence. A frame begun and unfinished is a handshake under way (:meth:`handshake_pending`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rpc.deadlines import ANSWERER_SLACK, next_beat
from rpc.logs import violations
from wire.chatter import ChatterConnection

log = logging.getLogger("peerwire.rpc")


class ChatterPings:
    """One connection's Ping plan, in the peer's ``"ping"`` deadline slot."""

    __slots__ = (
        "_awaiting_pong",
        "_codec",
        "_loop",
        "_peer",
        "_ping_sent_at",
        "_send_ping",
        "_started",
        "heard",
        "interval",
        "last_read",
        "timeout",
    )

    def __init__(
        self,
        peer: Any,
        codec: ChatterConnection,
        interval: float | None,
        timeout: float,
        send_ping: Callable[[], None],
    ) -> None:
        if interval and not timeout > 0:
            raise ValueError(f"ping_timeout must be positive with pings on, not {timeout!r}")
        self._peer = peer
        self._codec = codec
        self._loop = peer.loop
        self._send_ping = send_ping
        """Queues a Ping and writes it (the adapter owns the output)."""
        self.interval = interval
        self.timeout = timeout
        self.last_read = 0.0
        """Loop time of the last bytes received."""
        self.heard = False
        """Any byte from the peer yet (before its first whole frame: a handshake begun)."""
        self._started = 0.0
        self._ping_sent_at = 0.0
        self._awaiting_pong = False

    def start(self) -> None:
        self._started = self.last_read = self._loop.time()
        if self.interval:
            when = next_beat(self.last_read, self.interval)
            self._peer.deadlines.set("ping", when, self._ping_due, coarse=True)

    def read(self, at: float) -> None:
        """Bytes arrived at loop time ``at`` (once per read, not per message)."""
        self.heard = True
        self.last_read = at

    def handshake_pending(self) -> bool:
        """A first frame begun and unfinished (or pings off and nothing yet)."""
        return self._codec.dialect is None and (self.heard or not self.interval)

    def heard_liveness(self, *, ponged: bool) -> None:
        """A Ping (that the codec answered) or a Pong arrived: plan our next Ping now.

        After our Pong, we ping on a new random plan; after the peer's Ping (ours not out),
        we only answer it, planning ours past the peer's next (both Pinged at once: the
        random plans part them)."""
        interval = self.interval
        if not interval:
            return
        if ponged:
            self._awaiting_pong = False
            when = next_beat(self.last_read, interval)
        elif self._awaiting_pong:  # our Pong is on its way: it plans the next Ping
            return
        else:
            when = self.last_read + interval * (1 + ANSWERER_SLACK)
        deadlines = self._peer.deadlines
        deadlines.set("ping", when, self._ping_due, coarse=True)
        deadlines.rearm()

    def _ping_due(self) -> None:
        """Silent for ``interval``: send a Ping and expect anything within the timeout."""
        peer = self._peer
        interval = self.interval
        if not peer.is_open or not interval:
            return
        now = peer.deadlines.now()
        silent_until = self.last_read + interval
        if now < silent_until:
            peer.deadlines.set("ping", silent_until, self._ping_due, coarse=True)
            return
        if self._codec.dialect is None:  # no Ping can go out before the dialect is known
            limit = self._started + interval + self.timeout
            if now < limit:
                peer.deadlines.set("ping", limit, self._ping_due, coarse=True)
                return
            log.info(
                "chatter peer %s sent no whole frame within %s s; closing",
                peer.remote_address,
                interval + self.timeout,
            )
            peer.abort(TimeoutError(f"no whole frame within {interval + self.timeout} s"))
            return
        self._send_ping()
        self._ping_sent_at = now
        self._awaiting_pong = True
        peer.deadlines.set("ping", now + self.timeout, self._pong_due, coarse=True)

    def input_held(self) -> None:
        """We stopped reading the peer (its input waits for our handlers): Ping it within
        half a timeout and on, twice per timeout while it lasts (see :meth:`_pong_due`),
        whatever our own plan said, so that it hears from us within its own limits."""
        if self.interval and self._codec.dialect is not None:
            when = self._peer.deadlines.now() + self.timeout / 2
            self._awaiting_pong = True  # the plan is ours until the hold ends
            self._peer.deadlines.set("ping", when, self._pong_due)

    def _pong_due(self) -> None:
        peer = self._peer
        if not peer.is_open:
            return
        if peer.holding_input:
            # we do not read it: its Pong (and its own Pings) wait unread. Ping again, so
            # that it hears from us within its own limits (twice per timeout: a peer with
            # ours hears one within any of its windows), and look again then
            now = peer.deadlines.now()
            self._send_ping()
            self._ping_sent_at = now
            peer.deadlines.set("ping", now + self.timeout / 2, self._pong_due)
            return
        self._awaiting_pong = False
        heard = max(self.last_read, peer.resumed_at)  # input held till then waits unread
        if heard >= self._ping_sent_at and self.interval:  # heard from it meanwhile
            when = next_beat(heard, self.interval)
            peer.deadlines.set("ping", when, self._ping_due, coarse=True)
            return
        violations.warning(  # a peer can make us say it per connection: rate-limited
            "chatter peer %s did not answer a ping within %s s; closing",
            peer.remote_address,
            self.timeout,
        )
        peer.abort(TimeoutError(f"ping not answered within {self.timeout} s (ping_timeout)"))
