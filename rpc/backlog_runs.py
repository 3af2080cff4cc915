"""How the messages kept in a connection's backlog (:mod:`rpc.backlog`) run, in order.

Three ways, each a method of :class:`BacklogRuns` (a base of :class:`~rpc.backlog.Backlog`,
which holds the state named here): :meth:`~BacklogRuns.run`, from the first, at a turn
of the peer's (while the input no longer waits); :meth:`~BacklogRuns.take`, a read that
comes while the input waits, what may run now run at once and the rest kept; and
:meth:`~BacklogRuns.run_replies`, the kept ones that may run now picked out before the
peer reads on. All three stop at a message refused with InputHeld (it goes back first, and
is :attr:`~rpc.backlog.Backlog.refused` until it runs) and set aside a part that finds
``max_request_bytes`` taken (NoRoom) until there is room. Not the hot path: messages come
here only while they may not run as read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from rpc.stream_hold import InputHeld, NoRoom

if TYPE_CHECKING:
    from rpc.backlog import MessageKinds
    from rpc.request_bytes import RequestBytes


class BacklogRuns:
    """The runs of the kept messages (see the module doc). The state they use is in the
    slots here, set up by :class:`~rpc.backlog.Backlog`, which documents them."""

    __slots__ = (
        "_kinds",
        "_parked",
        "_parked_count",
        "_times",
        "front",
        "messages",
        "read_at",
        "refused",
        "requests",
        "room",
        "sorted",
    )

    messages: deque[Any]
    _times: deque[float]
    read_at: float
    sorted: bool
    refused: Any
    requests: RequestBytes
    room: dict[Hashable, None]
    front: Any
    _parked: dict[Hashable, list[tuple[Any, float]] | None]
    _parked_count: int
    _kinds: MessageKinds

    if TYPE_CHECKING:

        @property
        def full(self) -> bool: ...

        def _count(self, messages: Iterable[Any]) -> int: ...
        def _keep(self, message: Any, read_at: float) -> int: ...
        def wait_room(self, message: Any, read_at: float) -> int: ...
        def waits_room(self, message: Any) -> bool: ...
        def popleft(self) -> Any: ...
        def appendleft(self, message: Any) -> None: ...

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
        back first. Returns how many ran."""
        replies: list[Any] = []
        reply_times: list[float] = []
        kept: list[Any] = []
        kept_times: list[float] = []
        self.front = None  # what may run now runs here, or goes back first, not sorted
        parked = self._parked
        for message, read_at in zip(self.messages, self._times, strict=True):
            self.read_at = read_at  # runs_now() may ask turned_away(): its own read time
            if runs_now(message):
                replies.append(message)
                reply_times.append(read_at)
                key = self._kinds.opens_request(message) if parked else None
                followers = parked.pop(key, None) if key is not None else None
                if followers:  # (a request a close turns away) its parts go right after it:
                    self._parked_count -= len(followers)  # set aside, they would stay for good
                    replies += [follower for follower, _ in followers]
                    reply_times += [follower_at for _, follower_at in followers]
            else:
                kept.append(message)
                kept_times.append(read_at)
        self.sorted = True
        if not replies:
            return 0
        self.messages.clear()  # the same deque: the peer holds it (its hot path's check)
        self.messages.extend(kept)
        self._times.clear()
        self._times.extend(kept_times)
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
        return ran
