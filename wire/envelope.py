"""peerwire's request envelope: per-call metadata (trace context) in front of a payload.

Only peerwire peers that both agreed to it exchange enveloped payloads; once they did,
*every* request payload between them is enveloped (an empty one carries no metadata), so a
payload is never mistaken for an envelope. Layout::

    0x01  count:u8  { key_len:u8 key  value_len:u16be value }*count  payload

Keys and values are UTF-8 (keys at most 255 bytes, values at most 65535, at most 32
entries); whatever follows the last entry is the payload, untouched.
"""

from __future__ import annotations

from collections.abc import Mapping

from wire.errors import MalformedMessage

VERSION = 1
MAX_ENTRIES = 32
EMPTY = bytes((VERSION, 0))
"""The envelope of a payload with no metadata (prefix only)."""


def pack(payload: bytes, metadata: Mapping[str, str] | None) -> bytes:
    """``payload`` with ``metadata`` in front of it."""
    if not metadata:
        return EMPTY + payload
    if len(metadata) > MAX_ENTRIES:
        raise ValueError(f"at most {MAX_ENTRIES} metadata entries, got {len(metadata)}")
    out = bytearray((VERSION, len(metadata)))
    for key, value in metadata.items():
        k, v = key.encode(), value.encode()
        if not 0 < len(k) <= 0xFF or len(v) > 0xFFFF:
            raise ValueError(f"metadata entry {key!r} too long (or an empty key)")
        out.append(len(k))
        out += k
        out += len(v).to_bytes(2, "big")
        out += v
    out += payload
    return bytes(out)


def unpack(data: bytes) -> tuple[dict[str, str], bytes]:
    """(metadata, payload) of an enveloped payload; MalformedMessage if it is not one."""
    if len(data) < 2 or data[0] != VERSION:
        raise MalformedMessage("payload is not a peerwire envelope")
    count = data[1]
    if count == 0:
        return {}, data[2:]
    if count > MAX_ENTRIES:
        raise MalformedMessage(f"envelope with {count} metadata entries")
    metadata: dict[str, str] = {}
    pos = 2
    try:
        for _ in range(count):
            klen = data[pos]
            key = data[pos + 1 : pos + 1 + klen]
            pos += 1 + klen
            vlen = int.from_bytes(data[pos : pos + 2], "big")
            value = data[pos + 2 : pos + 2 + vlen]
            pos += 2 + vlen
            if len(key) != klen or len(value) != vlen or pos > len(data):
                raise MalformedMessage("truncated envelope")
            metadata[key.decode()] = value.decode()
    except (IndexError, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"bad envelope: {exc}") from None
    return metadata, data[pos:]
