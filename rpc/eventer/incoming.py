"""What the Eventer server sends a client, taken in: its notifications (events, with or
without an ack, and status) go into the client's bounded deliveries, and the delivery task
hands each over, in order, to the callbacks and the ``events()`` iterators.

:class:`Incoming` is a part the :class:`~rpc.eventer.client.Client` owns: it owns the
server's last status, the connection's handlers (:attr:`Incoming.registry`) and the
hand-over (:meth:`Incoming.hand`), and is given what it works on (the deliveries, the
callbacks, the iterators' queues). It calls nothing of the client's: the client is only
passed on to the callbacks as their first argument. Per notification it costs what the
client's own methods did (bound methods, one attribute read each). How the bounds hold the
connection: :mod:`rpc.eventer.deliveries`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import rpc
from rpc.eventer import common
from rpc.eventer.common import MSG_EVENTS_ACK, MSG_EVENTS_NOTIFY, MSG_STATUS_NOTIFY, Event, Status
from rpc.eventer.deliveries import Deliveries
from rpc.eventer.iterators import EventsQueue

if TYPE_CHECKING:
    from rpc.eventer.client import Client

StatusCb = Callable[["Client", Status], Awaitable[None] | None]
EventsCb = Callable[["Client", list[Event]], Awaitable[None] | None]


class Incoming:
    """One client's notification handlers (:attr:`registry`), its server's last status
    (:attr:`status`, :meth:`set_status`) and the hand-over the delivery task runs for each
    notification (:meth:`hand`)."""

    def __init__(
        self,
        client: Client,
        deliveries: Deliveries,
        status_cb: StatusCb | None,
        events_cb: EventsCb | None,
        iterators: set[EventsQueue],
    ) -> None:
        self._client = client
        """Passed to the callbacks as their first argument (nothing else of it is used)."""
        self._deliveries = deliveries
        self._status_cb = status_cb
        self._events_cb = events_cb
        self._iterators = iterators
        """The queues of the ``events()`` iterators still in use (the client's set: its
        iterators add and remove themselves)."""
        self.status = Status.STANDBY
        """The server's last announced status (set as received; its callback runs in
        delivery order)."""
        self.registry = rpc.Registry()
        """The handlers of the client's connections."""
        self.registry.handle(MSG_EVENTS_NOTIFY)(self._on_events_with_ack)
        self.registry.handle_notification(MSG_EVENTS_NOTIFY)(self._on_events)
        self.registry.handle_notification(MSG_STATUS_NOTIFY)(self._on_status)

    def _on_events(self, data: bytes) -> Awaitable[None] | None:
        self._deliveries.hold_if_full()
        self._deliveries.put(("events", common.decode_events(data), None, len(data)))
        return self._deliveries.wait_for_room()

    async def _on_events_with_ack(self, data: bytes) -> rpc.Reply:
        # a request: counted, never held here (the core bounds requests being served)
        done = asyncio.get_running_loop().create_future()
        self._deliveries.put(("events", common.decode_events(data), done, len(data)))
        await done
        return rpc.Reply(MSG_EVENTS_ACK, b"")

    def _on_status(self, data: bytes) -> Awaitable[None] | None:
        self._deliveries.hold_if_full()
        status = common.status_from_sbs(common.decode(MSG_STATUS_NOTIFY, data))
        self.set_status(status, len(data))
        return self._deliveries.wait_for_room()

    def set_status(self, status: Status, size: int = 0) -> None:
        """A status received (a notification, or an init response's): :attr:`status` now,
        its callback in delivery order."""
        self.status = status
        self._deliveries.put(("status", status, None, size))

    async def hand(self, kind: str, value: Any, size: int) -> None:
        """Hand one notification to the callbacks and iterators (:meth:`Deliveries.run`)."""
        callback: StatusCb | EventsCb | None = (
            self._status_cb if kind == "status" else self._events_cb
        )
        if callback is not None:
            result = callback(self._client, value)
            if inspect.isawaitable(result):
                await result
        if kind == "events":
            for queue in list(self._iterators):
                await queue.put(value, size)
