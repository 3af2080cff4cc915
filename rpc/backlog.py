"""Messages read from the peer but not run yet, in order, and their bound.

A connection keeps decoded messages here while they may not run (see
:mod:`rpc.input_flow`): the rest of a read past ``MESSAGES_PER_TURN``, input behind a
stream's full queue, and, while our output waits (above ``high_water``) or every handler
or task slot is taken, the peer's requests, notifications, stream parts and heartbeats.
Those last are why it is bounded rather than one read's worth: meanwhile the peer is
still read (its replies to our calls are handled at once, the rest kept here), so that
its own pending output (at most its ``high_water``, one message and the socket buffers,
as its senders wait meanwhile) can drain into us, two peers that flood each other with
requests do not hold each other until their calls time out, and handlers that hold the
slots while they call the peer back get its replies. Reading pauses once the backlog is
:attr:`Backlog.full`:

- bytes: every message counts what the adapter's ``message_size`` says (its payload and
  names: a Gotalk op or notification name, a Chatter type and module: :func:`text_size`)
  plus :data:`OVERHEAD`, small ones too (unlike :mod:`rpc.request_bytes`, whose small
  payloads go uncounted: this runs only for held messages, never on the hot path). The
  backlog's bytes are :attr:`RequestBytes.reserved <rpc.request_bytes.RequestBytes>`:
  with those the peer's requests hold while served, they stay within
  ``Options.max_request_bytes`` (64 MiB), and a handler that frees some gives the peer a
  turn to read on. The backlog alone may always keep a quarter of it (:data:`OWN_SHARE`),
  so together they hold at most 1.25 times it: while the requests being served hold the
  whole limit (a peer without retry results), their handlers still get the peer's
  replies to their calls;
- count: at most :data:`MAX_MESSAGES`, for floods of tiny messages.

The message that passes the bound and the rest of its read are kept too (a read is at most
256 KiB over TCP and TLS, one message over WebSocket; a message at most ``max_size``), then
reading pauses, whether the read ended there or not. Input held for other reasons (a
turn, a stream, slots taken while no handler of ours runs: ``max_concurrent=0``) is kept
with reading paused at once, as it is bounded by a read; so is everything after a message
that refused to run (InputHeld: a notification its handler refused, a full stream queue)
until that message runs (:attr:`Backlog.refused`), even when reading went on before, and a
read that comes while kept messages may run now (not :attr:`Backlog.sorted`) until they ran.

Each message keeps the loop time of its read (:attr:`Backlog.read_at`): a request kept a
while counts its caller's time left from its arrival, not from when it runs.

What follows a request that is kept itself (the parts and end of its stream, its
cancellation) is set aside by request, and goes back in right behind it when it is taken
(:meth:`Backlog.popleft`): its handler may take the last slot, and a request kept between
them, waiting for that slot, must not hold the parts that handler waits for, or the
cancellation that would free the slot (a peer without retry results could stall both
until a deadline or the connection's end). A message costs a look-up or two of its
request (the adapter's ``opens_request`` and ``follows_request``) when kept, none when not.
So are the parts of a running stream that find ``max_request_bytes`` taken (NoRoom), and
what follows them, set aside by stream until there is room again
(:meth:`Backlog.room_back` puts them first), rather than kept behind requests that wait
for a slot: the stream's handler may hold one, and a look over the backlog each time room
comes back would cost a peer one tiny part per look.
Freed at ``connection_lost`` (:meth:`Backlog.clear`), with the turn due at them, if any.
How the kept messages run (at a turn, as a read comes, replies first): :mod:`rpc.backlog_runs`.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

from rpc.backlog_runs import BacklogRuns
from rpc.request_bytes import RequestBytes

MESSAGES_PER_TURN = 256
"""Messages handled per connection in one go; the rest of a larger read wait for the next
loop iteration (reading paused meanwhile), so other connections get their turn."""

OVERHEAD = 256
"""Bytes counted per message besides its payload: about what a decoded message takes in
memory (a small Gotalk request, its id and op: about 200 bytes)."""

OWN_SHARE = 4
"""The backlog may keep ``max_request_bytes // OWN_SHARE`` (a quarter) whatever the requests
being served hold: the replies its handlers wait for are read while those requests hold
the whole limit."""

MAX_MESSAGES = 16_384
"""Messages kept before reading pauses, whatever their size: about 3 MiB of tiny ones
(counted as 4 MiB), against a flood of small messages the byte bound would let grow to
262,144 of them."""


def text_size(text: str) -> int:
    """Bytes a name counts: its length when ASCII, else 4 bytes a character. That is at
    least both its UTF-8 length (as received) and the memory it takes: CPython stores every
    character of a string at the width of its widest one, so one four-byte character among
    16,000 ASCII ones makes 64 kB of 16 kB received."""
    return len(text) if text.isascii() else 4 * len(text)


class MessageKinds(Protocol):
    """What the backlog asks the protocol adapter (:class:`rpc.options.Adapter`) of a
    message it keeps."""

    def message_size(self, message: Any) -> int: ...
    def opens_request(self, message: Any) -> Hashable | None: ...
    def follows_request(self, message: Any) -> Hashable | None: ...
    def is_part(self, message: Any) -> bool: ...


class Backlog(BacklogRuns):
    """One connection's backlog (see the module doc). ``messages`` is read by the peer (its
    truthiness is the hot path's one check); it is changed only through the methods here
    and those of its base (:mod:`rpc.backlog_runs`), which keep :attr:`bytes` counted, each
    message as ``size`` (the adapter's ``message_size``) plus :data:`OVERHEAD`.

    ``sorted`` is False while the messages may include some that run while the rest waits
    (replies to our calls, what serves running handlers: ``runs_now`` of :meth:`take`), as when
    the rest of a read was kept whole, in order; the peer then runs those before it reads
    on (:meth:`run_replies`), so that what it reads later never overtakes them."""

    __slots__ = ("_context", "_emptied", "_loop", "_on_turn", "_size", "room_due", "turn")
    """With those of :class:`~rpc.backlog_runs.BacklogRuns`: the state its runs use."""

    def __init__(
        self,
        requests: RequestBytes,
        loop: asyncio.AbstractEventLoop,
        on_turn: Callable[[], None],
        kinds: MessageKinds,
    ) -> None:
        self.messages: deque[Any] = deque()
        self._times: deque[float] = deque()
        """The loop time each message was read at, in the same order (one float object per
        read, shared by its messages)."""
        self.read_at = 0.0
        """The loop time the message being dispatched was read at: the peer sets it per
        read, and a message run from here gets its own back, so that a request kept while
        the output waited counts its caller's time left from its arrival."""
        self.sorted = True
        self.refused: Any = None
        """The message that raised InputHeld when it last ran (here, or in the peer's read:
        then it was kept first), until it runs: meanwhile reading stays paused, even while
        our output keeps it from being tried again (see :meth:`run`)."""
        self.requests = requests
        """The bytes the peer's requests hold while served: they share the byte bound, and
        the backlog's own are counted there (``reserved``)."""
        self.turn: asyncio.Handle | None = None
        """The next turn at the messages (``on_turn``), if one is due: see :meth:`next_turn`."""
        self._parked: dict[Hashable, list[tuple[Any, float]] | None] = {}
        """What follows the requests kept in :attr:`messages`, by request, with their read
        times, in order (see the module doc): an entry per such request, None until
        something follows it."""
        self._parked_count = 0
        self.room: dict[Hashable, None] = {}
        """The running streams whose parts wait in ``_parked`` for room in
        ``max_request_bytes`` (:meth:`wait_room`), in order: whatever of theirs comes
        meanwhile, by any path, waits behind them (:meth:`waits_room`)."""
        self.room_due = False
        """Room came back: :meth:`room_back` is due at the next turn."""
        self.front: Any = None
        """The last of the messages put back first (:meth:`popleft`) while it waits: a read
        meanwhile is kept whole, as while not :attr:`sorted`, so that a part read later
        does not overtake them, without the look over every message that not sorted asks
        for (a request taken per turn would make that quadratic)."""
        self._loop = loop
        self._on_turn = on_turn
        self._kinds = kinds
        self._size = kinds.message_size
        self._context = contextvars.copy_context()
        """The context turns run in: the one the backlog was made in (the peer's)."""
        self._emptied: asyncio.Future[None] | None = None
        """What :meth:`emptied` gave, until no message is kept."""

    @property
    def bytes(self) -> int:
        """The bytes counted for the messages (see the class doc)."""
        return self.requests.reserved

    def next_turn(self) -> None:
        """Run ``on_turn`` at the loop's next iteration (once, however often asked), in the
        peer's own context, never a handler's: after a read cut at ``MESSAGES_PER_TURN``,
        a handler that ended, room in a stream's queue or in ``max_request_bytes``."""
        if self.turn is None:
            self.turn = self._loop.call_soon(self._take_turn, context=self._context)

    def _take_turn(self) -> None:
        self.turn = None
        self._on_turn()
        self.settle()

    def emptied(self) -> asyncio.Future[None]:
        """A future that resolves once no message is kept (at the end of a turn at them,
        :meth:`settle`, or :meth:`clear`): a graceful close waits for the requests read
        before it and kept (our output backed up, slots taken) to run, as it waits for
        those running, within its ``drain_timeout``."""
        if self._emptied is None or self._emptied.done():
            self._emptied = self._loop.create_future()
        return self._emptied

    def settle(self) -> None:
        """After a turn at the messages: resolve :meth:`emptied`'s future if none is left."""
        if self._emptied is not None and not self.messages and not self._emptied.done():
            self._emptied.set_result(None)

    @property
    def full(self) -> bool:
        """True when reading should pause (see the module doc)."""
        requests = self.requests
        reserved = requests.reserved
        if len(self) >= MAX_MESSAGES or reserved + requests.used < requests.limit:
            return len(self) >= MAX_MESSAGES
        return reserved >= requests.limit // OWN_SHARE

    def __len__(self) -> int:
        """The messages kept, those set aside behind their request too."""
        return len(self.messages) + self._parked_count

    def _count(self, messages: Iterable[Any]) -> int:
        size = self._size
        return sum(size(message) + OVERHEAD for message in messages)

    def _keep(self, message: Any, read_at: float) -> int:
        """Keep one message last, or set it aside behind its request if that is kept too
        (see the module doc); the bytes it counts, for the caller to add."""
        parked = self._parked
        if parked:
            key = self._kinds.follows_request(message)
            if key in parked and (key not in self.room or self._kinds.is_part(message)):
                followers = parked[key]
                if followers is None:
                    parked[key] = [(message, read_at)]
                else:
                    followers.append((message, read_at))
                self._parked_count += 1
                return self._size(message) + OVERHEAD
        key = self._kinds.opens_request(message)
        if key is not None and key not in parked:  # (a repeated id: the peer errs)
            parked[key] = None
        self.messages.append(message)
        self._times.append(read_at)
        return self._size(message) + OVERHEAD

    def keeps_request(self, key: Hashable | None) -> bool:
        """True while request ``key`` is kept here, unrun: its parts must wait behind it."""
        return key in self._parked

    def wait_room(self, message: Any, read_at: float) -> int:
        """Set aside a part of a running stream that found ``max_request_bytes`` taken
        (NoRoom); what follows it waits with it until :meth:`room_back`. The bytes it
        counts, for the caller to add."""
        key = self._kinds.follows_request(message)
        followers = self._parked.get(key)
        if followers is None:
            self._parked[key] = [(message, read_at)]
        else:
            followers.append((message, read_at))
        self.room[key] = None
        self._parked_count += 1
        return self._size(message) + OVERHEAD

    def waits_room(self, message: Any) -> bool:
        """True when ``message`` is a part or the end of a stream whose parts are set aside
        for room: it must wait behind them (:meth:`wait_room` it). Not its cancellation,
        which frees what they wait for."""
        kinds = self._kinds
        if not self.room or not kinds.is_part(message):
            return False
        return kinds.follows_request(message) in self.room

    def room_back(self) -> None:
        """``max_request_bytes`` has room again: the parts set aside for it go first, in
        order (marked ``front``), once each."""
        self.room_due = False
        if not self.room:
            return
        parked = self._parked
        waited: list[tuple[Any, float]] = []
        for key in self.room:
            waited += parked.pop(key, None) or ()
        self.room.clear()
        if waited:
            self._parked_count -= len(waited)
            self.messages.extendleft(message for message, _ in reversed(waited))
            self._times.extendleft(read_at for _, read_at in reversed(waited))
            if self.front is None:  # (else a later one, still waiting, covers these too)
                self.front = waited[-1][0]

    def read_before(self, when: float) -> None:
        """Count every message kept now as read before loop time ``when`` (a graceful
        close's start: what was read before it runs, :meth:`Responder.turned_away
        <rpc.responder.Responder.turned_away>`): uvloop's clock counts whole ms, so one
        read in the close's own tick reads as ``when``; it reads as the float below."""
        before = math.nextafter(when, -math.inf)
        times = self._times
        if any(read_at >= when for read_at in times):
            kept = [min(read_at, before) for read_at in times]
            times.clear()
            times.extend(kept)
        parked = self._parked
        for key, followers in parked.items():
            if followers:
                parked[key] = [(message, min(read_at, before)) for message, read_at in followers]

    def extend(self, messages: list[Any]) -> None:
        """Keep messages in order, replies to our calls among them maybe."""
        if messages:
            read_at = self.read_at
            keep = self._keep
            self.requests.reserved += sum([keep(message, read_at) for message in messages])
            self.sorted = False

    def popleft(self) -> Any:
        """Take the first message; :attr:`read_at` becomes the time it was read at. What
        follows a request, set aside, comes first after it."""
        messages = self.messages
        message = messages.popleft()
        self.read_at = self._times.popleft()
        self.requests.reserved -= self._size(message) + OVERHEAD
        if message is self.front:
            self.front = None
        if self._parked:
            key = self._kinds.opens_request(message)
            followers = self._parked.pop(key, None) if key is not None else None
            if followers:
                self._parked_count -= len(followers)
                for follower, read_at in reversed(followers):
                    messages.appendleft(follower)
                    self._times.appendleft(read_at)
                if self.front is None:  # (else a later one, still waiting, covers these)
                    self.front = followers[-1][0]
        if not messages:
            self.sorted = True
        return message

    def appendleft(self, message: Any) -> None:
        """Put back the message just taken (it could not run after all)."""
        self.messages.appendleft(message)
        self._times.appendleft(self.read_at)
        self.requests.reserved += self._size(message) + OVERHEAD
        self.sorted = False

    def recheck(self) -> None:
        """What may run while the rest waits changed (our output drained: parts of running
        streams may run now): the turn that follows looks among the messages for it (a
        Python call per message), and a read meanwhile is kept whole until then."""
        if self.messages:
            self.sorted = False

    def clear(self) -> None:
        """Drop every message, and the turn due (the connection is gone)."""
        self.messages.clear()
        self._times.clear()
        self._parked.clear()
        self.room.clear()
        self._parked_count = 0
        self.front = None
        self.requests.reserved = 0
        self.sorted = True
        self.refused = None
        if self.turn is not None:
            self.turn.cancel()
            self.turn = None
        self.settle()
