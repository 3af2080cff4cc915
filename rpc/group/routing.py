"""Routing: a broadcast's frames down the distribution tree, around peers that cannot take them.

:class:`Router` plans chunks (:class:`~rpc.group.planner.Planner`), queues each chunk's
frame on the link to its head and, when the head is backed off, unreachable or its queue
full, hands the chunk to its next node (:func:`~rpc.group.planner.skip_head`). It encodes
the frames (our BroadcastID, the multicast we see, a few other members, the chunk's rest)
and answers the links' events (:class:`~rpc.group.links.LinkEvents`).

Our own broadcast offers every chunk to its head first and only then waits, for the heads
whose queues were full, all together and up to ``send_timeout`` in all: a member that
stops reading delays no other member's frame, and a notify at most ``send_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence

from rpc.group.links import Item, Link
from rpc.group.linkset import Links
from rpc.group.members import Members
from rpc.group.options import GroupOptions, GroupStats
from rpc.group.planner import Chunk, Planner, skip_head
from wire.errors import LocalProtocolError
from wire.gossip import BroadcastID, Gossip, GossipCodec, NetID

__all__ = ["Frame", "Router"]

Frame = tuple[int, bytes]
"""A frame to send: payload type tag and payload (our envelope)."""

log = logging.getLogger("peerwire.group")


class Router:
    """Sends frames for one node; owns its :class:`Links`. Implements ``LinkEvents``."""

    def __init__(
        self,
        netid: NetID,
        key: bytes,
        options: GroupOptions,
        stats: GroupStats,
        members: Members,
        rng: random.Random,
        seen: Callable[[], tuple[BroadcastID, ...]],
    ) -> None:
        self.netid = netid
        self.planner: Planner[NetID] = Planner(rng)
        self._options = options
        self._stats = stats
        self._members = members
        self._rng = rng
        self._seen = seen
        self._codec = GossipCodec(key, max_size=options.max_size, max_netids=options.max_netids)
        self._bid = 0
        self._closing = False
        self._room = asyncio.Event()  # set when any link's queue makes room or a link ends
        self.links = Links(self, options, stats, rng, asyncio.get_running_loop())

    async def send(self, targets: Sequence[NetID], frames: Sequence[Frame]) -> None:
        """Our own broadcast: queue every chunk at once where there is room, then wait for
        the full queues together, up to ``send_timeout`` in all; a chunk whose head still
        has no room then goes to its next node without waiting.

        ``frames`` (tag, payload) all go down one plan, in order on each link: links and
        forwarders keep order and forwarders split their list as received, so every node
        of the tree gets them in that order (a join, then the broadcast it must precede),
        unless a head is skipped between them."""
        full: list[tuple[Chunk[NetID], Link, Sequence[Frame]]] = []
        for chunk in self.planner.plan(targets, exclude=self.netid):
            self._offer(chunk, frames, full)
        if not full:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._options.send_timeout):
                while full:
                    self._room.clear()
                    waiting, full = full, []
                    for chunk, link, left in waiting:
                        if link.dead:  # given up while we waited: the chunk's next node
                            self._offer(self._skip(chunk, len(left)), left, full)
                        elif left := _queue(link, chunk.rest, left):
                            full.append((chunk, link, left))
                    if full:
                        await self._room.wait()
        for chunk, _, left in full:
            self._stats.overflows += len(left)
            self._offer(self._skip(chunk, len(left)), left)

    def forward(self, targets: Sequence[NetID], tag: int, payload: bytes) -> None:
        """A received distribution list: queue at once, never wait (we are in a read).

        The list is split as received, not shuffled again: the origin shuffled it, and two
        frames it sent down the same chunk then take the same paths (see :meth:`send`)."""
        frames = ((tag, payload),)
        for chunk in self.planner.plan(targets, exclude=self.netid, shuffle=False):
            self._offer(chunk, frames)

    def encode(
        self, tag: int, payload: bytes, rest: tuple[NetID, ...], head: NetID | None, others: bool
    ) -> bytes:
        """One gossip frame; with ``others``, a few random members (not ``head``) named.

        The members named and the multicast ``seen`` list are extras: a frame they would
        take over ``max_size`` goes without both. The sender of a payload left room for
        its own ``max_others`` and ``seen`` only, so a forwarder naming more members (or
        seeing more multicast) would otherwise drop a payload at the limit. Raises
        :class:`~wire.errors.LocalProtocolError` if it still exceeds ``max_size``.
        """
        self._bid += 1
        named: tuple[NetID, ...] = ()
        members = self._members.all
        k = min(self._options.max_others, len(members))
        if others and k:
            named = tuple(m for m in self._rng.sample(members, k) if m != head)
        current = BroadcastID(self.netid, self._bid)
        seen = self._seen()
        try:
            return self._codec.send(Gossip(current, seen, named, rest, tag, payload))
        except LocalProtocolError:
            if not (named or seen):
                raise
        return self._codec.send(Gossip(current, (), (), rest, tag, payload))

    async def close(self, drain_timeout: float) -> None:
        """Stop rerouting; flush the links (up to ``drain_timeout`` s) and close them."""
        self._closing = True
        await self.links.close(drain_timeout)

    # --- LinkEvents ------------------------------------------------------------------------

    def frame(self, item: Item, head: NetID, with_others: bool) -> bytes:
        return self.encode(item.tag, item.payload, item.rest, head, with_others)

    def reroute(self, failed: NetID, item: Item) -> None:
        self._offer(self._skip(Chunk(failed, item.rest)), ((item.tag, item.payload),))

    def room(self) -> None:
        self._room.set()

    def connected(self, netid: NetID) -> None:
        self._members.connected(netid)

    def drained(self, netid: NetID) -> None:
        self._members.reachable(netid)

    def unreachable(self, netid: NetID, *, stalled: bool = False) -> None:
        delay = self._members.failed(netid, stalled=stalled)
        log.debug("%s: %s unreachable, skipped for %.3f s", self.netid, netid, delay)

    # --- inside ----------------------------------------------------------------------------

    def _offer(
        self,
        chunk: Chunk[NetID] | None,
        frames: Sequence[Frame],
        full: list[tuple[Chunk[NetID], Link, Sequence[Frame]]] | None = None,
    ) -> None:
        """Queue ``frames`` in order for the chunk's head, or the first of its nodes that can
        take them now; with ``full``, a live head whose queue is full keeps the chunk and
        the frames it has not taken (added there to wait)."""
        if self._closing:
            return
        while chunk is not None:
            head = chunk.head
            if not self._members.is_down(head):
                link = self.links.get(head, member=self._members.knows(head))
                if link is not None:
                    frames = _queue(link, chunk.rest, frames)
                    if not frames:
                        return
                    if full is not None and not link.dead:
                        full.append((chunk, link, frames))
                        return
                if full is None or link is None:
                    self._stats.overflows += len(frames)
            chunk = self._skip(chunk, len(frames))

    def _skip(self, chunk: Chunk[NetID], frames: int = 1) -> Chunk[NetID] | None:
        """The chunk's next node takes over; stats count each of ``frames`` (broadcasts)."""
        self._stats.skipped += frames
        following = skip_head(chunk)
        if following is None:
            self._stats.dropped += frames
        else:
            self._stats.rerouted += frames
            log.debug("%s: %s skipped, chunk goes to %s", self.netid, chunk.head, following.head)
        return following


def _queue(link: Link, rest: tuple[NetID, ...], frames: Sequence[Frame]) -> Sequence[Frame]:
    """Offer ``frames`` to ``link`` in order; those it did not take, from the first refused."""
    for i, (tag, payload) in enumerate(frames):
        if not link.offer(Item(tag, payload, rest)):
            return frames[i:]
    return ()
