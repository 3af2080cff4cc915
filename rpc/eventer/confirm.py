"""Registrations sent without response, until the server confirms them.

``register(events)`` without response returns once its message is handed to the
connection. Should that connection drop before the server read it (a server or a network
gone before the client noticed: bytes still in our buffers, the kernel's, or on the way),
it is lost, and nothing said so. The client cannot tell which were lost, but it can tell
which the server confirmed: the server reads a connection's messages in order, so its
answer to any request of ours confirms every registration sent before that request on
the same connection (our server even answers a query only once those are committed). A
query or a registration with response confirms them; when neither follows within
:data:`PROBE_DELAY`, the client sends a *probe*, a latest query for no event types (an
empty result, a few dozen bytes each way; one at a time, so at most one a second on a
connection that registers without response all the time, none on one that does not).
When a connection drops, the registrations sent on it and not confirmed may be lost: they
are counted (:attr:`Confirmations.unconfirmed`, :attr:`Confirmations.unconfirmed_events`)
and logged, one WARNING per drop (at most 20 per 10 s in the process, :data:`drops`). A
probe that times out (the client's ``timeout``) or fails confirms nothing; a server that
answers it with an error is not probed again on that connection.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import rpc
from rpc.eventer import codec
from rpc.eventer.addresses import address_text
from rpc.eventer.values import MSG_QUERY_REQ, QueryLatestParams
from transports.logs import RateLimitedLog

log = logging.getLogger("peerwire.eventer.client")
drops = RateLimitedLog(log)
"""Where a dropped connection's unconfirmed registrations are reported."""

PROBE_DELAY = 1.0
"""Seconds an unconfirmed registration waits for a request of ours to confirm it before
a probe is sent."""


@functools.cache
def probe() -> bytes:
    """A latest query for no event types: answered with no events, after every
    registration sent before it on the connection is committed (encoded on first use: the
    schemas are read then, not when the client is imported)."""
    return codec.encode(MSG_QUERY_REQ, codec.query_params_to_sbs(QueryLatestParams([])))


Mark = tuple["rpc.Peer | None", int, int]
"""What :meth:`Confirmations.mark` noted before a request: its connection, registrations
and events sent on it so far."""


class Confirmations:
    """One client's registrations without response on its current connection: sent, and
    confirmed by the server; owned by the :class:`~rpc.eventer.client.Client`, with one
    probe timer or task at most, cancelled by :meth:`close`."""

    def __init__(self, client_name: str, timeout: float) -> None:
        self._client_name = client_name
        self._timeout = timeout
        self._peer: rpc.Peer | None = None
        self._sent = self._sent_events = 0
        self._confirmed = self._confirmed_events = 0
        self._refused = False
        """The server answered a probe with an error: not probed again on this connection."""
        self._timer: asyncio.TimerHandle | None = None
        self._probe: asyncio.Task[None] | None = None
        self.unconfirmed = 0
        """Registrations without response whose connection dropped before the server
        confirmed them (each may or may not have been registered), since the start."""
        self.unconfirmed_events = 0
        """Their events."""

    @property
    def pending(self) -> int:
        """Registrations without response on the current connection not confirmed yet."""
        return self._sent - self._confirmed

    def sent(self, peer: rpc.Peer, events: int) -> None:
        """A registration of ``events`` events was handed to ``peer`` without response."""
        if peer is not self._peer:
            self.dropped()  # a new connection: what the last one left is in doubt
            self._peer = peer
        self._sent += 1
        self._sent_events += events
        self._arm()

    def mark(self, peer: rpc.Peer | None) -> Mark:
        """Note, before a request goes out on ``peer``, what its answer will confirm."""
        if peer is None or peer is not self._peer:
            return (None, 0, 0)
        return (peer, self._sent, self._sent_events)

    def answered(self, mark: Mark) -> None:
        """The request noted by ``mark`` was answered on the same connection."""
        peer, sent, events = mark
        if peer is not None and peer is self._peer and sent > self._confirmed:
            self._confirmed, self._confirmed_events = sent, events

    def dropped(self) -> None:
        """The connection dropped: count and report what it did not confirm (idempotent)."""
        count = self._sent - self._confirmed
        events = self._sent_events - self._confirmed_events
        peer = self._peer
        self._forget()
        if count:
            self.unconfirmed += count
            self.unconfirmed_events += events
            drops.warning(
                "eventer client %r: the connection to %s dropped before the server "
                "confirmed %d registrations sent without response (%d events); they may "
                "be lost (register with_response=True to know)",
                self._client_name,
                address_text(peer.remote_address) if peer is not None else "the server",
                count,
                events,
            )

    def close(self) -> None:
        """The client closes (its connection drains what was sent): nothing is reported."""
        self._forget()

    def _forget(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        self._peer = None
        self._sent = self._sent_events = self._confirmed = self._confirmed_events = 0
        self._refused = False

    def _arm(self) -> None:
        if self._timer is None and self._probe is None and not self._refused:
            self._timer = asyncio.get_running_loop().call_later(PROBE_DELAY, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._peer is not None and self.pending:
            self._probe = asyncio.get_running_loop().create_task(self._confirm(self._peer))

    async def _confirm(self, peer: rpc.Peer) -> None:
        mark = self.mark(peer)
        try:
            await peer.request(MSG_QUERY_REQ, probe(), timeout=self._timeout, raw=True)
        except rpc.RemoteError:  # an answer all the same (in order), but not probed again
            if self._peer is peer:
                self._refused = True
            self.answered(mark)
            return
        except (rpc.RpcError, OSError):  # dropped or timed out: confirms nothing
            return
        finally:
            if self._probe is asyncio.current_task():
                self._probe = None
        self.answered(mark)
        if self.pending:
            self._arm()
