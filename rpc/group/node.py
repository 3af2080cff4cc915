"""A group node: broadcasts notifications to every member over Chatter's gossip frame.

``node = await GroupNode.start("127.0.0.1", 0, key=b"...", peers=[...])`` listens on TCP;
``await node.notify(name, value)`` reaches every member through the distribution tree of
:mod:`rpc.group.planner`; each member calls the notification handler registered for
``name`` (``registry.handle_notification(name)``, as for any peerwire connection).

What we add to the reference's behaviour (see the README section "Group broadcast"):

- Streams are framed by start byte + VarInt length (:class:`wire.gossip.GossipCodec`) and
  every frame is bounded by ``max_size``.
- Duplicates are dispatched once: the payload carries the broadcast's origin and its
  sequence number (:mod:`rpc.group.payloads`), checked against a window per origin.
- A chunk head we cannot reach (refused, timed out, queue full, or marked down) is skipped
  and its chunk handed to its next node. Frames written shortly before a connection drops
  are sent again (duplicates are harmless, losses are not).
- One persistent outgoing connection per peer with a bounded queue, closed when idle;
  inbound connections are bounded in number and closed when silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rpc.group.multicast import MulticastConfig, MulticastEndpoint, open_multicast
from rpc.group.payloads import PayloadTypes, decode_envelope, encode_envelope
from rpc.group.planner import Chunk, Planner, skip_head
from rpc.payload import PayloadError
from rpc.registry import Registry, default_registry
from transports.stream import StreamProtocol, open_stream
from wire import DEFAULT_MAX_SIZE
from wire.errors import LocalProtocolError, MalformedMessage, ProtocolError
from wire.gossip import BroadcastID, Gossip, GossipCodec, NetID, decode_frame, payload_tag

__all__ = ["GroupNode", "GroupOptions", "GroupStats", "as_netid"]

log = logging.getLogger("peerwire.group")

RESERVED_PREFIX = "peerwire.group."
"""Names under this prefix are the group's own messages, never dispatched to handlers."""

JOIN = RESERVED_PREFIX + "join"
"""Broadcast by a learning node at start, so the members it knows learn of it."""

_HELLO_TAG = payload_tag(RESERVED_PREFIX + "hello")
"""Tag of the empty multicast announcements that carry our ``seen`` list."""

_MAX_SEEN = 16  # BroadcastIDs of others' multicast we report per gossip
_BATCH_ITEMS = 64  # frames joined into one write
_BATCH_BYTES = 1 << 20
_MAX_DROPS = 3  # unexpected closes in a row before a peer counts as failed


@dataclass(slots=True)
class GroupOptions:
    """Limits and timers of one node (all per node; queues per peer)."""

    max_size: int = DEFAULT_MAX_SIZE
    """Largest frame sent or accepted (codec limit), in bytes."""
    max_queue: int = 256
    """Frames waiting for one peer; past it that peer is skipped for the frame."""
    send_timeout: float = 5.0
    """How long ``notify`` waits for room in a peer's queue before skipping it."""
    connect_timeout: float = 2.0
    idle_timeout: float = 30.0
    """An outgoing connection unused this long is closed."""
    inbound_idle_timeout: float = 120.0
    """An inbound connection silent this long is closed (keep above peers' idle_timeout)."""
    retry_after: float = 5.0
    """A peer we failed to reach is skipped without trying for this long."""
    resend_window: float = 2.0
    """Frames written this recently are sent again if their connection drops."""
    dedup_window: int = 4096
    """Sequence numbers remembered per origin; older ones are taken for duplicates."""
    max_origins: int = 4096
    """Origins whose windows are kept (least recently heard from forgotten first)."""
    max_connections: int = 1024
    """Inbound connections at once; more are closed on arrival."""
    max_members: int = 4096
    """Members learned at most (``learn``); static peers always count."""
    forget_after: int = 3
    """A learned member failing this many times in a row is forgotten."""
    max_others: int = 4
    """Random members named in a gossip, so distant nodes learn of each other."""
    others_interval: float = 1.0
    """Name them on each connection at most this often (they cost bytes on every frame)."""
    max_handler_tasks: int = 1024
    """Coroutine handlers running at once; past it a notification is not dispatched."""
    learn: bool = False
    """Grow the member list from received gossip (peers are then only seeds)."""
    multicast: MulticastConfig | None = None
    """UDP multicast settings; None (the default) keeps the node on TCP only."""


@dataclass(slots=True)
class GroupStats:
    """Counters for tests, benchmarks and monitoring."""

    broadcasts: int = 0
    frames_sent: int = 0
    frames_received: int = 0
    multicast_sent: int = 0
    multicast_received: int = 0
    own_multicast_ignored: int = 0
    dispatched: int = 0
    duplicates: int = 0
    unhandled: int = 0
    skipped: int = 0
    """Chunk heads passed over (down, unreachable, or their queue full)."""
    rerouted: int = 0
    """... of which the chunk went on to its next node."""
    resent: int = 0
    dropped: int = 0
    """Frames given up: a chunk ran out of reachable nodes, or a frame was too large."""
    overflows: int = 0
    protocol_errors: int = 0
    malformed: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def as_netid(peer: NetID | str | tuple[str, int]) -> NetID:
    """A NetID from a NetID, ``"host:port"`` or ``(host, port)`` (IPv4 only, as the frame)."""
    if isinstance(peer, NetID):
        return peer
    if isinstance(peer, str):
        host, sep, port = peer.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"not host:port: {peer!r}")
        return NetID(host, int(port))
    host, port = peer
    return NetID(host, port)


class _Window:
    """Sequence numbers seen from one origin: the highest, and a bitmap of those below it."""

    __slots__ = ("bits", "hi")

    def __init__(self, seq: int) -> None:
        self.hi = seq
        self.bits = 1

    def add(self, seq: int, size: int) -> bool:
        """Record ``seq``; False if seen before or too old to tell."""
        if seq > self.hi:
            shift = seq - self.hi
            self.bits = ((self.bits << shift) | 1) & ((1 << size) - 1) if shift < size else 1
            self.hi = seq
            return True
        offset = self.hi - seq
        if offset >= size:
            return False
        bit = 1 << offset
        if self.bits & bit:
            return False
        self.bits |= bit
        return True


class _Dedup:
    """Bounded duplicate filter keyed by (origin, seq)."""

    def __init__(self, window: int, max_origins: int) -> None:
        self._window = window
        self._max = max_origins
        self._origins: OrderedDict[NetID, _Window] = OrderedDict()

    def first(self, origin: NetID, seq: int) -> bool:
        win = self._origins.get(origin)
        if win is None:
            self._origins[origin] = _Window(seq)
            if len(self._origins) > self._max:
                self._origins.popitem(last=False)
            return True
        self._origins.move_to_end(origin)
        return win.add(seq, self._window)


@dataclass(slots=True, eq=False)
class _Item:
    """A frame to build for one peer: our payload, and the rest of its chunk."""

    tag: int
    payload: bytes
    rest: tuple[NetID, ...]
    sent_at: float = 0.0
    resent: bool = False


class _OutSink:
    """Transport callbacks of an outgoing connection, handed to its link."""

    def __init__(self, link: _Link) -> None:
        self._link = link

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._link.transport = transport

    def data_received(self, data: bytes) -> None:
        pass  # members never answer on this direction; anything sent is ignored

    def connection_lost(self, exc: BaseException | None) -> None:
        self._link.lost(exc)

    def pause_writing(self) -> None:
        self._link.writable.clear()

    def resume_writing(self) -> None:
        self._link.writable.set()


class _Link:
    """One peer's persistent outgoing connection and the frames waiting for it."""

    def __init__(self, node: GroupNode, netid: NetID) -> None:
        self.node = node
        self.netid = netid
        self.pending: deque[_Item] = deque()
        self.recent: deque[_Item] = deque(maxlen=node.options.max_queue)
        self.wakeup = asyncio.Event()
        self.space = asyncio.Event()
        self.space.set()
        self.writable = asyncio.Event()
        self.writable.set()
        self.transport: asyncio.Transport | None = None
        self.dead = False
        self._closing = False  # the close is ours (idle, shutdown): nothing to resend
        self._drops = 0
        self._connected_at = 0.0
        self._others_due = 0.0
        self.task = asyncio.get_running_loop().create_task(self._run())

    def offer(self, item: _Item) -> bool:
        """Queue without waiting; False if the queue is full or the link has failed."""
        if self.dead or len(self.pending) >= self.node.options.max_queue:
            return False
        self.pending.append(item)
        self.wakeup.set()
        return True

    async def put(self, item: _Item, timeout: float) -> bool:
        """Queue, waiting up to ``timeout`` for room; False if there was none."""
        try:
            async with asyncio.timeout(timeout):
                while not self.dead and len(self.pending) >= self.node.options.max_queue:
                    self.space.clear()
                    await self.space.wait()
        except TimeoutError:
            return False
        return self.offer(item)

    @property
    def idle(self) -> bool:
        if self.pending:
            return False
        return self.transport is None or self.transport.get_write_buffer_size() == 0

    def lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self.writable.set()
        if self._closing or self.dead:
            return
        now = asyncio.get_running_loop().time()
        if now - self._connected_at > self.node.options.resend_window:
            self._drops = 0
        self._drops += 1
        node = self.node
        window = node.options.resend_window
        recent = [i for i in self.recent if now - i.sent_at <= window]
        self.recent.clear()
        again = [i for i in recent if not i.resent]
        lost_twice = [i for i in recent if i.resent and i not in again]  # _Item: eq=False
        for item in reversed(again):
            item.resent = True
            self.pending.appendleft(item)
        node.stats.resent += len(again)
        if again:
            log.info("%s: connection dropped (%s); sending %d frames again", self, exc, len(again))
        # Lost twice: this peer may be what fails, so the rest of the chunk gets them instead.
        for item in lost_twice:
            node._send_chunk(node._skip(Chunk(self.netid, item.rest)), item.tag, item.payload)
        self.wakeup.set()

    def close(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    def __str__(self) -> str:
        return f"link to {self.netid}"

    async def _run(self) -> None:
        node = self.node
        opts = node.options
        try:
            while True:
                if not self.pending:
                    self.wakeup.clear()
                    try:
                        async with asyncio.timeout(opts.idle_timeout):
                            await self.wakeup.wait()
                    except TimeoutError:
                        if not self.pending:
                            log.debug("%s idle: closing", self)
                            return
                    continue
                if self.transport is None or self.transport.is_closing():
                    if self._drops >= _MAX_DROPS or not await self._connect():
                        self._give_up()
                        return
                    continue
                if not self.writable.is_set():
                    await self.writable.wait()
                    continue
                self._write_batch()
                await asyncio.sleep(0)  # let other links and the reader run between batches
        finally:
            self.dead = True
            self.space.set()
            self.close()
            node._link_done(self)

    async def _connect(self) -> bool:
        node = self.node
        try:
            await open_stream(
                self.netid.host,
                self.netid.port,
                lambda: _OutSink(self),
                connect_timeout=node.options.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            log.info("%s: cannot connect: %s", self, exc or type(exc).__name__)
            return False
        self._connected_at = asyncio.get_running_loop().time()
        node._reachable(self.netid)
        return True

    def _write_batch(self) -> None:
        transport = self.transport
        assert transport is not None
        node = self.node
        frames: list[bytes] = []
        items: list[_Item] = []
        size = 0
        while self.pending and len(frames) < _BATCH_ITEMS and size < _BATCH_BYTES:
            item = self.pending.popleft()
            try:
                now = node._loop.time()
                with_others = now >= self._others_due
                if with_others:
                    self._others_due = now + node.options.others_interval
                frame = node._frame(item, self.netid, with_others)
            except LocalProtocolError as exc:
                log.warning("%s: frame not sent: %s", self, exc)
                node.stats.dropped += 1
                continue
            frames.append(frame)
            items.append(item)
            size += len(frame)
        self.space.set()
        if not frames:
            return
        transport.write(frames[0] if len(frames) == 1 else b"".join(frames))
        now = asyncio.get_running_loop().time()
        for item in items:
            item.sent_at = now
        self.recent.extend(items)
        node.stats.frames_sent += len(frames)

    def _give_up(self) -> None:
        """The peer is unreachable: mark it down and hand every frame to its chunk's next node."""
        self.dead = True
        node = self.node
        node._link_done(self)
        node._failed(self.netid)
        items = list(self.pending)
        self.pending.clear()
        self.space.set()
        for item in items:
            node._send_chunk(node._skip(Chunk(self.netid, item.rest)), item.tag, item.payload)


class _InSink:
    """One inbound connection: frames in, gossip out to the node; closed when silent."""

    def __init__(self, node: GroupNode) -> None:
        self._node = node
        self._codec = GossipCodec(node.key, max_size=node.options.max_size)
        self._transport: asyncio.Transport | None = None
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        node = self._node
        self._transport = transport
        if len(node._inbound) >= node.options.max_connections or node._closing:
            log.warning("too many inbound connections: closing one from %s", self.peername)
            transport.abort()
            return
        node._inbound.add(self)
        self._last = node._loop.time()
        self._arm(node.options.inbound_idle_timeout)

    @property
    def peername(self) -> Any:
        return self._transport.get_extra_info("peername") if self._transport else None

    def data_received(self, data: bytes) -> None:
        node = self._node
        self._last = node._loop.time()
        try:
            gossips = self._codec.receive_data(data)
        except ProtocolError as exc:
            log.warning("group protocol error from %s: %s", self.peername, exc)
            node.stats.protocol_errors += 1
            self.close()
            return
        for g in gossips:
            node.stats.frames_received += 1
            node._on_gossip(g, tcp=True)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._node._inbound.discard(self)
        self._transport = None

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _arm(self, delay: float) -> None:
        self._timer = self._node._loop.call_later(delay, self._check_idle)

    def _check_idle(self) -> None:
        timeout = self._node.options.inbound_idle_timeout
        silent = self._node._loop.time() - self._last
        if silent >= timeout:
            log.debug("inbound from %s silent for %.1f s: closing", self.peername, silent)
            self.close()
        else:
            self._arm(timeout - silent)


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
        self.planner: Planner[NetID] = Planner(self.rng)
        self.types = types if types is not None else PayloadTypes()
        self.stats = GroupStats()
        self._loop = asyncio.get_running_loop()
        self._codec = GossipCodec(self.key, max_size=self.options.max_size)
        self._members: dict[NetID, bool] = {}  # NetID -> static (never forgotten)
        self._member_list: tuple[NetID, ...] = ()
        self._down: dict[NetID, float] = {}
        self._failures: dict[NetID, int] = {}
        self._links: dict[NetID, _Link] = {}
        self._inbound: set[_InSink] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._dedup = _Dedup(self.options.dedup_window, self.options.max_origins)
        # Origin sequence numbers start at the clock (microseconds), so a restarted node is
        # not taken for a replay of its earlier life by members' duplicate filters.
        self._seq = time.time_ns() // 1000
        self._bid = 0
        self._server: asyncio.Server | None = None
        self._mcast: MulticastEndpoint | None = None
        self._mcast_seen: OrderedDict[NetID, int] = OrderedDict()
        self._seen: tuple[BroadcastID, ...] | None = ()  # None: rebuild from _mcast_seen
        self._sees_us: dict[NetID, float] = {}
        self._announcer: asyncio.Task[None] | None = None
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
        when listening on 0.0.0.0). With ``options.learn`` the peers are seeds: we broadcast
        a join to them and grow the member list from what we hear.
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
            node._server = await node._loop.create_server(
                lambda: StreamProtocol(lambda: _InSink(node)), sock=sock, backlog=1024
            )
            config = node.options.multicast
            if config is not None:
                node._mcast = await open_multicast(config, node._on_datagram)
                node._announcer = node._loop.create_task(node._announce(config))
            if node.options.learn and node._members:
                await node.notify(JOIN)
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
        if self._announcer is not None:
            self._announcer.cancel()
        if self._mcast is not None:
            self._mcast.close()
        deadline = self._loop.time() + drain_timeout
        while self._loop.time() < deadline and not all(
            link.idle for link in list(self._links.values())
        ):
            await asyncio.sleep(0.01)
        links = list(self._links.values())
        for link in links:
            link.close()
            link.task.cancel()
        for sink in list(self._inbound):
            sink.close()
        for task in list(self._tasks):
            task.cancel()
        pending = [link.task for link in links] + list(self._tasks)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def __aenter__(self) -> GroupNode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- membership ------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return self.netid.host, self.netid.port

    @property
    def members(self) -> tuple[NetID, ...]:
        """Every other member we know, sorted."""
        return tuple(sorted(self._members))

    @property
    def queued(self) -> dict[NetID, int]:
        """Frames waiting per peer (each at most ``max_queue``, plus frames being resent)."""
        return {netid: len(link.pending) for netid, link in self._links.items()}

    @property
    def multicast_peers(self) -> tuple[NetID, ...]:
        """Members that recently reported seeing our multicast (skipped over TCP but one)."""
        if self._mcast is None:
            return ()
        limit = self._loop.time() - self._mcast.config.seen_ttl
        return tuple(sorted(n for n, t in self._sees_us.items() if t >= limit))

    @property
    def connections(self) -> int:
        """Outgoing connections currently open."""
        return sum(1 for link in self._links.values() if link.transport is not None)

    def add_peer(self, peer: NetID | str | tuple[str, int]) -> NetID:
        """Add a static member (never forgotten)."""
        netid = as_netid(peer)
        if netid != self.netid:
            self._members[netid] = True
            self._member_list = tuple(self._members)
        return netid

    def remove_peer(self, peer: NetID | str | tuple[str, int]) -> None:
        netid = as_netid(peer)
        if self._members.pop(netid, None) is not None:
            self._member_list = tuple(self._members)

    def _learn(self, netid: NetID) -> None:
        if (
            netid in self._members
            or netid == self.netid
            or len(self._members) >= self.options.max_members
            or netid.port == 0
        ):
            return
        log.debug("%s learned of %s", self.netid, netid)
        self._members[netid] = False
        self._member_list = tuple(self._members)

    def _is_down(self, netid: NetID) -> bool:
        until = self._down.get(netid)
        if until is None:
            return False
        if until > self._loop.time():
            return True
        del self._down[netid]
        return False

    def _failed(self, netid: NetID) -> None:
        self._down[netid] = self._loop.time() + self.options.retry_after
        count = self._failures.get(netid, 0) + 1
        self._failures[netid] = count
        if count >= self.options.forget_after and self._members.get(netid) is False:
            log.info("%s: forgetting unreachable member %s", self.netid, netid)
            del self._members[netid]
            self._member_list = tuple(self._members)
            self._failures.pop(netid, None)

    def _reachable(self, netid: NetID) -> None:
        self._down.pop(netid, None)
        self._failures.pop(netid, None)

    # --- sending ---------------------------------------------------------------------------

    async def notify(self, name: str, value: Any = None) -> int:
        """Broadcast ``value`` to every member; returns the broadcast's sequence number.

        Waits (up to ``send_timeout`` per peer) for room in full queues, so a fast sender is
        slowed to the group's pace. The node does not dispatch its own broadcast.
        """
        if self._closing:
            raise RuntimeError("group node is closed")
        ptype = self.types.register(name)
        self._seq += 1
        seq = self._seq
        payload = encode_envelope(self.netid, seq, value)
        overhead = 64 + 8 * (len(self._member_list) + self.options.max_others + _MAX_SEEN)
        if len(payload) + overhead > self.options.max_size:
            raise PayloadError(
                f"broadcast of {len(payload)} bytes exceeds max_size {self.options.max_size}"
            )
        self._dedup.first(self.netid, seq)
        self.stats.broadcasts += 1
        targets = self._after_multicast(self._member_list, ptype.tag, payload)
        for chunk in self.planner.plan(targets, exclude=self.netid):
            await self._send_chunk_waiting(chunk, ptype.tag, payload)
        return seq

    def _after_multicast(
        self, targets: Sequence[NetID], tag: int, payload: bytes
    ) -> Sequence[NetID]:
        """Multicast first (if on); then drop the peers that see our multicast but one."""
        if self._mcast is None or not self._multicast(tag, payload):
            return targets
        now = self._loop.time()
        ttl = self._mcast.config.seen_ttl
        seeing = {t for t in targets if now - self._sees_us.get(t, -ttl - 1.0) <= ttl}
        if not seeing:
            return targets
        seeing.discard(self.rng.choice(sorted(seeing)))  # one goes back on the TCP list
        return [t for t in targets if t not in seeing]

    def _multicast(self, tag: int, payload: bytes) -> bool:
        assert self._mcast is not None
        try:
            frame = self._frame(_Item(tag, payload, ()), None, True)
        except LocalProtocolError:
            return False
        sent = self._mcast.send(frame)
        if sent:
            self.stats.multicast_sent += 1
        return sent

    async def _send_chunk_waiting(self, chunk: Chunk[NetID], tag: int, payload: bytes) -> None:
        next_chunk: Chunk[NetID] | None = chunk
        while next_chunk is not None:
            chunk = next_chunk
            if not self._is_down(chunk.head):
                link = self._link(chunk.head)
                if await link.put(_Item(tag, payload, chunk.rest), self.options.send_timeout):
                    return
                if not link.dead:
                    self.stats.overflows += 1
            next_chunk = self._skip(chunk)

    def _send_chunk(self, chunk: Chunk[NetID] | None, tag: int, payload: bytes) -> None:
        """Queue for the chunk's head, or the first of its nodes that can take it now."""
        if self._closing:
            return
        while chunk is not None:
            if not self._is_down(chunk.head):
                if self._link(chunk.head).offer(_Item(tag, payload, chunk.rest)):
                    return
                self.stats.overflows += 1
            chunk = self._skip(chunk)

    def _skip(self, chunk: Chunk[NetID]) -> Chunk[NetID] | None:
        self.stats.skipped += 1
        following = skip_head(chunk)
        if following is None:
            self.stats.dropped += 1
        else:
            self.stats.rerouted += 1
            log.debug("%s: %s skipped, chunk goes to %s", self.netid, chunk.head, following.head)
        return following

    def _link(self, netid: NetID) -> _Link:
        link = self._links.get(netid)
        if link is None or link.dead:
            link = self._links[netid] = _Link(self, netid)
        return link

    def _link_done(self, link: _Link) -> None:
        if self._links.get(link.netid) is link:
            del self._links[link.netid]

    def _frame(self, item: _Item, head: NetID | None, with_others: bool) -> bytes:
        """Encode one gossip: our BroadcastID, what we saw, a few others, the chunk's rest."""
        self._bid += 1
        others: tuple[NetID, ...] = ()
        members = self._member_list
        k = min(self.options.max_others, len(members))
        if with_others and k:
            others = tuple(m for m in self.rng.sample(members, k) if m != head)
        if self._seen is None:
            recent = list(self._mcast_seen.items())[-_MAX_SEEN:]
            self._seen = tuple(BroadcastID(o, s) for o, s in recent)
        gossip = Gossip(
            current=BroadcastID(self.netid, self._bid),
            seen=self._seen,
            others=others,
            distribution=item.rest,
            tag=item.tag,
            payload=item.payload,
        )
        return self._codec.send(gossip)

    async def _announce(self, config: MulticastConfig) -> None:
        """Tell the multicast group, now and then, whose multicast we see."""
        while True:
            if self._mcast is not None:
                self._multicast(_HELLO_TAG, b"")
            await asyncio.sleep(config.announce_interval)

    # --- receiving -------------------------------------------------------------------------

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            gossip = decode_frame(data, self.key, max_size=self.options.max_size)
        except ProtocolError as exc:
            self.stats.malformed += 1
            log.debug("bad multicast datagram from %s: %s", addr, exc)
            return
        self._on_gossip(gossip, tcp=False)

    def _on_gossip(self, g: Gossip, *, tcp: bool) -> None:
        sender = g.current.origin
        if not tcp:
            if sender == self.netid:
                self.stats.own_multicast_ignored += 1
                return
            self.stats.multicast_received += 1
            self._mcast_seen[sender] = g.current.seq
            self._mcast_seen.move_to_end(sender)
            self._seen = None
            if len(self._mcast_seen) > self.options.max_origins:
                self._mcast_seen.popitem(last=False)
        if sender != self.netid and any(b.origin == self.netid for b in g.seen):
            self._sees_us[sender] = self._loop.time()
            if len(self._sees_us) > self.options.max_members:
                self._sees_us.pop(next(iter(self._sees_us)))
        if self.options.learn:
            for netid in (sender, *g.others, *g.distribution):
                self._learn(netid)
        if g.tag == _HELLO_TAG:
            return
        try:
            envelope = decode_envelope(g.payload)
        except MalformedMessage as exc:
            self.stats.malformed += 1
            log.debug("gossip from %s dropped: %s", sender, exc)
            return
        if self.options.learn:
            self._learn(envelope.origin)
        first = self._dedup.first(envelope.origin, envelope.seq)
        if first:
            self._dispatch(g.tag, envelope.data)
        else:
            self.stats.duplicates += 1
        if not tcp:
            return  # multicast gossip is never forwarded
        # Forward even a duplicate's list: it comes from a sender that skipped a failed node,
        # and the lists shrink at every hop, so this ends.
        targets: Sequence[NetID] = g.distribution
        if first and self._mcast is not None:
            targets = self._after_multicast(targets, g.tag, g.payload)
        if targets:
            for chunk in self.planner.plan(targets, exclude=self.netid):
                self._send_chunk(chunk, g.tag, g.payload)

    def _dispatch(self, tag: int, data: bytes) -> None:
        ptype = self.types.by_tag(tag)
        if ptype is None:
            self._index_handlers()
            ptype = self.types.by_tag(tag)
        handler = None
        if ptype is not None and not ptype.name.startswith(RESERVED_PREFIX):
            handler = self.registry.get_notification(ptype.name)
        if handler is None:
            if ptype is None or not ptype.name.startswith(RESERVED_PREFIX):
                self.stats.unhandled += 1
            return
        try:
            value = handler.decode(data)
        except PayloadError as exc:
            log.warning("broadcast %r: %s", handler.name, exc)
            self.stats.malformed += 1
            return
        self.stats.dispatched += 1
        try:
            result = handler.fn(value)
        except Exception:
            log.exception("notification handler %r failed", handler.name)
            return
        if inspect.isawaitable(result):
            self._spawn(handler.name, result)

    def _index_handlers(self) -> None:
        for name in self.registry.notification_names():
            try:
                self.types.register(name)
            except ValueError as exc:
                log.warning("notification %r cannot be received: %s", name, exc)

    def _spawn(self, name: str, awaitable: Awaitable[Any]) -> None:
        if len(self._tasks) >= self.options.max_handler_tasks:
            log.warning("handler %r not run: %d handlers already running", name, len(self._tasks))
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            return
        task = self._loop.create_task(_run_handler(name, awaitable))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _run_handler(name: str, awaitable: Awaitable[Any]) -> None:
    try:
        await awaitable
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("notification handler %r failed", name)
