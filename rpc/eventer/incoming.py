"""What the Eventer server sends a client, taken in: its notifications (events, with or
without an ack, and status) go into the client's bounded deliveries, and the delivery task
hands each over, in order, to the callbacks and the ``events()`` iterators.

:class:`Incoming` is the base of :class:`~rpc.eventer.client.Client` (whole methods moved
out of it: no call layer or lookup added per notification); the client owns the state
they use. How the bounds hold the connection: :mod:`rpc.eventer.deliveries`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

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
    """The client's notification handlers (:meth:`_make_registry`) and the hand-over the
    delivery task runs for each notification (:meth:`_hand`)."""

    _deliveries: Deliveries
    _status: Status
    _status_cb: StatusCb | None
    _events_cb: EventsCb | None
    _iterators: set[EventsQueue]
    """The queues of the ``events()`` iterators still in use."""

    def _make_registry(self) -> rpc.Registry:
        registry = rpc.Registry()
        registry.handle(MSG_EVENTS_NOTIFY)(self._on_events_with_ack)
        registry.handle_notification(MSG_EVENTS_NOTIFY)(self._on_events)
        registry.handle_notification(MSG_STATUS_NOTIFY)(self._on_status)
        return registry

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
        self._set_status(status, len(data))
        return self._deliveries.wait_for_room()

    def _set_status(self, status: Status, size: int = 0) -> None:
        self._status = status  # now; the callback runs in delivery order
        self._deliveries.put(("status", status, None, size))

    async def _hand(self, kind: str, value: Any, size: int) -> None:
        """Hand one notification to the callbacks and iterators (:meth:`Deliveries.run`)."""
        callback: StatusCb | EventsCb | None = (
            self._status_cb if kind == "status" else self._events_cb
        )
        if callback is not None:
            result = callback(cast("Client", self), value)
            if inspect.isawaitable(result):
                await result
        if kind == "events":
            for queue in list(self._iterators):
                await queue.put(value, size)
