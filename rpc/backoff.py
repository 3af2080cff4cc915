"""Waiting between attempts: :class:`Backoff` (exponential, full jitter), the policy of
:func:`rpc.connect`'s reconnecting client (:class:`Reconnect`), and :func:`full_jitter`,
the same formula for retry loops that keep their own count (group links and members,
Spark's reconnect and resend loops). One formula: :meth:`Backoff.ceiling`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff", "Reconnect", "full_jitter"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential back-off with full jitter: attempt (or round) ``n``, from 0, waits a
    uniform random time in ``[0, min(cap, base * 2**n)]`` seconds."""

    base: float = 0.1
    cap: float = 10.0

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ValueError(f"back-off base and cap must not be negative: {self}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait before attempt ``attempt`` (no overflow however long the
        outage)."""
        return min(self.cap, self.base * 2.0 ** min(max(attempt, 0), 62))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """A random wait before attempt ``attempt`` (``rng``: a seeded generator, for tests;
        default the :mod:`random` module's)."""
        ceiling = self.ceiling(attempt)
        return rng.uniform(0.0, ceiling) if rng is not None else random.uniform(0.0, ceiling)


def full_jitter(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Wait before try ``attempt + 1`` (``attempt`` >= 1 failures so far): uniform in
    ``[0, min(cap, base * 2**(attempt-1))]`` (AWS "full jitter"); :meth:`Backoff.delay`
    counted from 1."""
    return Backoff(base, cap).delay(attempt - 1, rng)


@dataclass(frozen=True, slots=True)
class Reconnect:
    """How :func:`rpc.connect` reconnects (``connect(url, reconnect=Reconnect(...))``)."""

    backoff: Backoff = field(default_factory=Backoff)
    """Wait before each round of attempts (default: from 0.1 s, at most 10 s). Its base and
    cap must be positive: a zero would try again at once for good, a loop that burns a core
    against a server that refuses."""
    attempts: int | None = None
    """Failed attempts in a row after which the client closes; None: no limit; 0: the
    client closes when its connection drops."""
    shuffle: bool = False
    """Try the URLs of each round in a random order (else round-robin, starting after the
    URL that dropped)."""

    def __post_init__(self) -> None:
        if not (self.backoff.base > 0 and self.backoff.cap > 0):
            raise ValueError(f"a reconnecting client's back-off must be positive: {self.backoff}")
        if self.attempts is not None and self.attempts < 0:
            raise ValueError(f"attempts must not be negative: {self.attempts}")
