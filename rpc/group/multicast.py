"""Optional UDP multicast for a group node (off by default).

Each node joins one multicast group on one interface; every datagram is one whole gossip
frame (:func:`wire.gossip.decode_frame`). Several nodes on one host share the group port
through SO_REUSEADDR + SO_REUSEPORT, and each gets a copy of every datagram, its own ones
included (multicast loops back), so the node ignores gossip whose sender is itself.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MulticastConfig", "MulticastEndpoint", "open_multicast"]

log = logging.getLogger("peerwire.group.multicast")


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
