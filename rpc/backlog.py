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
cancellation) waits right behind it, and the parts of a running stream that find
``max_request_bytes`` taken (NoRoom) wait for room ahead of the rest: both are set aside
(:mod:`rpc.backlog_aside`, a part the backlog owns) and count in its bound.

The kept messages run three ways, in order: :meth:`Backlog.run`, from the first, at a turn
of the peer's (while the input no longer waits); :meth:`Backlog.take`, a read that comes
while the input waits, what may run now run at once and the rest kept; and
:meth:`Backlog.run_replies`, the kept ones that may run now picked out before the peer
reads on. All three stop at a message refused with InputHeld (it goes back first, and is
:attr:`Backlog.refused` until it runs) and set aside a part that finds
``max_request_bytes`` taken until there is room. Not the hot path: messages come here only
while they may not run as read.
Freed at ``connection_lost`` (:meth:`Backlog.clear`), with the turn due at them, if any.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from rpc.backlog_aside import RequestKinds, SetAside
from rpc.request_bytes import RequestBytes
from rpc.stream_hold import InputHeld, NoRoom

MESSAGES_PER_TURN = 256
"""Messages handled per connection in one go; the rest of a larger read wait for the next
loop iteration (reading paused meanwhile), so other connections get their turn."""

KEPT_READ_SIZE = 4 * 1024
"""Bytes one read of a byte stream may take while the backlog keeps messages (else
``transports.read_buffer.READ_SIZE``, 256 KiB, up to about 20,000 tiny messages): a loop
iteration reads each connection once, so this bounds what a flooding connection adds to
its backlog past the bound (about 320 messages) and the time its callback takes while
others wait (about a millisecond; figures in docs/limits.md). A larger read (one that
began while nothing was kept, or a WebSocket message) is decoded in slices of this size
past the message in progress (:meth:`rpc.peer.Peer._read`). The price: a large message
that arrives while messages are kept takes 64 times the reads, a system call and a loop
iteration each (about 4,100 for 16 MiB)."""

OVERHEAD = 256
"""Bytes counted per message besides its payload: about what a decoded message takes in
memory (a small Gotalk request, its id and op: about 200 bytes)."""

OWN_SHARE = 4
"""The backlog may keep ``max_request_bytes // OWN_SHARE`` (a quarter) whatever the requests
being served hold: the replies its handlers wait for are read while those requests hold
the whole limit."""

MAX_MESSAGES = 16_384
"""Messages kept before reading pauses, whatever their size (counted as 4 MiB when tiny; in
memory about 4 MB over Gotalk and 7.5 MB over Chatter, whose envelopes and conversation
records take more: docs/limits.md), against a flood of small messages the byte bound would
let grow to 262,144 of them."""


class MessageKinds(RequestKinds, Protocol):
    """What the backlog asks the protocol adapter (:class:`rpc.options.Adapter`) of a
    message it keeps."""

    def message_size(self, message: Any) -> int: ...


class Backlog:
    """One connection's backlog (see the module doc). ``messages`` is read by the peer (its
    truthiness is the hot path's one check); it is changed only through the methods here,
    which keep :attr:`bytes` counted, each message as ``size`` (the adapter's
    ``message_size``) plus :data:`OVERHEAD`, those set aside too.

    ``sorted`` is False while the messages may include some that run while the rest waits
    (replies to our calls, what serves running handlers: ``runs_now`` of :meth:`take`), as when
    the rest of a read was kept whole, in order; the peer then runs those before it reads
    on (:meth:`run_replies`), so that what it reads later never overtakes them. That look
    goes over the messages kept whole since the last one (:attr:`unlooked`) alone, unless
    what may run now changed for those kept before (:meth:`recheck`, messages put back
    first): a flood read while our output waits costs one look per
    message, not one over the whole backlog per read."""

    __slots__ = (
        "_context",
        "_emptied",
        "_loop",
        "_on_turn",
        "_size",
        "_times",
        "aside",
        "front",
        "keeps_request",
        "messages",
        "read_at",
        "refused",
        "requests",
        "room",
        "room_due",
        "sorted",
        "turn",
        "unlooked",
        "waits_room",
    )

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
        self.unlooked = 0
        """The last messages of :attr:`messages` that no look of :meth:`run_replies` went
        over since they were kept whole (:meth:`extend`); -1: every message must be looked
        over again (what may run now changed for those before)."""
        self.refused: Any = None
        """The message that raised InputHeld when it last ran (here, or in the peer's read:
        then it was kept first), until it runs: meanwhile reading stays paused, even while
        our output keeps it from being tried again (see :meth:`run`)."""
        self.requests = requests
        """The bytes the peer's requests hold while served: they share the byte bound, and
        the backlog's own are counted there (``reserved``)."""
        self.turn: asyncio.Handle | None = None
        """The next turn at the messages (``on_turn``), if one is due: see :meth:`next_turn`."""
        aside = self.aside = SetAside(kinds)
        """What follows the requests kept in :attr:`messages`, and the parts that wait for
        room (:mod:`rpc.backlog_aside`)."""
        self.room = aside.room
        """The aside's streams whose parts wait for room (the same dict): the peer reads it
        once per read, and checks :attr:`waits_room` per message only while it is not empty."""
        self.waits_room = aside.waits_room
        """The aside's (:meth:`SetAside.waits_room`), bound here: no call or look-up more
        per message."""
        self.keeps_request = aside.keeps
        """The aside's (:meth:`SetAside.keeps`), bound here, as :attr:`waits_room`."""
        self.room_due = False
        """Room came back: :meth:`room_back` is due at the next turn."""
        self.front: Any = None
        """The last of the messages put back first (:meth:`popleft`) while it waits: a read
        meanwhile is kept whole, as while not :attr:`sorted`, so that a part read later
        does not overtake them, without the look over every message that not sorted asks
        for (a request taken per turn would make that quadratic)."""
        self._loop = loop
        self._on_turn = on_turn
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
        """The messages kept, those set aside too."""
        return len(self.messages) + self.aside.count

    def _count(self, messages: Iterable[Any]) -> int:
        size = self._size
        return sum(size(message) + OVERHEAD for message in messages)

    def _keep(self, message: Any, read_at: float) -> int:
        """Keep one message last, or set it aside behind its request if that is kept too
        (:meth:`SetAside.keep <rpc.backlog_aside.SetAside.keep>`); the bytes it counts, for
        the caller to add."""
        if not self.aside.keep(message, read_at):
            self.messages.append(message)
            self._times.append(read_at)
        return self._size(message) + OVERHEAD

    def wait_room(self, message: Any, read_at: float) -> int:
        """Set aside a part of a running stream that found ``max_request_bytes`` taken
        (NoRoom); what follows it waits with it until :meth:`room_back`. The bytes it
        counts, for the caller to add."""
        self.aside.wait_room(message, read_at)
        return self._size(message) + OVERHEAD

    def room_back(self) -> None:
        """``max_request_bytes`` has room again: the parts set aside for it go first, in
        order (marked ``front``), once each."""
        self.room_due = False
        if not self.room:
            return
        waited = self.aside.room_back()
        if waited:
            self.messages.extendleft(message for message, _ in reversed(waited))
            self._times.extendleft(read_at for _, read_at in reversed(waited))
            self.unlooked = -1
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
        self.aside.read_before(before)

    def extend(self, messages: list[Any]) -> None:
        """Keep messages in order, replies to our calls among them maybe."""
        if messages:
            read_at = self.read_at
            keep = self._keep
            before = len(self.messages)
            self.requests.reserved += sum([keep(message, read_at) for message in messages])
            self.sorted = False
            if self.unlooked >= 0:
                self.unlooked += len(self.messages) - before

    def popleft(self) -> Any:
        """Take the first message; :attr:`read_at` becomes the time it was read at. What
        follows a request, set aside, comes first after it."""
        messages = self.messages
        message = messages.popleft()
        self.read_at = self._times.popleft()
        self.requests.reserved -= self._size(message) + OVERHEAD
        if message is self.front:
            self.front = None
        if self.unlooked > len(messages):  # (it was one of them)
            self.unlooked -= 1
        aside = self.aside
        if aside.by_request:
            followers = aside.release(message)
            if followers:
                for follower, read_at in reversed(followers):
                    messages.appendleft(follower)
                    self._times.appendleft(read_at)
                self.unlooked = -1
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
        self.unlooked = -1

    def recheck(self) -> None:
        """What may run while the rest waits changed (our output drained: parts of running
        streams may run now; a graceful close began: parts of streams that do not run go): the
        turn that follows looks among all the messages for it (a Python call per message),
        and a read meanwhile is kept whole until then."""
        if self.messages:
            self.sorted = False
            self.unlooked = -1

    def clear(self) -> None:
        """Drop every message, and the turn due (the connection is gone)."""
        self.messages.clear()
        self._times.clear()
        self.aside.clear()
        self.front = None
        self.requests.reserved = 0
        self.sorted = True
        self.unlooked = 0
        self.refused = None
        if self.turn is not None:
            self.turn.cancel()
            self.turn = None
        self.settle()

    # --- runs (see the module doc) --------------------------------------------------------

    def run(self, held: Callable[[Any], bool], dispatch: Callable[[Any], None], budget: int) -> int:
        """Run messages from the first, in order, while ``held`` lets the first go (at most
        ``budget``); one refused with InputHeld (a full stream queue, a notification with
        no room) goes back first and is :attr:`refused` until it runs: reading must stay
        paused until whoever refused it makes room, even while something else (our output)
        keeps it from being tried again. A part that finds ``max_request_bytes`` taken
        (NoRoom), or follows one, is set aside for room instead (:meth:`wait_room`).
        Returns how many ran (set aside included)."""
        messages = self.messages
        ran = 0
        while messages and ran < budget:
            self.read_at = self._times[0]  # held() may ask turned_away(): its own read time
            if held(messages[0]):
                break
            message = self.popleft()
            if self.room and self.waits_room(message):
                self.requests.reserved += self.wait_room(message, self.read_at)
                ran += 1
                continue
            try:
                dispatch(message)
            except NoRoom:  # a part waits for bytes: set aside, the rest goes on
                self.requests.reserved += self.wait_room(message, self.read_at)
            except InputHeld:
                self.appendleft(message)
                self.refused = message
                return ran
            if message is self.refused:
                self.refused = None
            ran += 1
        return ran

    def take(
        self,
        messages: list[Any],
        start: int,
        end: int,
        runs_now: Callable[[Any], bool],
        dispatch: Callable[[Any], None],
    ) -> int:
        """``messages[start:end]`` of a read while the peer's input waits and reading goes
        on (our output or slots hold it: :mod:`rpc.input_flow`): those that ``runs_now``
        (replies to our calls, parts of running streams, cancellations of running handlers)
        run at once (``dispatch``), the rest is kept in order. Returns where it stopped:
        ``end``, just past the message that filled the backlog, or at one refused with
        InputHeld (a reply for a stream of ours whose queue is full: it runs later). The
        backlog may be :attr:`full` whichever: reading must then pause."""
        keep = self._keep
        read_at = self.read_at
        requests = self.requests
        for index in range(start, end):
            message = messages[index]
            if self.room and self.waits_room(message):
                requests.reserved += self.wait_room(message, read_at)
            elif runs_now(message):
                try:
                    dispatch(message)
                    continue
                except NoRoom:  # a part past max_request_bytes: set aside for room
                    requests.reserved += self.wait_room(message, read_at)
                except InputHeld:
                    return index
            else:
                requests.reserved += keep(message, read_at)
            if self.full:
                return index + 1
        return end

    def run_replies(
        self, runs_now: Callable[[Any], bool], dispatch: Callable[[Any], None], budget: int
    ) -> int:
        """Run the messages kept that ``runs_now`` (replies to our calls, parts of running
        streams, requests a graceful close turns away, with what is set aside behind them;
        at most ``budget``, in order), before the peer reads on: what it reads later must
        not overtake them. The rest keep their order; those not run (past
        ``budget``, or from one refused with InputHeld, which is then :attr:`refused`) go
        back first. Returns how many ran. It looks over the :attr:`unlooked` messages alone
        when it can: those before were looked over already and found not to run now."""
        replies: list[Any] = []
        reply_times: list[float] = []
        kept: list[Any] = []
        kept_times: list[float] = []
        self.front = None  # what may run now runs here, or goes back first, not sorted
        aside = self.aside
        set_aside = aside.by_request
        messages, times = self.messages, self._times
        count = len(messages) if self.unlooked < 0 else self.unlooked
        looked = [messages.pop() for _ in range(count)]  # the last ones, taken off (the same
        looked_times = [times.pop() for _ in range(count)]  # deques: the peer holds them)
        looked.reverse()
        looked_times.reverse()
        for message, read_at in zip(looked, looked_times, strict=True):
            self.read_at = read_at  # runs_now() may ask turned_away(): its own read time
            if runs_now(message):
                replies.append(message)
                reply_times.append(read_at)
                followers = aside.release(message) if set_aside else None
                if followers:  # (a request a close turns away) what was set aside behind
                    # it goes right after it: else it would stay for good
                    replies += [follower for follower, _ in followers]
                    reply_times += [follower_at for _, follower_at in followers]
            else:
                kept.append(message)
                kept_times.append(read_at)
        messages.extend(kept)
        times.extend(kept_times)
        self.sorted = True
        self.unlooked = 0
        if not replies:
            return 0
        self.requests.reserved -= self._count(replies)
        ran = 0
        for message, read_at in zip(replies, reply_times, strict=True):
            if ran == budget:
                break
            self.read_at = read_at
            if self.room and self.waits_room(message):
                self.requests.reserved += self.wait_room(message, read_at)
                ran += 1
                continue
            try:
                dispatch(message)
            except NoRoom:  # a part waits for bytes: set aside for room, the rest goes on
                self.requests.reserved += self.wait_room(message, read_at)
                ran += 1
                continue
            except InputHeld:
                self.refused = message
                break
            if message is self.refused:
                self.refused = None
            ran += 1
        if ran < len(replies):
            self.messages.extendleft(reversed(replies[ran:]))
            self._times.extendleft(reversed(reply_times[ran:]))
            self.requests.reserved += self._count(replies[ran:])
            self.sorted = False
            self.unlooked = -1
        return ran
