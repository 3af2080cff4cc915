"""SBS primitives read and written directly: Integer, and Bytes/String bodies.

Used by the Chatter envelope (:mod:`wire.chatter.envelope`) and by the Eventer's
registration splicer (``rpc.eventer``), which both parse fixed SBS records faster than
hat-sbs' generic serializer and validate what it does not.

SBS Integer: big-endian 7-bit groups, bit 7 set on the LAST byte, bit 6 of the first byte
is the two's-complement sign, minimal length. Readers accept at most
:data:`MAX_INTEGER_BYTES` bytes and values within int64 (hat-sbs' C decoder silently wraps
past int64); they raise :class:`IndexError` on truncated input, which the caller turns into
its own error, and :class:`~wire.errors.MalformedMessage` for the rest.
"""

from __future__ import annotations

from wire.errors import MalformedMessage

MAX_INTEGER_BYTES = 10
"""Longest SBS Integer accepted (70 bits covers int64)."""
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

ONE_BYTE = [bytes(((n & 0x7F) | 0x80,)) for n in range(-64, 64)]
"""The SBS Integer bytes of -64..63, at ``n + 64``."""
_GROUP = [bytes((g,)) for g in range(128)]
"""A 7-bit group that is not the last, as a byte."""
_LAST = [bytes((g | 0x80,)) for g in range(128)]
"""The last 7-bit group, as a byte (bit 7 set)."""


def encode_integer(n: int) -> bytes:
    """SBS Integer bytes of ``n`` (minimal length)."""
    if -64 <= n < 64:
        return ONE_BYTE[n + 64]
    # ids: 2, 3 and 4 groups without the loop, joined from cached bytes (a bytes object
    # built from a tuple costs more)
    if 0 < n < 0x2000:
        return _GROUP[n >> 7] + _LAST[n & 0x7F]
    if 0 < n < 0x100000:
        return _GROUP[n >> 14] + _GROUP[(n >> 7) & 0x7F] + _LAST[n & 0x7F]
    if 0 < n < 0x8000000:
        return (
            _GROUP[n >> 21] + _GROUP[(n >> 14) & 0x7F] + _GROUP[(n >> 7) & 0x7F] + _LAST[n & 0x7F]
        )
    groups = bytearray()
    while True:
        groups.append(n & 0x7F)
        n >>= 7
        if (n == 0 and not groups[-1] & 0x40) or (n == -1 and groups[-1] & 0x40):
            break
    groups[0] |= 0x80
    groups.reverse()
    return bytes(groups)


def read_integer(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    """Read an SBS Integer at ``pos``; return (value, next position).

    Raises IndexError on truncation, MalformedMessage past 10 bytes or beyond int64.
    """
    b = buf[pos]
    if b & 0x80:
        return (b & 0x7F) - 0x80 if b & 0x40 else b & 0x7F, pos + 1
    if not b & 0x40:  # non-negative of two or three bytes (message ids): no loop
        c = buf[pos + 1]
        if c & 0x80:
            return b << 7 | c & 0x7F, pos + 2
        d = buf[pos + 2]
        if d & 0x80:
            return b << 14 | c << 7 | d & 0x7F, pos + 3
    value = b & 0x7F
    if value & 0x40:
        value -= 0x80
    end = pos + MAX_INTEGER_BYTES
    pos += 1
    while True:
        if pos >= end:
            raise MalformedMessage("SBS Integer longer than 10 bytes")
        b = buf[pos]
        pos += 1
        value = (value << 7) | (b & 0x7F)
        if b & 0x80:
            if INT64_MIN <= value <= INT64_MAX:
                return value, pos
            raise MalformedMessage("SBS Integer beyond int64")


def read_bytes(buf: bytes | bytearray, pos: int, end: int) -> tuple[bytes, int]:
    """Read SBS Bytes (or a String's UTF-8) at ``pos`` that must end by ``end``; return
    (the bytes, next position)."""
    size, pos = read_integer(buf, pos)
    stop = pos + size
    if size < 0 or stop > end:
        raise MalformedMessage("SBS Bytes/String length runs past the message")
    data = buf[pos:stop]
    return (data if type(data) is bytes else bytes(data)), stop  # a bytes slice is a copy


def read_string(buf: bytes | bytearray, pos: int, end: int) -> tuple[str, int]:
    """Read an SBS String at ``pos`` that must end by ``end``; return (the text, next
    position). Raises UnicodeDecodeError for bytes that are not UTF-8."""
    size, pos = read_integer(buf, pos)
    stop = pos + size
    if size < 0 or stop > end:
        raise MalformedMessage("SBS Bytes/String length runs past the message")
    return buf[pos:stop].decode(), stop
