"""Inbound connections: members' frames in, decoded gossip out to the node.

Members only ever write on a connection they opened, so an inbound connection is read-only:
nothing is written back and nothing is queued for it. Per connection the node holds the
codec's buffer of one incomplete frame (at most ``11 + max_size`` bytes) and one timer
(:class:`rpc.deadlines.Deadlines`) armed for the nearest of its deadlines:

- ``first_frame_timeout`` (default 10 s) after the connection opens, for its first frame;
- ``frame_timeout`` (10 s) after a frame starts, for its last byte (slowloris);
- ``inbound_idle_timeout`` (120 s) after the last whole frame, for the next one.

A framing error (bad start byte, length over ``max_size``, wrong key, checksum) closes the
connection: the stream cannot be trusted past it. At most ``max_connections`` (1024) are
open at once; more are refused on arrival, before any read. Violations are logged as one
rate-limited warning each (:data:`rpc.logs.violations`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

from rpc.deadlines import Deadlines
from rpc.group.options import GroupOptions, GroupStats
from rpc.logs import violations
from transports.read_buffer import SharedBufferProtocol
from wire.errors import ProtocolError
from wire.gossip import Gossip, GossipCodec

__all__ = ["Inbound", "InboundConnection"]

log = logging.getLogger("peerwire.group")


class InboundConnection(SharedBufferProtocol):
    """One member's connection to us: frames in, each decoded gossip to ``deliver``."""

    __slots__ = ("_codec", "_deadlines", "_inbound", "_loop", "_peer", "_transport")

    def __init__(self, inbound: Inbound, codec: GossipCodec) -> None:
        self._inbound = inbound
        self._codec = codec
        self._loop = asyncio.get_running_loop()
        self._deadlines = Deadlines(self._loop)
        self._transport: asyncio.Transport | None = None
        self._peer: Any = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame (at most ``11 + max_size``)."""
        return self._codec.buffered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's do not subclass asyncio.Transport, so no isinstance).
        self._transport = cast(asyncio.Transport, transport)
        self._peer = transport.get_extra_info("peername")
        timeout = self._inbound.options.first_frame_timeout
        self._deadlines.set("idle", self._loop.time() + timeout, self._idle)

    def data_received(self, data: bytes) -> None:
        inbound = self._inbound
        try:
            gossips = self._codec.receive_data(data)
        except ProtocolError as exc:
            violations.warning("group peer %s: %s; closing the connection", self._peer, exc)
            inbound.stats.protocol_errors += 1
            self.abort()
            return
        now = self._loop.time()
        options = inbound.options
        if gossips:
            self._deadlines.set("idle", now + options.inbound_idle_timeout, self._idle)
        if not self._codec.buffered:
            self._deadlines.clear("frame")
        elif gossips or self._deadlines.when("frame") is None:  # a new frame began
            self._deadlines.set("frame", now + options.frame_timeout, self._slow)
        for gossip in gossips:
            inbound.stats.frames_received += 1
            inbound.deliver(gossip)

    def eof_received(self) -> bool | None:
        if self._codec.buffered:
            log.debug("inbound from %s ended inside a frame", self._peer)
        return None  # close

    def connection_lost(self, exc: BaseException | None) -> None:
        self._deadlines.close()
        self._transport = None
        self._inbound.release(self)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _idle(self) -> None:
        log.debug("inbound from %s silent: closing", self._peer)
        self._inbound.stats.timeouts += 1
        self.abort()

    def _slow(self) -> None:
        violations.warning(
            "group peer %s: frame not complete within %.1f s; closing the connection",
            self._peer,
            self._inbound.options.frame_timeout,
        )
        self._inbound.stats.timeouts += 1
        self.abort()


class Inbound:
    """Admits inbound connections (at most ``max_connections``) and owns them until closed."""

    def __init__(
        self,
        key: bytes,
        options: GroupOptions,
        stats: GroupStats,
        deliver: Callable[[Gossip], None],
    ) -> None:
        self.options = options
        self.stats = stats
        self.deliver = deliver
        self._key = key
        self._connections: set[InboundConnection] = set()
        self._closing = False

    def accept(self) -> InboundConnection | None:
        """The server's protocol factory: a new connection, or None to refuse it."""
        if self._closing:
            return None
        if len(self._connections) >= self.options.max_connections:
            self.stats.refused += 1
            violations.warning(
                "group: %d inbound connections already: refusing one",
                len(self._connections),
            )
            return None
        options = self.options
        codec = GossipCodec(self._key, max_size=options.max_size, max_netids=options.max_netids)
        connection = InboundConnection(self, codec)
        self._connections.add(connection)
        return connection

    def release(self, connection: InboundConnection) -> None:
        self._connections.discard(connection)

    def __len__(self) -> int:
        return len(self._connections)

    @property
    def buffered(self) -> int:
        """Bytes held for incomplete frames over all connections."""
        return sum(c.buffered for c in self._connections)

    def close(self) -> None:
        """Refuse new connections and drop the open ones."""
        self._closing = True
        for connection in tuple(self._connections):
            connection.abort()
