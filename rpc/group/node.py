"""A group node: broadcasts notifications to every member over Chatter's gossip frame.

``node = await GroupNode.start("127.0.0.1", 0, key=b"...", peers=[...])`` listens on TCP;
``await node.notify(name, value)`` reaches every member through the distribution tree of
:mod:`rpc.group.planner`; each member calls the notification handler registered for
``name`` (``registry.handle_notification(name)``, as for any peerwire connection).

The node composes parts that each do one job: :class:`~rpc.group.members.Members` (who is
in the group, who is backed off), :class:`~rpc.group.routing.Router` and its
:class:`~rpc.group.linkset.Links` (frames out), :class:`~rpc.group.inbound.Inbound` (frames
in), :class:`~rpc.group.dedup.Dedup` (each broadcast dispatched once),
:class:`~rpc.group.dispatch.Dispatcher` (handlers) and, when multicast is on,
:class:`~rpc.group.multicast.Sightings`. Every limit is a field of
:class:`~rpc.group.options.GroupOptions`; :meth:`GroupNode.footprint` shows what is held.

What we add to the reference's behaviour (see the README section "Group broadcast"):
framing by start byte + VarInt length bounded by ``max_size``; duplicates dispatched once
(the payload carries origin and sequence number, :mod:`rpc.group.payloads`); chunk heads
that cannot be reached skipped for the chunk's next node, frames written just before a drop
sent again; bounded queues, connections and timers; a payload that cannot be decoded is
dropped (rate-limited warning) and its connection kept; back-off with full jitter for
failing peers, and a join sent down the tree of the first broadcast (at start with peers,
alone too), and again with the next broadcast after a member was added or learned, so a
restarted node is used again at once and heard even if its clock went back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Iterable, Sequence
from typing import Any

from rpc.group.dedup import Dedup
from rpc.group.dispatch import JOIN, RESERVED_PREFIX, Dispatcher
from rpc.group.inbound import Inbound
from rpc.group.members import Members
from rpc.group.multicast import MulticastConfig, MulticastEndpoint, Sightings, open_multicast
from rpc.group.options import Footprint, GroupOptions, GroupStats, as_netid
from rpc.group.payloads import PayloadTypes, decode_envelope, encode_envelope
from rpc.group.routing import Frame, Router
from rpc.logs import violations
from rpc.payload import PayloadError
from rpc.registry import Registry, default_registry
from rpc.tasks import TaskSet
from transports.stream import start_stream_server
from wire.errors import LocalProtocolError, MalformedMessage, ProtocolError
from wire.gossip import BroadcastID, Gossip, NetID, decode_frame, payload_tag
from wire.gossip.frame import payload_fits

__all__ = ["GroupNode", "GroupOptions", "GroupStats", "as_netid"]

log = logging.getLogger("peerwire.group")

_HELLO = RESERVED_PREFIX + "hello"
_HELLO_TAG = payload_tag(_HELLO)
"""Tag of the empty multicast announcements that carry our ``seen`` list."""
_JOIN_TAG = payload_tag(JOIN)


class GroupNode:
    """A member of a broadcast group; create with :meth:`start`, end with :meth:`close`."""

    def __init__(
        self,
        netid: NetID,
        key: bytes,
        *,
        registry: Registry | None = None,
        options: GroupOptions | None = None,
        rng: random.Random | None = None,
        types: PayloadTypes | None = None,
    ) -> None:
        self.netid = netid
        self.key = bytes(key)
        self.registry = registry if registry is not None else default_registry
        self.options = options or GroupOptions()
        self.rng = rng if rng is not None else random.Random()
        self.types = types if types is not None else PayloadTypes()
        for reserved in (JOIN, _HELLO):
            self.types.register(reserved)
        self.stats = GroupStats()
        opts = self.options
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._members = Members(netid, opts, self.rng, loop.time)
        mcast = opts.multicast
        self._sightings: Sightings | None = None
        if mcast is not None:
            self._sightings = Sightings(
                netid, mcast.seen_ttl, opts.max_origins, opts.max_members, loop.time
            )
        self._router = Router(
            netid, self.key, opts, self.stats, self._members, self.rng, self._seen
        )
        self.planner = self._router.planner
        self._inbound = Inbound(self.key, opts, self.stats, self._on_tcp_gossip)
        self._dedup = Dedup(opts.dedup_window, opts.max_origins)
        self._dispatcher = Dispatcher(
            self.registry, self.types, self.stats, opts.max_handler_tasks, loop
        )
        self._tasks = TaskSet(loop)
        # Origin sequence numbers start at the clock (microseconds), so a restarted node is
        # not taken for a replay of its earlier life by members' duplicate filters.
        self._seq = time.time_ns() // 1000
        # Our join resets members' windows for us (a clock set back): it goes to every
        # member with our first broadcast, and again with the next one after a member was
        # added or learned (a flag, not a list: the join goes to every member anyway).
        self._joined = False
        self._rejoin = False
        self._server: asyncio.Server | None = None
        self._mcast: MulticastEndpoint | None = None
        self._closing = False

    # --- life cycle ------------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        host: str,
        port: int,
        *,
        key: bytes,
        peers: Iterable[NetID | str | tuple[str, int]] = (),
        registry: Registry | None = None,
        options: GroupOptions | None = None,
        rng: random.Random | None = None,
        types: PayloadTypes | None = None,
        advertise: str | None = None,
    ) -> GroupNode:
        """Listen on ``host:port`` (0: any free port) and join the group of ``peers``.

        ``advertise`` is the IPv4 address members reach us at (default ``host``; required
        when listening on 0.0.0.0). With peers, the node broadcasts a join now, so members
        that learn (``options.learn``) add us and all use us again at once; its first
        broadcast takes a join too, down the same tree, so every member it reaches takes
        our numbers as new even with our clock set back after a restart.
        """
        public = advertise or host
        if public == "0.0.0.0":
            raise ValueError("listening on 0.0.0.0: pass advertise=<our IPv4 address>")
        NetID(public, 0)  # validates the address before we bind anything
        # Bind first: the node needs its port before the server may accept anything.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except BaseException:
            sock.close()
            raise
        node = cls(
            NetID(public, sock.getsockname()[1]),
            key,
            registry=registry,
            options=options,
            rng=rng,
            types=types,
        )
        try:
            for peer in peers:
                node.add_peer(peer)
            node._server = await start_stream_server(
                host, port, node._inbound.accept, sock=sock, backlog=1024
            )
            config = node.options.multicast
            if config is not None:
                node._mcast = await open_multicast(config, node._on_datagram)
                node._tasks.spawn(node._announce(config))
            await node._join()
        except BaseException:
            if node._server is None:
                sock.close()
            await node.close()
            raise
        return node

    async def close(self, *, drain_timeout: float = 1.0) -> None:
        """Stop: flush queued frames (up to ``drain_timeout`` s), then close everything."""
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        self._tasks.cancel_all()
        if self._mcast is not None:
            self._mcast.close()
        await self._router.close(drain_timeout)
        self._inbound.close()
        await self._dispatcher.close()
        await self._tasks.wait()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def __aenter__(self) -> GroupNode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- membership and state --------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return self.netid.host, self.netid.port

    @property
    def members(self) -> tuple[NetID, ...]:
        """Every other member we know, sorted."""
        return tuple(sorted(self._members.all))

    @property
    def queued(self) -> dict[NetID, int]:
        """Frames waiting per peer (each at most ``max_queue``, plus frames being resent)."""
        return {link.netid: link.queued for link in self._router.links}

    @property
    def multicast_peers(self) -> tuple[NetID, ...]:
        """Members that recently reported seeing our multicast (skipped over TCP but one)."""
        return () if self._sightings is None else self._sightings.reporters()

    @property
    def connections(self) -> int:
        """Outgoing connections currently open."""
        return sum(1 for link in self._router.links if link.connected)

    def footprint(self) -> Footprint:
        """What the node holds now (each figure bounded by an option; see :class:`Footprint`)."""
        links = tuple(self._router.links)
        return Footprint(
            inbound=len(self._inbound),
            inbound_buffered=self._inbound.buffered,
            links=len(links),
            queued=sum(link.queued for link in links),
            queued_bytes=self._router.links.queued_bytes,
            write_buffered=sum(link.write_buffered for link in links),
            handler_tasks=self._dispatcher.running,
            origins=len(self._dedup),
            backed_off=self._members.backed_off(),
        )

    def add_peer(self, peer: NetID | str | tuple[str, int]) -> NetID:
        """Add a static member (never forgotten); unless it was a member already, our join
        goes with our next broadcast, down its tree, to every member."""
        netid = as_netid(peer)
        if netid != self.netid and not self._members.knows(netid):
            self._rejoin = True
        self._members.add(netid)
        return netid

    def remove_peer(self, peer: NetID | str | tuple[str, int]) -> None:
        self._members.remove(as_netid(peer))

    # --- sending ---------------------------------------------------------------------------

    async def notify(self, name: str, value: Any = None) -> int:
        """Broadcast ``value`` to every member; returns the broadcast's sequence number.

        Queues at once for every member with room, then waits for the full queues together
        (up to ``send_timeout`` in all), so a fast sender is slowed to the group's pace but
        no member waits for another. The node does not dispatch its own broadcast. The first
        in this life, or the first after a member was added or learned, takes our join with
        it (see :meth:`_join_frame`).
        """
        if self._closing:
            raise RuntimeError("group node is closed")
        ptype = self.types.register(name)
        seq = self._next_seq()
        payload = encode_envelope(self.netid, seq, value)
        members = self._members.all
        overhead = 64 + 8 * (len(members) + self.options.max_others + 16)
        if not payload_fits(payload, overhead, self.options.max_size):
            raise PayloadError(
                f"broadcast of {len(payload)} bytes exceeds max_size {self.options.max_size}"
            )
        frames: tuple[Frame, ...] = ((ptype.tag, payload),)
        if ptype.tag != _JOIN_TAG:
            if (not self._joined or self._rejoin) and (members or self._sightings is not None):
                self._joined, self._rejoin = True, False
                frames = (self._join_frame(), *frames)  # one test per broadcast once joined
            self.stats.broadcasts += 1
        await self._send(members, frames)
        return seq

    async def _join(self) -> None:
        """Broadcast our join alone (at start, with peers), so learners add us and members
        use us again before we broadcast. It takes a tree of its own, which a broadcast
        may overtake, so our first broadcast still takes a join (see :meth:`_join_frame`)."""
        members = self._members.all
        if members:
            await self._send(members, (self._join_frame(),))

    def _join_frame(self) -> Frame:
        """Our join, for every member (with the first broadcast in this life, or the first
        after a member was added or learned since), made only when it goes to some (by TCP
        or multicast). Members then start a new duplicate window for us if our numbers are
        older than theirs (a clock set back), stop backing off from us, and learners add
        us. Not counted in ``stats.broadcasts``.

        A notify sends it with its broadcast down one tree (:meth:`Router.send`), so
        every member of that tree gets the join first, and both share ``send_timeout``.
        A join sent alone (at start) takes a tree of its own: a broadcast right after it
        may overtake it on another path, hence the join with the first broadcast too."""
        return _JOIN_TAG, encode_envelope(self.netid, self._next_seq(), None)

    def _next_seq(self) -> int:
        """Our next sequence number, recorded as seen (our broadcasts come back to us)."""
        self._seq += 1
        self._dedup.first(self.netid, self._seq)
        return self._seq

    async def _send(self, members: Sequence[NetID], frames: Sequence[Frame]) -> None:
        targets = self._after_multicast(members, frames)
        await self._router.send(targets, frames)

    def _seen(self) -> tuple[BroadcastID, ...]:
        return () if self._sightings is None else self._sightings.seen()

    def _after_multicast(
        self, targets: Sequence[NetID], frames: Sequence[Frame]
    ) -> Sequence[NetID]:
        """Multicast first (if on); then, if every frame went, drop the peers that see our
        multicast but one."""
        if self._sightings is None or not all([self._multicast(*f) for f in frames]):
            return targets
        seeing = self._sightings.seeing_us(targets)
        if not seeing:
            return targets
        seeing.discard(self.rng.choice(sorted(seeing)))  # one goes back on the TCP list
        return [t for t in targets if t not in seeing]

    def _multicast(self, tag: int, payload: bytes) -> bool:
        if self._mcast is None:
            return False
        try:
            frame = self._router.encode(tag, payload, (), None, True)
        except LocalProtocolError:
            return False
        sent = self._mcast.send(frame)
        if sent:
            self.stats.multicast_sent += 1
        return sent

    async def _announce(self, config: MulticastConfig) -> None:
        """Tell the multicast group, now and then, whose multicast we see."""
        while True:
            self._multicast(_HELLO_TAG, b"")
            await asyncio.sleep(config.announce_interval)  # a period, not a synchronisation

    # --- receiving -------------------------------------------------------------------------

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            opts = self.options
            gossip = decode_frame(
                data, self.key, max_size=opts.max_size, max_netids=opts.max_netids
            )
        except ProtocolError as exc:
            self.stats.malformed += 1
            log.debug("bad multicast datagram from %s: %s", addr, exc)
            return
        sender = gossip.current.origin
        if sender == self.netid:
            self.stats.own_multicast_ignored += 1
            return
        self.stats.multicast_received += 1
        if self._sightings is not None:
            self._sightings.received(sender, gossip.current.seq)
        self._on_gossip(gossip, tcp=False)

    def _on_tcp_gossip(self, gossip: Gossip) -> None:
        self._on_gossip(gossip, tcp=True)

    def _on_gossip(self, g: Gossip, *, tcp: bool) -> None:
        sender = g.current.origin
        if tcp:
            self._members.reachable(sender)  # it speaks: use it again (e.g. restarted)
        if self._sightings is not None:
            self._sightings.report(sender, g.seen)
        learn = self.options.learn
        if learn:
            for netid in (sender, *g.others, *g.distribution):
                self._learn(netid)
        if g.tag == _HELLO_TAG:
            return
        try:
            envelope = decode_envelope(g.payload)
        except MalformedMessage as exc:
            self.stats.malformed += 1
            violations.warning("group gossip from %s dropped: %s", sender, exc)
            return
        origin = envelope.origin
        if learn:
            self._learn(origin)
        first = self._dedup.first(origin, envelope.seq, restart=g.tag == _JOIN_TAG)
        if first:
            self._dispatcher.dispatch(g.tag, envelope.data)
        else:
            self.stats.duplicates += 1
        if not tcp:
            return  # multicast gossip is never forwarded
        # Forward even a duplicate's list: it comes from a sender that skipped a failed node,
        # and the lists shrink at every hop, so this ends.
        targets: Sequence[NetID] = g.distribution
        if first and g.tag == _JOIN_TAG:
            self._members.reachable(origin)
            if learn and sender == origin and not targets:
                # We are the joiner's seed: the whole group learns of it through our tree.
                targets = [m for m in self._members.all if m != origin]
        if first and self._sightings is not None:
            targets = self._after_multicast(targets, ((g.tag, g.payload),))
        if targets:
            self._router.forward(targets, g.tag, g.payload)

    def _learn(self, netid: NetID) -> None:
        """Add a learned member; a new one gets our join with our next broadcast (it may
        keep a window from our previous life, or back off from us)."""
        if self._members.learn(netid):
            self._rejoin = True
