"""Routing: a broadcast's frames down the distribution tree, around peers that cannot take them.

:class:`Router` plans chunks (:class:`~rpc.group.planner.Planner`), queues each chunk's
frame on the link to its head and, when the head is backed off, unreachable or its queue
full, hands the chunk to its next node (:func:`~rpc.group.planner.skip_head`). It encodes
the frames (our BroadcastID, the multicast we see, a few other members, the chunk's rest)
and answers the links' events (:class:`~rpc.group.links.LinkEvents`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence

from rpc.group.links import Item, Links
from rpc.group.members import Members
from rpc.group.options import GroupOptions, GroupStats
from rpc.group.planner import Chunk, Planner, skip_head
from wire.gossip import BroadcastID, Gossip, GossipCodec, NetID

__all__ = ["Router"]

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
        self.links = Links(self, options, stats, rng, asyncio.get_running_loop())

    async def send(self, targets: Sequence[NetID], tag: int, payload: bytes) -> None:
        """Our own broadcast: wait up to ``send_timeout`` per chunk head for queue room."""
        for chunk in self.planner.plan(targets, exclude=self.netid):
            next_chunk: Chunk[NetID] | None = chunk
            while next_chunk is not None:
                head = next_chunk.head
                if not self._members.is_down(head):
                    link = self.links.get(head, member=self._members.knows(head))
                    item = Item(tag, payload, next_chunk.rest)
                    if link is not None and await link.put(item, self._options.send_timeout):
                        break
                    if link is None or not link.dead:
                        self._stats.overflows += 1
                next_chunk = self._skip(next_chunk)

    def forward(self, targets: Sequence[NetID], tag: int, payload: bytes) -> None:
        """A received distribution list: queue at once, never wait (we are in a read)."""
        for chunk in self.planner.plan(targets, exclude=self.netid):
            self._offer(chunk, tag, payload)

    def encode(
        self, tag: int, payload: bytes, rest: tuple[NetID, ...], head: NetID | None, others: bool
    ) -> bytes:
        """One gossip frame; with ``others``, a few random members (not ``head``) named.

        Raises :class:`~wire.errors.LocalProtocolError` if it would exceed ``max_size``.
        """
        self._bid += 1
        named: tuple[NetID, ...] = ()
        members = self._members.all
        k = min(self._options.max_others, len(members))
        if others and k:
            named = tuple(m for m in self._rng.sample(members, k) if m != head)
        gossip = Gossip(
            current=BroadcastID(self.netid, self._bid),
            seen=self._seen(),
            others=named,
            distribution=rest,
            tag=tag,
            payload=payload,
        )
        return self._codec.send(gossip)

    async def close(self, drain_timeout: float) -> None:
        """Stop rerouting; flush the links (up to ``drain_timeout`` s) and close them."""
        self._closing = True
        await self.links.close(drain_timeout)

    # --- LinkEvents ------------------------------------------------------------------------

    def frame(self, item: Item, head: NetID, with_others: bool) -> bytes:
        return self.encode(item.tag, item.payload, item.rest, head, with_others)

    def reroute(self, failed: NetID, item: Item) -> None:
        self._offer(self._skip(Chunk(failed, item.rest)), item.tag, item.payload)

    def connected(self, netid: NetID) -> None:
        self._members.reachable(netid)

    def unreachable(self, netid: NetID) -> None:
        delay = self._members.failed(netid)
        log.debug("%s: %s unreachable, skipped for %.3f s", self.netid, netid, delay)

    # --- inside ----------------------------------------------------------------------------

    def _offer(self, chunk: Chunk[NetID] | None, tag: int, payload: bytes) -> None:
        """Queue for the chunk's head, or the first of its nodes that can take it now."""
        if self._closing:
            return
        while chunk is not None:
            if not self._members.is_down(chunk.head):
                link = self.links.get(chunk.head, member=self._members.knows(chunk.head))
                if link is not None and link.offer(Item(tag, payload, chunk.rest)):
                    return
                self._stats.overflows += 1
            chunk = self._skip(chunk)

    def _skip(self, chunk: Chunk[NetID]) -> Chunk[NetID] | None:
        self._stats.skipped += 1
        following = skip_head(chunk)
        if following is None:
            self._stats.dropped += 1
        else:
            self._stats.rerouted += 1
            log.debug("%s: %s skipped, chunk goes to %s", self.netid, chunk.head, following.head)
        return following
