"""Unsigned LEB128 VarInts, as the Elixir Chatter reference writes them (u64 values only)."""

from __future__ import annotations

from typing import TypeAlias

from wire.errors import LocalProtocolError, MalformedMessage

BytesLike: TypeAlias = bytes | bytearray | memoryview
"""What the gossip codec reads from (it never keeps a reference to the caller's buffer)."""

U64_LIMIT = 1 << 64
"""VarInts and sequence numbers are below this."""

MAX_VARINT_BYTES = 10
"""ceil(64 / 7): enough for any u64; longer VarInts are refused."""


def encode_varint(n: int) -> bytes:
    """Unsigned LEB128, as the reference writes it; only u64 values, since we read no more."""
    if not 0 <= n < U64_LIMIT:
        raise LocalProtocolError(f"VarInt out of range 0..2**64-1: {n}")
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode_varint(buf: BytesLike, offset: int = 0) -> tuple[int, int]:
    """Read one VarInt at ``offset``; return ``(value, offset after it)``.

    Bounded at 10 bytes and 2**64 so a hostile peer cannot make us build huge integers.
    """
    if offset < 0:
        raise ValueError("offset must not be negative")
    end = len(buf)
    if offset >= end:
        raise MalformedMessage("truncated VarInt")
    byte = buf[offset]
    if byte < 0x80:
        return byte, offset + 1
    value = byte & 0x7F
    shift = 7
    pos = offset + 1
    while True:
        if pos >= end:
            raise MalformedMessage("truncated VarInt")
        if pos - offset >= MAX_VARINT_BYTES:
            raise MalformedMessage("over-long VarInt (more than 10 bytes)")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    if value >= U64_LIMIT:
        raise MalformedMessage("VarInt value does not fit in 64 bits")
    return value, pos
