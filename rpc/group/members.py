"""Who is in the group, and who is to be skipped for now (exponential back-off, full jitter).

Static members (``add``) are never forgotten. Learned members (``learn``) number at most
``max_members`` and are forgotten after ``forget_after`` failures in a row. A peer that
fails ``n`` times in a row (member or not: forwarding reaches the nodes a distribution list
names) is skipped for ``backoff(n)``, a random time in
``[0, min(retry_after, retry_base * 2**(n-1))]``; failures are remembered for at most
``max_members`` peers (oldest dropped first). Hearing from a peer clears its failures, so a
restarted member is used again as soon as it speaks (its join broadcast, or any frame); so
does connecting to it, unless its last failure was a write stall (it accepted, then read
nothing): then only its reading or speaking does, and its back-off grows with each stall.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from rpc.backoff import full_jitter
from rpc.group.options import GroupOptions
from wire.gossip import NetID

__all__ = ["Members", "full_jitter"]

log = logging.getLogger("peerwire.group")


class Members:
    """The member list (static and learned), and per-peer failure counts and back-off."""

    __slots__ = ("_clock", "_failures", "_list", "_members", "_options", "_own", "_rng")

    def __init__(
        self,
        own: NetID,
        options: GroupOptions,
        rng: random.Random,
        clock: Callable[[], float],
    ) -> None:
        self._own = own
        self._options = options
        self._rng = rng
        self._clock = clock
        self._members: dict[NetID, bool] = {}  # NetID -> static (never forgotten)
        self._list: tuple[NetID, ...] = ()
        # NetID -> (failures in a row, down until, the last one was a write stall)
        self._failures: dict[NetID, tuple[int, float, bool]] = {}

    @property
    def all(self) -> tuple[NetID, ...]:
        """Every member, in the order added (ourselves never included)."""
        return self._list

    def knows(self, netid: NetID) -> bool:
        return netid in self._members

    def add(self, netid: NetID) -> None:
        """Add a static member (ignored if it is us)."""
        if netid != self._own:
            self._members[netid] = True
            self._list = tuple(self._members)

    def remove(self, netid: NetID) -> None:
        if self._members.pop(netid, None) is not None:
            self._list = tuple(self._members)

    def learn(self, netid: NetID) -> bool:
        """Add a learned member, unless known, us, port 0, or ``max_members`` reached;
        True if added."""
        if (
            netid in self._members
            or netid == self._own
            or netid.port == 0
            or len(self._members) >= self._options.max_members
        ):
            return False
        log.debug("%s learned of %s", self._own, netid)
        self._members[netid] = False
        self._list = tuple(self._members)
        return True

    def is_down(self, netid: NetID) -> bool:
        """True while ``netid`` is backed off after a failure."""
        failures = self._failures.get(netid)
        return failures is not None and failures[1] > self._clock()

    def failed(self, netid: NetID, *, stalled: bool = False) -> float:
        """Count a failure to reach ``netid`` (``stalled``: it stopped reading); returns how
        long it is now skipped."""
        count = self._failures.pop(netid, (0, 0.0, False))[0] + 1
        opts = self._options
        if count >= opts.forget_after and self._members.get(netid) is False:
            log.info("%s: forgetting unreachable member %s", self._own, netid)
            self.remove(netid)
            return 0.0
        delay = full_jitter(count, opts.retry_base, opts.retry_after, self._rng)
        self._failures[netid] = (count, self._clock() + delay, stalled)
        if len(self._failures) > opts.max_members:
            self._failures.pop(next(iter(self._failures)))
        return delay

    def connected(self, netid: NetID) -> None:
        """A connection to ``netid`` opened: no longer backed off, unless it stalled."""
        failures = self._failures.get(netid)
        if failures is not None and not failures[2]:
            del self._failures[netid]

    def reachable(self, netid: NetID) -> None:
        """``netid`` answered or spoke to us: no longer backed off."""
        if self._failures:
            self._failures.pop(netid, None)

    def backed_off(self) -> int:
        """Peers whose failures are remembered (at most ``max_members``)."""
        return len(self._failures)
