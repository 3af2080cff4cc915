"""The node's outgoing links by peer (:class:`~rpc.group.links.Link`), their tasks, and the
byte budget they share (:class:`~rpc.group.items.QueueBytes`, ``max_queued_bytes``).

Links to members are always made (the member list is bounded); links to other nodes (named
in received distribution lists) only while fewer than ``max_members`` links exist.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

from rpc.group.items import QueueBytes
from rpc.group.links import Link, LinkEvents
from rpc.group.options import GroupOptions, GroupStats
from rpc.tasks import TaskSet
from wire.gossip import NetID

__all__ = ["Links"]


class Links:
    """The node's links by peer, and the tasks that run them."""

    def __init__(
        self,
        events: LinkEvents,
        options: GroupOptions,
        stats: GroupStats,
        rng: random.Random,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._events = events
        self._options = options
        self._stats = stats
        self._rng = rng
        self._links: dict[NetID, Link] = {}
        # shared by every link, which make room for each other's frames when it is full
        self._bytes = QueueBytes(options.max_queued_bytes)
        self._tasks = TaskSet(loop)
        self._closing = False

    def get(self, netid: NetID, *, member: bool) -> Link | None:
        """The live link to ``netid``, started if needed; None when closing, or for a
        non-member (a name in a received distribution list) past ``max_members`` links."""
        link = self._links.get(netid)
        if link is not None and not link.dead:
            return link
        if self._closing:
            return None
        if not member and link is None and len(self._links) >= self._options.max_members:
            return None
        link = Link(netid, self._events, self._options, self._stats, self._rng, self._bytes)
        self._links[netid] = link
        self._tasks.spawn(self._run(link))
        return link

    @property
    def queued_bytes(self) -> int:
        """Bytes of frames every link holds, queued or kept (at most ``max_queued_bytes``)."""
        return self._bytes.held

    def __iter__(self) -> Iterator[Link]:
        return iter(tuple(self._links.values()))

    def __len__(self) -> int:
        return len(self._links)

    async def close(self, drain_timeout: float) -> None:
        """Flush every link (up to ``drain_timeout`` s together), then drop what is left."""
        self._closing = True
        for link in self:
            link.drain()
        if not await self._tasks.wait(drain_timeout):
            for link in self:
                link.abort()
            self._tasks.cancel_all()
            await self._tasks.wait()

    async def _run(self, link: Link) -> None:
        try:
            await link.run()
        finally:
            if self._links.get(link.netid) is link:
                del self._links[link.netid]
