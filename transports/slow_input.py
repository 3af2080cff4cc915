"""A message begun must keep coming: the least rate at which a peer sends the rest.

Silence limits (keepalive pings, read timeouts) count from the latest byte, so a peer that
begins a message and then sends a byte now and then holds its connection, and up to the
message size limit of memory, for as long as it likes. :class:`SlowInput` bounds that as
HTTP servers bound a request body's rate: while the peer's input ends unfinished, it must
send at least ``rate`` bytes a second on average since that began, once ``grace`` seconds
have passed; else its owner closes it.

Only the peer's time counts: when the owner held the input (reading paused, whatever the
reason) since the count began, the count starts again with a new grace; and a check that
finds the peer behind looks again :data:`CONFIRM` seconds later, after the loop has read
what waits (uvloop runs due timers before it polls the sockets, so a loop kept busy by us
would otherwise blame the peer). ``credit`` bytes are counted as received beyond what was
(over TLS, a record not yet whole: :data:`TLS_RECORD`). The rate is an average since the
message began: a peer that sent much of it quickly may then go slowly for as long as that
average allows.

Per read this costs a comparison or two; the owner's timer is set once when input begins
to end unfinished and moved on only when it comes due, so input that keeps ending
unfinished (large messages, reads cut anywhere) arms no timer per read. Used by the RPC
peers over TCP and TLS (:mod:`rpc.message_stall`) and by WebSocket connections
(:mod:`transports.ws_input_rate`).
"""

from __future__ import annotations

from typing import Protocol

CONFIRM = 0.05
"""Seconds between a check that finds the peer behind and the one that closes it."""

TLS_RECORD = 16 * 1024
"""Bytes credited over TLS: what may wait in a record not yet whole."""


class InputOwner(Protocol):
    """What :class:`SlowInput` needs of the connection it checks."""

    def now(self) -> float:
        """The loop's time."""

    def schedule(self, when: float, coarse: bool) -> None:
        """Call the check's :meth:`SlowInput.due` at ``when`` (``coarse``: may be late);
        replaces the one scheduled before."""

    def unschedule(self) -> None:
        """The input ends whole: no call is due."""

    def held_since(self, begun: float) -> bool:
        """Whether we held the peer's input (did not read it) at any time since ``begun``."""

    def too_slow(self, received: int, seconds: float) -> None:
        """Close the peer: ``received`` bytes in ``seconds`` with its input unfinished."""


class SlowInput:
    """One connection's check on unfinished input (see the module doc). ``rate`` None:
    no check."""

    __slots__ = ("_begun", "_behind", "_owner", "_received", "credit", "grace", "rate")

    def __init__(
        self, owner: InputOwner, rate: float | None, grace: float, *, credit: int = 0
    ) -> None:
        self._owner = owner
        self.rate = rate
        self.grace = grace
        self.credit = credit
        self._begun: float | None = None
        """Loop time the input began to end unfinished (None while it ends whole)."""
        self._received = 0
        """Bytes read since then."""
        self._behind = False
        """The last check found the peer behind: the next one closes it, if it still is."""

    @property
    def begun(self) -> float | None:
        """Loop time the input began to end unfinished (None: it ends whole)."""
        return self._begun

    def read(self, at: float, size: int, unfinished: int) -> None:
        """A read of ``size`` bytes at loop time ``at`` left ``unfinished`` bytes of a message
        (0: the input ends whole)."""
        if not unfinished:
            if self._begun is not None:
                self._begun = None
                self._owner.unschedule()
        elif self._begun is not None:
            self._received += size
        elif self.rate:
            self._begin(at, unfinished)

    def _begin(self, at: float, received: int) -> None:
        self._begun = at
        self._received = received
        self._behind = False
        self._owner.schedule(at + self.grace, True)

    def due(self) -> None:
        """The owner's timer: close the peer if it is behind twice in a row."""
        begun = self._begun
        rate = self.rate
        if begun is None or not rate:
            return
        owner = self._owner
        now = owner.now()
        if owner.held_since(begun):
            self._begin(now, 0)
            return
        due = begun + max(self.grace, (self._received + self.credit) / rate)
        if due > now:  # it kept up
            self._behind = False
            owner.schedule(due, True)
        elif not self._behind:  # once more, after the loop has read what waits
            self._behind = True
            owner.schedule(now + CONFIRM, False)
        else:
            owner.too_slow(self._received, now - begun)
