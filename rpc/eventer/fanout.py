"""Fan-out: committed sessions and status changes to every client that selects them.

Each client gets one session's events in one MsgEventsNotify (never split), filtered by its
subscription and server id; clients with the same selection share one encoding. Without
``events_ack`` a notification is written at once (a client past ``max_client_backlog``
unread bytes is closed); with it, each client has an :class:`AckSender`: one events
notification in flight, the next after the client's MsgEventsAck; a client whose
notifications not yet acked pass ``max_client_backlog`` bytes (or 10,000 of them) is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field

import rpc
from rpc.eventer.codec import encode, encode_events, status_to_sbs
from rpc.eventer.sessions import Session
from rpc.eventer.subscription import Subscription
from rpc.eventer.values import MSG_EVENTS_NOTIFY, MSG_STATUS_NOTIFY, EventType, Status
from rpc.tasks import TaskSet

log = logging.getLogger("peerwire.eventer.server")

MAX_QUEUED_NOTIFICATIONS = 10_000
"""Notifications waiting for a slow client's acks at most; past it it is disconnected (so is
one past ``max_client_backlog`` bytes of them: see :class:`AckSender`)."""
MATCH_CACHE_SIZE = 65_536
"""Event types whose subscription match is remembered per client (the dict: up to 2.5 MiB)."""


@dataclass(slots=True, eq=False)
class ClientInfo:
    """One initialised Eventer connection."""

    id: int
    name: str
    token: str | None
    subscription: Subscription
    server_id: int | None
    persisted: bool
    peer: rpc.Peer = field(repr=False)
    since_session: int = 0
    """Sessions up to this one were registered before the client's init: not notified."""
    matches: dict[EventType, bool] = field(default_factory=dict, repr=False)
    sender: AckSender | None = field(default=None, repr=False)
    """The client's ordered sender with ``events_ack``; None without."""
    query_turn: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    """Held by the connection's running query: its queries run one at a time (see
    :meth:`rpc.eventer.handlers.Handlers._on_query`)."""


class Fanout:
    """The initialised clients, and what each of them is sent."""

    def __init__(self, server_id: int, max_client_backlog: int) -> None:
        self.server_id = server_id
        self.clients: dict[rpc.Peer, ClientInfo] = {}
        self._max_backlog = max_client_backlog

    def add(self, client: ClientInfo) -> None:
        self.clients[client.peer] = client

    def remove(self, peer: rpc.Peer) -> ClientInfo | None:
        """Forget a closed connection's client (and stop its sender); None if it had none."""
        client = self.clients.pop(peer, None)
        if client is not None and client.sender is not None:
            client.sender.stop()
        return client

    def status(self, status: Status) -> None:
        """Tell every client the new status."""
        data = encode(MSG_STATUS_NOTIFY, status_to_sbs(status))
        for client in list(self.clients.values()):
            self._send(client, MSG_STATUS_NOTIFY, data)

    def notify(self, session: Session) -> None:
        """Send one committed session to every client whose filters select some of it."""
        full: bytes | None = None
        subsets: dict[tuple[int, ...], bytes] = {}
        types = session.types
        for client in list(self.clients.values()):
            if session.id <= client.since_session:
                continue
            if client.server_id is not None and client.server_id != self.server_id:
                continue
            sub = client.subscription
            if sub.matches_all:
                selected = None
            else:
                if not sub.query_types:
                    continue
                cache = client.matches
                chosen = []
                for i, event_type in enumerate(types):
                    hit = cache.get(event_type)
                    if hit is None:
                        if len(cache) >= MATCH_CACHE_SIZE:
                            cache.clear()
                        hit = cache[event_type] = sub.matches(event_type)
                    if hit:
                        chosen.append(i)
                if not chosen:
                    continue
                selected = None if len(chosen) == len(types) else tuple(chosen)
            if selected is None:
                if full is None:
                    full = encode_events(session.blobs)
                data = full
            else:
                subset = subsets.get(selected)
                if subset is None:
                    subset = subsets[selected] = encode_events([session.blobs[i] for i in selected])
                data = subset
            self._send(client, MSG_EVENTS_NOTIFY, data)

    async def finish(self, timeout: float) -> None:
        """A close's last word to ack-paced clients: wait, up to ``timeout`` s in all, until
        each has been handed what is queued for it (STANDBY last), then stop every sender.

        A client is waited for only while something is queued behind an events notification
        it has not acked (its ack would let it take that); one with nothing unacknowledged,
        or with only the notification in flight, is not. Stopping gives up the acks still
        awaited (their requests are cancelled), so closing the connections does not wait for
        them a second time: a client that never acked made a close wait ``timeout`` here,
        then the connections' whole drain bound for that ack."""
        waiting = [
            asyncio.ensure_future(c.sender.caught_up.wait())
            for c in self.clients.values()
            if c.sender is not None and not c.sender.caught_up.is_set()
        ]
        if waiting:
            await asyncio.wait(waiting, timeout=timeout)
            for waiter in waiting:
                waiter.cancel()
        for client in list(self.clients.values()):
            if client.sender is not None:
                client.sender.stop()

    def _send(self, client: ClientInfo, msg_type: str, data: bytes) -> None:
        if client.sender is not None:
            client.sender.push(msg_type, data)
            return
        with contextlib.suppress(rpc.ConnectionClosed):
            client.peer.notify(msg_type, data)
            if client.peer.write_buffer_size > self._max_backlog:
                log.warning("client %s reads too slowly: closing it", client.name)
                client.peer.abort()


class AckSender:
    """Per-client ordered sender for ``events_ack``: one events notification in flight,
    the next one only after the client's MsgEventsAck (status notifications keep their
    place in the queue and need no ack). Its task belongs to ``tasks``.

    Bounded as a client without acks is by its unread bytes: past ``max_bytes`` of
    notifications queued or waiting for their ack (a single larger one is let through
    alone), or past :data:`MAX_QUEUED_NOTIFICATIONS`, the client is closed, once: what comes
    for it until its close is seen (:meth:`Fanout.remove`) is dropped."""

    def __init__(self, client: ClientInfo, timeout: float, max_bytes: int, tasks: TaskSet) -> None:
        self._client = client
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._queue: deque[tuple[str, bytes]] = deque()
        self.held = 0
        """Bytes of the notifications queued or waiting for their ack."""
        self._ready = asyncio.Event()
        self.caught_up = asyncio.Event()
        """Set while nothing is queued (all handed to the connection; the last events
        notification may still wait for its ack), and for good once nothing more will be
        sent (the client gone, or closed by us): what a close waits for
        (:meth:`Fanout.finish`)."""
        self.caught_up.set()
        self._ended = False
        """Set once nothing more will be sent (the client gone, or closed by us): what
        comes for it is dropped, unlogged."""
        self._task = tasks.spawn(self._run())

    def push(self, msg_type: str, data: bytes) -> None:
        if self._ended:
            return
        held = self.held
        if len(self._queue) >= MAX_QUEUED_NOTIFICATIONS or (
            held and held + len(data) > self._max_bytes
        ):
            log.warning(
                "eventer client %d %r does not keep up with acks (%d notifications, %d bytes "
                "waiting); closing",
                self._client.id,
                self._client.name,
                len(self._queue),
                held,
            )
            self._drop()
            return
        self.held = held + len(data)
        self._queue.append((msg_type, data))
        self.caught_up.clear()
        self._ready.set()

    def stop(self) -> None:
        """Send nothing more: what is queued is dropped, an ack awaited given up."""
        self._task.cancel()
        self._end()

    def _end(self) -> None:
        self._ended = True
        self.caught_up.set()

    def _drop(self) -> None:
        self._end()
        self._client.peer.abort()

    async def _run(self) -> None:
        try:
            await self._send_queued()
        finally:
            self._end()

    async def _send_queued(self) -> None:
        peer = self._client.peer
        while True:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            msg_type, data = self._queue.popleft()
            if not self._queue:
                self.caught_up.set()  # handed over below: the ack itself is not waited for
            try:
                if msg_type == MSG_EVENTS_NOTIFY:
                    await peer.request(msg_type, data, timeout=self._timeout, raw=True)
                else:
                    peer.notify(msg_type, data)
            except rpc.RequestTimeout:
                log.warning(
                    "eventer client %d sent no ack in %s s; closing", self._client.id, self._timeout
                )
                self._drop()
                return
            except rpc.ConnectionClosed:
                return
            except rpc.RpcError as exc:  # answered something else than MsgEventsAck
                log.warning("eventer client %d: bad ack (%s); closing", self._client.id, exc)
                self._drop()
                return
            finally:
                self.held -= len(data)  # counted until its ack: held for the client till then
