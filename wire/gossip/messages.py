"""Gossip message types: :class:`NetID`, :class:`BroadcastID`, :class:`Gossip`."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

import xxhash

from wire.gossip.varint import U64_LIMIT, BytesLike

U32_LIMIT = 1 << 32
"""Payload tags (xxh32 values) are below this."""


@dataclass(frozen=True, slots=True)
class NetID:
    """A node's IPv4 address and port; orders by (a, b, c, d, port) like the wire table."""

    host: str
    port: int
    _packed: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.host, str):
            raise TypeError(f"host must be a dotted IPv4 string, not {type(self.host).__name__}")
        try:
            address = ipaddress.IPv4Address(self.host)
        except ipaddress.AddressValueError as exc:
            raise ValueError(f"not an IPv4 address: {self.host!r}") from exc
        if not isinstance(self.port, int) or not 0 <= self.port <= 0xFFFF:
            raise ValueError(f"port out of range 0..65535: {self.port!r}")
        object.__setattr__(self, "host", str(address))
        object.__setattr__(self, "_packed", address.packed + self.port.to_bytes(2, "big"))

    @classmethod
    def from_packed(cls, data: BytesLike) -> NetID:
        """Build from the 6 wire bytes; skips re-parsing the host since 4 bytes are always valid."""
        if len(data) != 6:
            raise ValueError("a packed NetID is exactly 6 bytes")
        return trusted_netid(bytes(data))

    @property
    def packed(self) -> bytes:
        """The 6 wire bytes: IPv4 address, then big-endian port."""
        return self._packed

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, NetID):
            return NotImplemented
        return self._packed < other._packed

    def __le__(self, other: object) -> bool:
        if not isinstance(other, NetID):
            return NotImplemented
        return self._packed <= other._packed

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, NetID):
            return NotImplemented
        return self._packed > other._packed

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, NetID):
            return NotImplemented
        return self._packed >= other._packed


@dataclass(frozen=True, slots=True)
class BroadcastID:
    """Who sent a gossip and its per-sender sequence number (bumped per broadcast)."""

    origin: NetID
    seq: int

    def __post_init__(self) -> None:
        if not isinstance(self.origin, NetID):
            raise TypeError("origin must be a NetID")
        if not isinstance(self.seq, int) or not 0 <= self.seq < U64_LIMIT:
            raise ValueError(f"seq out of range 0..2**64-1: {self.seq!r}")


def _packed_key(netid: NetID) -> bytes:
    return netid.packed


def _netids(values: Iterable[NetID], name: str) -> tuple[NetID, ...]:
    result = tuple(values)
    for value in result:
        if not isinstance(value, NetID):
            raise TypeError(f"{name} must hold NetID values, got {type(value).__name__}")
    return result


def _distinct(values: tuple[NetID, ...], name: str) -> tuple[NetID, ...]:
    # Decoders refuse a repeated NetID (it only costs the receiver work), so never send one.
    if len(set(values)) != len(values):
        raise ValueError(f"{name} repeats a NetID")
    return values


@dataclass(frozen=True, slots=True)
class Gossip:
    """One message: the broadcast metadata the distribution tree needs, plus the user payload.

    ``seen``: BroadcastIDs the sender saw over multicast; ``others``: a few random nodes, so
    distant groups learn of each other; ``distribution``: who the receiver must forward to
    (``others`` and ``distribution`` must not repeat a NetID: ValueError).
    ``tag`` is :func:`payload_tag` of the payload's type name.

    ``table`` is the wire's NetID table, always sorted and de-duplicated: every NetID the
    fields above reference, plus any given here. It exists because reference payloads refer
    to NetIDs by table index too (a ``broadcast_id`` payload is ``VarInt index, VarInt seq``):
    pass such NetIDs in ``table`` and write the payload with :meth:`ref`, or resolve a decoded
    payload's indices with ``g.table[i]``. Sequences become tuples.
    """

    current: BroadcastID
    seen: tuple[BroadcastID, ...] = ()
    others: tuple[NetID, ...] = ()
    distribution: tuple[NetID, ...] = ()
    tag: int = 0
    payload: bytes = b""
    table: tuple[NetID, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.current, BroadcastID):
            raise TypeError("current must be a BroadcastID")
        seen = tuple(self.seen)
        for value in seen:
            if not isinstance(value, BroadcastID):
                raise TypeError(f"seen must hold BroadcastID values, got {type(value).__name__}")
        others = _distinct(_netids(self.others, "others"), "others")
        distribution = _distinct(_netids(self.distribution, "distribution"), "distribution")
        extra = _netids(self.table, "table")
        if not isinstance(self.tag, int) or not 0 <= self.tag < U32_LIMIT:
            raise ValueError(f"tag out of range 0..2**32-1 (an xxh32 value): {self.tag!r}")
        if not isinstance(self.payload, bytes):
            if not isinstance(self.payload, bytearray | memoryview):
                raise TypeError("payload must be bytes")
            object.__setattr__(self, "payload", bytes(self.payload))
        table = tuple(
            sorted(
                {self.current.origin, *(b.origin for b in seen), *others, *distribution, *extra},
                key=_packed_key,
            )
        )
        object.__setattr__(self, "seen", seen)
        object.__setattr__(self, "others", others)
        object.__setattr__(self, "distribution", distribution)
        object.__setattr__(self, "table", table)

    def ref(self, netid: NetID) -> int:
        """Table index of ``netid``, for payloads that refer to NetIDs (ValueError if absent)."""
        return self.table.index(netid)


def payload_tag(type_name: str) -> int:
    """The wire tag of a payload type: xxh32 of its UTF-8 name, seed 0 ("hello" -> 4211111929)."""
    return xxhash.xxh32_intdigest(type_name.encode("utf-8"), seed=0)


# Decoding is the hot path, and its own checks (table sorted, indices in range, VarInt bounds)
# already guarantee what the constructors would re-check: it builds its results without them.
_set = object.__setattr__


def trusted_netid(packed: bytes) -> NetID:
    """A NetID from 6 wire bytes, without the constructor's checks (any 6 bytes are valid)."""
    netid = object.__new__(NetID)
    _set(netid, "host", f"{packed[0]}.{packed[1]}.{packed[2]}.{packed[3]}")
    _set(netid, "port", (packed[4] << 8) | packed[5])
    _set(netid, "_packed", packed)
    return netid


def trusted_bid(origin: NetID, seq: int) -> BroadcastID:
    """A BroadcastID whose seq the caller has already bounded (decode_varint: below 2**64)."""
    bid = object.__new__(BroadcastID)
    _set(bid, "origin", origin)
    _set(bid, "seq", seq)
    return bid
