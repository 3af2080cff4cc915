"""The Eventer client's deliveries: notifications received and not yet handed to its
callbacks and iterators, in the order received, bounded so that a slow callback slows the
server (the connection stops reading, TCP does the rest) instead of growing memory.

Owned by one :class:`~rpc.eventer.client.Client`, filled by its notification handlers and
drained by its delivery task. Bounds: ``max_count`` notifications (``events_queue_size``,
1,024 by default) and ``max_bytes`` bytes as received (``events_queue_bytes``, 16 MiB); the
notification that passes either goes in, and its handler returns a wait for room that the
connection runs as a task. While that task waits, further notifications of the same
connection raise ``NotificationsHeld`` (the connection keeps them, reading paused) until it
ends; meanwhile the loop watches the socket, unread, for the server's close
(:mod:`rpc.eventer.hold_watch`). Once the server's FIN is seen, that connection is held no
more: the rest is read and queued past the bounds, since the server sends nothing after it
(at most the socket's receive buffer). Notifications that ask for an ack are counted but never
held: they are requests, which the core bounds. A callback's own requests (while it runs)
lift the bound while awaited, since their answers must be read; tasks it leaves running do
not. So do the requests of the task reading an ``events()`` iterator
(:class:`ReaderIterator`) between a list it took and its next ``anext``: a full iterator
holds delivery, and so the connection, until it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeAlias

import rpc
from rpc.eventer import hold_watch
from rpc.eventer.iterators import EventsIterator, EventsQueue
from rpc.eventer.values import Event
from rpc.responder import NotificationsHeld

log = logging.getLogger("peerwire.eventer.client")

Delivery: TypeAlias = tuple[str, Any, asyncio.Future[None] | None, int]
"""(kind, value, ack future or None, bytes as received): the size that this queue and each
``events()`` iterator's (:class:`~rpc.eventer.iterators.EventsQueue`) count."""


class Deliveries:
    """The ordered, bounded queue of one client's undelivered notifications."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self._max_count = max_count
        self._max_bytes = max_bytes
        self.queued_bytes = 0
        """Bytes (as received) of the notifications queued."""
        self.room = asyncio.Event()
        """Set while the queue is within both bounds (or an answer is awaited)."""
        self.room.set()
        self._holding: rpc.Peer | None = None
        """The connection whose task waits for :attr:`room`: it holds further notifications
        (NotificationsHeld) until then, and the task's end resumes it."""
        self._read_out: rpc.Peer | None = None
        """The connection whose server's FIN the watch saw: never held again, so the rest
        of its input (at most the socket's receive buffer) is read. Set by :meth:`_hold`
        alone; forgotten when that connection ends."""
        self.awaited_answers = 0
        """Requests a callback (in the delivery task) waits on: the bound is off meanwhile."""
        self._acks: set[asyncio.Future[None]] = set()
        """Acks of the notifications queued or being handed over that ask one (at most
        those the core lets wait: ``max_concurrent``); see :meth:`closing`."""
        self._closing = False

    def qsize(self) -> int:
        return self._queue.qsize()

    def empty(self) -> bool:
        return self._queue.empty()

    def put(self, delivery: Delivery) -> None:
        done = delivery[2]
        if self._closing:  # dropped, as what is queued will be (acked: see closing())
            if done is not None:
                done.set_result(None)
            return
        self._queue.put_nowait(delivery)
        self.queued_bytes += delivery[3]
        if done is not None:
            self._acks.add(done)

    def closing(self) -> None:
        """The client closes: ack now every notification queued or being handed over, drop
        (acked) those that come during the close, and stop holding the connection. Its
        drain waits for the tasks it runs for them (an ack's handler, a wait for room),
        which would wait for the delivery task, which may be running the callback that
        closes."""
        self._closing = True
        for done in self._acks:
            if not done.done():
                done.set_result(None)
        self._acks.clear()
        self.room.set()

    async def get(self) -> Delivery:
        """The next delivery, in the order received; makes room once back under both."""
        delivery = await self._queue.get()
        self.queued_bytes -= delivery[3]
        if not self.room.is_set() and not self._full():
            self.room.set()
        return delivery

    async def run(
        self, hand: Callable[[str, Any, int], Awaitable[None]], ended: Callable[[], None]
    ) -> None:
        """The delivery task: hand each notification over in order (``hand(kind, value,
        size)``, its callbacks' requests answered meanwhile: :meth:`callback_running`) and
        ack it once handed over or failed (logged), until the end marker (``kind`` "end":
        the connection was lost and all it brought is delivered), then ``ended()``."""
        while True:
            kind, value, done, size = await self.get()
            if kind == "end":
                ended()
                return
            try:
                with self.callback_running():
                    await hand(kind, value, size)
            except Exception:
                log.exception("eventer %s callback failed", kind)
            finally:
                if done is not None:
                    self._acks.discard(done)
                    if not done.done():
                        done.set_result(None)

    def _full(self) -> bool:
        return self._queue.qsize() > self._max_count or self.queued_bytes >= self._max_bytes

    def hold_if_full(self) -> None:
        """Raise NotificationsHeld, before a notification handler acts, while a task of this
        connection waits for room: the connection keeps the notification (and the rest of
        its read), reading paused, until that task ends (see :mod:`rpc.notifications`)."""
        holding = self._holding  # while room is clear, its task waits (not a new connection's;
        # not one whose FIN was seen: _hold lets it go, and wait_for_room never takes it again)
        peer = rpc.current_peer.get(None)
        if peer is holding is not None and not self.room.is_set() and not self.awaited_answers:
            raise NotificationsHeld

    def wait_for_room(self) -> Awaitable[None] | None:
        """None while the queue is within both bounds (or the connection's FIN was seen);
        past either, an awaitable that waits for room. A notification handler returns it:
        the connection runs it as a task, and holds further notifications until it ends
        (:meth:`hold_if_full`). Meanwhile the loop watches the connection's socket, unread
        (:mod:`rpc.eventer.hold_watch`): paused, the transport would not tell."""
        if self.awaited_answers or self._closing or not self._full():
            return None
        peer = rpc.current_peer.get(None)
        if peer is not None and peer is self._read_out:
            return None  # its server sends no more: what is left is read (at most a buffer)
        self.room.clear()
        self._holding = peer
        return self._hold(peer)

    async def _hold(self, peer: rpc.Peer | None) -> None:
        """Wait for room, watching the connection. At the server's FIN the wait ends and the
        connection is held no more (:attr:`_read_out`): it reads the rest, whose
        notifications and answers arrive in order, then ends as at any close. A reset or a
        socket error aborts it (in :func:`hold_watch.watch`)."""
        if await hold_watch.watch(self.room, peer) == hold_watch.FIN:
            self._read_out = peer
            if self._holding is peer:
                self._holding = None
            if peer is not None:  # forgotten with its connection, not at the next FIN
                peer.closed.add_done_callback(lambda _: self._forget_read_out(peer))

    def _forget_read_out(self, peer: rpc.Peer) -> None:
        """``peer``'s connection is gone: nothing of it is kept (a reconnect makes another)."""
        if self._read_out is peer:
            self._read_out = None

    def release(self) -> None:
        """The client is finished: forget the connection held (its task is gone with it)."""
        self._holding = self._read_out = None

    @contextlib.contextmanager
    def callback_running(self) -> Iterator[None]:
        """Marks one callback's context (and the tasks it starts, which copy it) for as long
        as the callback runs: see :meth:`answer_awaited`."""
        delivering = _Delivering(self)
        token = _DELIVERING.set(delivering)
        try:
            yield
        finally:
            delivering.active = False
            _DELIVERING.reset(token)

    def handling(self) -> bool:
        """Whether this context handles one of this queue's notifications: a callback while
        it runs (or a task it started), or an ``events()`` reader between a list it took and
        its next (:class:`ReaderIterator`)."""
        delivering = _DELIVERING.get()
        return delivering is not None and delivering.deliveries() is self and delivering.active

    @contextlib.contextmanager
    def answer_awaited(self) -> Iterator[None]:
        """A request made by a callback while it runs (in the delivery task, or a task
        started from it, as ``asyncio.wait_for`` starts one): its answer must be read, so
        while it is awaited deliveries are not bounded (the connection would stop reading,
        and the callback wait its whole timeout). A task the callback left running does
        not lift the bound once the callback has returned."""
        if not self.handling():
            yield
            return
        self.awaited_answers += 1
        self.room.set()
        try:
            yield
        finally:
            self.awaited_answers -= 1


class ReaderIterator(EventsIterator):
    """An ``events()`` iterator whose reading task, from the list it took until it asks for
    the next one (or closes or drops the iterator), is handling it as a callback does: its
    own requests, and those of tasks it starts meanwhile, lift the deliveries' bound while
    awaited. Without that, a reader that queries before reading on waited its whole
    timeout whenever its iterator was full: delivery waits for the reader, the connection
    for delivery, the query's answer for the connection.

    The mark is a context variable of the reader's task, set by ``anext`` and reset by the
    next ``anext``, by the iterator's end and by ``aclose``: the reader's context holds
    nothing of the client's once it is done with the iterator (before, the last mark
    stayed set, inactive, for the task's lifetime, holding the client's deliveries). Two
    limits: ``anext`` run in a task of its own (``asyncio.wait_for`` on 3.11) marks that
    task, not the reader; and a mark out of reach (the reader's, when the iterator is
    closed from another task or dropped unclosed; copies in tasks the reader started
    meanwhile) is only made inactive, and refers to the deliveries weakly."""

    def __init__(
        self,
        queue: EventsQueue,
        iterators: set[EventsQueue],
        ended: asyncio.Future[None],
        deliveries: Deliveries,
    ) -> None:
        super().__init__(queue, iterators, ended)
        self._deliveries = deliveries
        self._handling: list[_Delivering] = []
        """The reader's mark while it handles a list (at most one)."""
        self._token: contextvars.Token[_Delivering | None] | None = None
        """What resets the mark in the context that set it."""
        weakref.finalize(self, _handled, self._handling).atexit = False

    async def __anext__(self) -> list[Event]:
        self._unmark()
        events = await super().__anext__()
        handling = _Delivering(self._deliveries)
        self._handling.append(handling)
        self._token = _DELIVERING.set(handling)  # the reader's context: anext runs in its task
        return events

    async def aclose(self) -> None:
        self._unmark()
        await super().aclose()

    def _unmark(self) -> None:
        """Done with the list: the mark goes inactive, and out of the current context if it
        is the one there (not when another reader's mark was set since: resetting would
        take that one out)."""
        mark = self._handling[-1] if self._handling else None
        _handled(self._handling)
        token, self._token = self._token, None
        if token is None or mark is None or _DELIVERING.get() is not mark:
            return
        try:
            _DELIVERING.reset(token)
        except ValueError:  # a copy of the reader's context (anext in a task it started)
            _DELIVERING.set(None)
        restored = _DELIVERING.get()
        if restored is not None and not restored.active:  # another reader's, done since
            _DELIVERING.set(None)


def _handled(handling: list[_Delivering]) -> None:
    """The reader is done with its list: its requests no longer lift the bound."""
    while handling:
        handling.pop().active = False


class _Delivering:
    """One callback's run: its requests lift the deliveries' bound while it lasts. It
    refers to the deliveries weakly: a copy left in a context (see
    :class:`ReaderIterator`) keeps nothing of the client alive."""

    __slots__ = ("active", "deliveries")

    def __init__(self, deliveries: Deliveries) -> None:
        self.deliveries = weakref.ref(deliveries)
        self.active = True


_DELIVERING: contextvars.ContextVar[_Delivering | None] = contextvars.ContextVar(
    "peerwire_eventer_delivering", default=None
)
"""The callback run in this context (the delivery task's, or a task it started), if any:
see :meth:`Deliveries.answer_awaited`."""


__all__ = ["Deliveries", "Delivery", "ReaderIterator"]
