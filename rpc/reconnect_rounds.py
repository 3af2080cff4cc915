"""The rounds of a reconnecting client's attempts: which URLs a round tries and in what
order, how long the client waits before it, when it gives up, and how a failed attempt is
told in the log and in ``closed``.

One :class:`Rounds` per :class:`~rpc.reconnect.ReconnectingPeer`, freed with it; its state
is two counters (the rules are in :mod:`rpc.reconnect`).
"""

from __future__ import annotations

import random

from rpc.backoff import Reconnect
from rpc.errors import ConnectionClosed


class Rounds:
    """A client's URLs, its policy, and how many attempts failed in a row and rounds passed
    since a connection last worked (the back-off's ``n``)."""

    __slots__ = ("_policy", "_urls", "count", "failures")

    def __init__(self, urls: tuple[str, ...], policy: Reconnect) -> None:
        self._urls = urls
        self._policy = policy
        self.failures = 0
        """Failed attempts in a row (a connection that closed before it answered, and
        lived less than the back-off cap, counts as one)."""
        self.count = 0
        """Rounds begun since a connection last worked."""

    def order(self, after: int) -> list[str]:
        """The URLs of one round: shuffled, or round-robin from the one after index
        ``after`` (-1: from the first)."""
        urls = self._urls
        if self._policy.shuffle:
            return random.sample(urls, len(urls))
        start = (after + 1) % len(urls)
        return [*urls[start:], *urls[:start]]

    def wait(self) -> float:
        """The back-off before the next round (:meth:`~rpc.backoff.Backoff.delay` of the
        rounds so far), which this counts."""
        wait = self._policy.backoff.delay(self.count)
        self.count += 1
        return wait

    def failed(self) -> int:
        """One more attempt failed; the failures in a row now."""
        self.failures += 1
        return self.failures

    def worked(self) -> None:
        """A connection worked: the back-off and the count of failures start again."""
        self.failures = self.count = 0

    @property
    def exhausted(self) -> bool:
        """``Reconnect(attempts=N)``'s limit reached (never with ``attempts=None``)."""
        limit = self._policy.attempts
        return limit is not None and self.failures >= limit

    def gave_up(self, why: str) -> str:
        """Why the client closed once :attr:`exhausted`, after the last failure ``why``."""
        limit = self._policy.attempts
        return why if limit == 0 else f"gave up after {limit} attempts: {why}"


def one_line(exc: BaseException) -> str:
    """An error in one line: the message of ours, type and message of others."""
    text = str(exc)
    if isinstance(exc, ConnectionClosed):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def failure(url: str, exc: BaseException) -> str:
    """Why an attempt to ``url`` failed, naming the URL once."""
    text = one_line(exc)
    return text if url in text else f"{url}: {text}"
