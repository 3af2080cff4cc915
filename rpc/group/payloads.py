"""Group payloads: named types on the wire by tag, and the envelope that makes dedup possible.

A gossip names its payload's type by a tag, ``xxh32(name)`` (:func:`wire.gossip.payload_tag`),
so a receiver needs the name behind a tag to find its handler: :class:`PayloadTypes` keeps that
table and refuses two names with the same tag.

Forwarders replace the gossip's BroadcastID with their own, so the origin of a broadcast is
lost after one hop. The payload therefore carries it, in front of the value (encoded as the
rest of the framework does: :func:`rpc.payload.encode_value`, JSON via msgspec or raw bytes)::

    payload = 0x01 (envelope version) | origin NetID (6 bytes) | VarInt origin seq | value

Forwarders pass these bytes on unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rpc.payload import encode_value
from wire.errors import MalformedMessage
from wire.gossip import NetID, decode_varint, encode_varint, payload_tag

__all__ = [
    "ENVELOPE_VERSION",
    "Envelope",
    "PayloadType",
    "PayloadTypes",
    "TagCollision",
    "decode_envelope",
    "encode_envelope",
]

ENVELOPE_VERSION = 1
"""First payload byte; lets a later layout coexist with this one."""

_HEADER = bytes((ENVELOPE_VERSION,))


class TagCollision(ValueError):
    """Two payload type names hash to the same xxh32 tag; one of them must be renamed."""


@dataclass(frozen=True, slots=True)
class PayloadType:
    """A payload type: its name (the notification name) and its wire tag."""

    name: str
    tag: int

    @classmethod
    def named(cls, name: str) -> PayloadType:
        if not isinstance(name, str) or not name:
            raise ValueError("a payload type name is a non-empty string")
        return cls(name, payload_tag(name))


class PayloadTypes:
    """Names by tag and tags by name; thread-safe since registration may happen anywhere."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._by_tag: dict[int, PayloadType] = {}
        self._by_name: dict[str, PayloadType] = {}
        self._lock = threading.Lock()
        for name in names:
            self.register(name)

    def register(self, name: str) -> PayloadType:
        """Add ``name`` (idempotent); :class:`TagCollision` if another name has its tag."""
        known = self._by_name.get(name)
        if known is not None:
            return known
        ptype = PayloadType.named(name)
        with self._lock:
            other = self._by_tag.get(ptype.tag)
            if other is not None and other.name != name:
                raise TagCollision(
                    f"payload types {other.name!r} and {name!r} share tag {ptype.tag}"
                )
            self._by_tag[ptype.tag] = ptype
            self._by_name[name] = ptype
        return ptype

    def by_tag(self, tag: int) -> PayloadType | None:
        return self._by_tag.get(tag)

    def by_name(self, name: str) -> PayloadType | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._by_name)


@dataclass(frozen=True, slots=True)
class Envelope:
    """Who started a broadcast, its sequence number there, and the encoded value."""

    origin: NetID
    seq: int
    data: bytes


def encode_envelope(origin: NetID, seq: int, value: Any) -> bytes:
    """The payload bytes for ``value`` broadcast by ``origin`` as its ``seq``-th message."""
    return b"".join((_HEADER, origin.packed, encode_varint(seq), encode_value(value)))


def decode_envelope(payload: bytes) -> Envelope:
    """Split a payload; :class:`~wire.errors.MalformedMessage` if it is not our envelope."""
    if len(payload) < 8 or payload[0] != ENVELOPE_VERSION:
        raise MalformedMessage("payload is not a peerwire group envelope (version 1)")
    origin = NetID.from_packed(payload[1:7])
    seq, off = decode_varint(payload, 7)
    return Envelope(origin, seq, payload[off:])
