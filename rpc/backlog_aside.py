"""What a connection's backlog sets aside: what follows a kept request, and the parts of
running streams that wait for room in ``max_request_bytes``.

What follows a request that is kept itself (the parts and end of its stream, its
cancellation) is set aside by request, and goes back in right behind it when it is taken
(:meth:`SetAside.release`): its handler may take the last slot, and a request kept between
them, waiting for that slot, must not hold the parts that handler waits for, or the
cancellation that would free the slot (a peer without retry results could stall both
until a deadline or the connection's end). A message costs a look-up or two of its
request (the adapter's ``opens_request`` and ``follows_request``) when kept, none when not.
So are the parts of a running stream that find ``max_request_bytes`` taken (NoRoom), and
what follows them, set aside by stream until there is room again
(:meth:`SetAside.room_back` gives them back, to go first), rather than kept behind requests
that wait for a slot: the stream's handler may hold one, and a look over the backlog each
time room comes back would cost a peer one tiny part per look.

:class:`SetAside` holds the messages and their order alone; the backlog
(:class:`rpc.backlog.Backlog`, which owns one) counts their bytes and bounds them with its
own (:attr:`SetAside.count`), and puts what comes back among its messages. An entry goes
when its request is taken or room comes back; all of it at ``connection_lost``
(:meth:`SetAside.clear`, from the backlog's).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

Followers = list[tuple[Any, float]]
"""Messages set aside, with the loop times of their reads, in order."""


class RequestKinds(Protocol):
    """What :class:`SetAside` asks the protocol adapter (:class:`rpc.options.Adapter`) of a
    message the backlog keeps."""

    def opens_request(self, message: Any) -> Hashable | None: ...
    def follows_request(self, message: Any) -> Hashable | None: ...
    def is_part(self, message: Any) -> bool: ...


class SetAside:
    """One connection's messages set aside (see the module doc)."""

    __slots__ = ("_kinds", "by_request", "count", "room")

    def __init__(self, kinds: RequestKinds) -> None:
        self._kinds = kinds
        self.by_request: dict[Hashable, Followers | None] = {}
        """What follows the requests kept in the backlog, by request, in order: an entry
        per such request (:meth:`keep`), None until something follows it, gone when the
        request is taken (:meth:`release`); and the parts of the streams in :attr:`room`."""
        self.count = 0
        """The messages set aside: they count in the backlog's bound."""
        self.room: dict[Hashable, None] = {}
        """The running streams whose parts wait here for room in ``max_request_bytes``
        (:meth:`wait_room`), in order: whatever of theirs comes meanwhile, by any path,
        waits behind them (:meth:`waits_room`). The same dict for the connection's life
        (cleared, never replaced): the peer reads it once per read."""

    def keep(self, message: Any, read_at: float) -> bool:
        """True when ``message``, read at ``read_at``, is set aside behind its kept request
        (or behind the parts of its stream that wait for room, if it is a part or the
        end). Else False, for the backlog to keep it in order: if it opens a request,
        what follows that from now on is set aside behind it."""
        by_request = self.by_request
        kinds = self._kinds
        if by_request:
            key = kinds.follows_request(message)
            if key in by_request and (key not in self.room or kinds.is_part(message)):
                followers = by_request[key]
                if followers is None:
                    by_request[key] = [(message, read_at)]
                else:
                    followers.append((message, read_at))
                self.count += 1
                return True
        key = kinds.opens_request(message)
        if key is not None and key not in by_request:  # (a repeated id: the peer errs)
            by_request[key] = None
        return False

    def keeps(self, key: Hashable | None) -> bool:
        """True while request ``key`` is kept in the backlog, unrun: its parts wait behind it."""
        return key in self.by_request

    def release(self, message: Any) -> Followers | None:
        """``message`` is taken from the backlog: what was set aside behind it, if it opens
        a request, taken out too, to go right after it."""
        key = self._kinds.opens_request(message)
        followers = self.by_request.pop(key, None) if key is not None else None
        if followers:
            self.count -= len(followers)
        return followers

    def wait_room(self, message: Any, read_at: float) -> None:
        """Set aside a part of a running stream that found ``max_request_bytes`` taken
        (NoRoom); what follows it waits with it until :meth:`room_back`."""
        key = self._kinds.follows_request(message)
        followers = self.by_request.get(key)
        if followers is None:
            self.by_request[key] = [(message, read_at)]
        else:
            followers.append((message, read_at))
        self.room[key] = None
        self.count += 1

    def waits_room(self, message: Any) -> bool:
        """True when ``message`` is a part or the end of a stream whose parts are set aside
        for room: it must wait behind them (:meth:`wait_room` it). Not its cancellation,
        which frees what they wait for."""
        kinds = self._kinds
        if not self.room or not kinds.is_part(message):
            return False
        return kinds.follows_request(message) in self.room

    def room_back(self) -> Followers:
        """``max_request_bytes`` has room again: the parts set aside for it, taken out in
        order (once each), to go first."""
        by_request = self.by_request
        waited: Followers = []
        for key in self.room:
            waited += by_request.pop(key, None) or ()
        self.room.clear()
        self.count -= len(waited)
        return waited

    def read_before(self, before: float) -> None:
        """Count every message set aside as read at ``before`` at the latest (see
        :meth:`rpc.backlog.Backlog.read_before`)."""
        by_request = self.by_request
        for key, followers in by_request.items():
            if followers:
                by_request[key] = [
                    (message, min(read_at, before)) for message, read_at in followers
                ]

    def clear(self) -> None:
        """Drop everything (the connection is gone)."""
        self.by_request.clear()
        self.room.clear()
        self.count = 0
