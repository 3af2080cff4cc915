"""Optional UDP multicast for a group node (off by default).

Each node joins one multicast group on one interface; every datagram is one whole gossip
frame (:func:`wire.gossip.decode_frame`). Several nodes on one host share the group port
through SO_REUSEADDR + SO_REUSEPORT, and each gets a copy of every datagram, its own ones
included (multicast loops back), so the node ignores gossip whose sender is itself.

:class:`Sightings` keeps who we see and who sees us, for the ``seen`` field of our gossip
and for dropping from the TCP list the members that get our multicast anyway.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from wire.gossip import BroadcastID, NetID

__all__ = ["MAX_SEEN", "MulticastConfig", "MulticastEndpoint", "Sightings", "open_multicast"]

log = logging.getLogger("peerwire.group.multicast")

MAX_SEEN = 16
"""BroadcastIDs of others' multicast we report per gossip."""


@dataclass(frozen=True, slots=True)
class MulticastConfig:
    """Where to multicast; defaults are the reference's (group 224.1.1.1, port 29999, TTL 4)."""

    group: str = "224.1.1.1"
    port: int = 29999
    ttl: int = 4
    interface: str = "0.0.0.0"
    """Local IPv4 address of the interface to join and send on ("0.0.0.0": the kernel picks)."""
    max_datagram: int = 8192
    """Larger frames are not multicast: the node sends them over TCP to everyone instead."""
    announce_interval: float = 5.0
    """Seconds between the small gossips that tell others whose multicast we see."""
    seen_ttl: float = 60.0
    """How long a peer's report of seeing our multicast lets us skip it over TCP."""

    def __post_init__(self) -> None:
        if not 0 < self.port <= 0xFFFF:
            raise ValueError(f"multicast port out of range: {self.port}")
        if not 0 <= self.ttl <= 255:
            raise ValueError(f"multicast TTL out of range: {self.ttl}")
        if not socket.inet_aton(self.group)[0] & 0xF0 == 0xE0:
            raise ValueError(f"not an IPv4 multicast group: {self.group}")
        if not 0 < self.max_datagram <= 65507:
            raise ValueError("max_datagram must be within 1..65507 (a UDP datagram)")


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, tuple[str, int]], None]) -> None:
        self._on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self._on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        log.warning("multicast socket error: %s", exc)


class MulticastEndpoint:
    """A joined multicast socket: :meth:`send` whole frames, received ones go to the callback."""

    def __init__(self, config: MulticastConfig, transport: asyncio.DatagramTransport) -> None:
        self.config = config
        self._transport = transport

    def send(self, frame: bytes) -> bool:
        """Multicast one frame; False (nothing sent) if it is larger than ``max_datagram``."""
        if len(frame) > self.config.max_datagram or self._transport.is_closing():
            return False
        self._transport.sendto(frame, (self.config.group, self.config.port))
        return True

    def close(self) -> None:
        self._transport.close()


def _socket(config: MulticastConfig) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("", config.port))
        iface = socket.inet_aton(config.interface)
        membership = socket.inet_aton(config.group) + iface
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, iface)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, config.ttl)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def open_multicast(
    config: MulticastConfig, on_datagram: Callable[[bytes, tuple[str, int]], None]
) -> MulticastEndpoint:
    """Join ``config.group`` and deliver every datagram to ``on_datagram(data, addr)``."""
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: _Protocol(on_datagram), sock=_socket(config)
    )
    return MulticastEndpoint(config, transport)


class Sightings:
    """Whose multicast we receive (the last ``max_origins`` senders, the latest
    :data:`MAX_SEEN` reported in our gossip) and which members report receiving ours
    (at most ``max_reporters``, each report valid ``seen_ttl`` s)."""

    def __init__(
        self,
        own: NetID,
        seen_ttl: float,
        max_origins: int,
        max_reporters: int,
        clock: Callable[[], float],
    ) -> None:
        self._own = own
        self._ttl = seen_ttl
        self._max_origins = max_origins
        self._max_reporters = max_reporters
        self._clock = clock
        self._received: OrderedDict[NetID, int] = OrderedDict()  # sender -> its latest seq
        self._seen: tuple[BroadcastID, ...] | None = ()  # None: rebuild from _received
        self._sees_us: dict[NetID, float] = {}  # member -> when it last reported us

    def received(self, sender: NetID, seq: int) -> None:
        """A multicast gossip from ``sender`` arrived."""
        self._received[sender] = seq
        self._received.move_to_end(sender)
        if len(self._received) > self._max_origins:
            self._received.popitem(last=False)
        self._seen = None

    def seen(self) -> tuple[BroadcastID, ...]:
        """What our gossip reports seeing: the latest multicast of up to 16 senders."""
        if self._seen is None:
            recent = list(self._received.items())[-MAX_SEEN:]
            self._seen = tuple(BroadcastID(o, s) for o, s in recent)
        return self._seen

    def report(self, sender: NetID, seen: Iterable[BroadcastID]) -> None:
        """``sender``'s gossip listed what it sees; note whether that includes us."""
        if sender == self._own or not any(b.origin == self._own for b in seen):
            return
        self._sees_us.pop(sender, None)
        self._sees_us[sender] = self._clock()
        if len(self._sees_us) > self._max_reporters:
            self._sees_us.pop(next(iter(self._sees_us)))

    def seeing_us(self, targets: Sequence[NetID]) -> set[NetID]:
        """The ``targets`` that recently reported receiving our multicast."""
        limit = self._clock() - self._ttl
        return {t for t in targets if self._sees_us.get(t, limit - 1.0) >= limit}

    def reporters(self) -> tuple[NetID, ...]:
        """Every member that recently reported receiving our multicast, sorted."""
        limit = self._clock() - self._ttl
        return tuple(sorted(n for n, t in self._sees_us.items() if t >= limit))
