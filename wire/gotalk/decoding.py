"""Gotalk v1 decoding: one parse function per type byte, in a 256-entry table.

Each parser takes ``(data, pos, end, max_size)`` over an immutable ``bytes`` and returns
either ``(message, end of message)`` or ``(None, index the message needs data to reach)``, so
the connection knows how much to buffer. Fields sit at fixed offsets; hex goes through
``binascii.unhexlify``, which rejects anything but ``[0-9a-fA-F]`` (unlike ``int(x, 16)``).
Errors are :class:`~wire.errors.MalformedMessage` / :class:`~wire.errors.MessageTooLarge`
with code :attr:`ErrorCode.INVALID_MESSAGE`.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import TypeAlias

from wire.errors import MalformedMessage, MessageTooLarge
from wire.gotalk.messages import (
    MAX_NAME_SIZE,
    U32_MAX,
    ErrorCode,
    ErrorResult,
    Fault,
    Heartbeat,
    Message,
    MessageType,
    Notification,
    Request,
    Result,
    RetryResult,
    StreamRequest,
    StreamRequestPart,
    StreamResult,
)

_unhexlify = binascii.unhexlify
_HexError = binascii.Error
_from_bytes = int.from_bytes
_CODES = tuple(ErrorCode)
_INVALID = ErrorCode.INVALID_MESSAGE

_ParseResult: TypeAlias = tuple[Message | None, int]
_Parser: TypeAlias = Callable[[bytes, int, int, int], _ParseResult]


def _hex_table() -> tuple[int, ...]:
    table = [0x10000] * 256  # non-hex: any 3-digit sum containing it exceeds MAX_NAME_SIZE
    for value, digit in enumerate(b"0123456789abcdef"):
        table[digit] = value
    for value, digit in enumerate(b"ABCDEF", 10):
        table[digit] = value
    return tuple(table)


_HEXVAL = _hex_table()
"""Digit value per byte, for the 3-digit name size (cheaper than unhexlify of b"0" + it)."""


def _bad_hex(what: str, raw: bytes) -> MalformedMessage:
    return MalformedMessage(f"non-hex {what} {raw!r}", code=_INVALID)


def _too_large(size: int, max_size: int) -> MessageTooLarge:
    return MessageTooLarge(f"payload of {size} bytes exceeds max_size {max_size}", code=_INVALID)


def _bad_utf8(raw: bytes) -> MalformedMessage:
    return MalformedMessage(f"name {raw!r} is not valid UTF-8", code=_INVALID)


def _named_parser(cls: type[Request] | type[StreamRequest] | None) -> _Parser:
    """Parser of ``r`` / ``s`` (type, 4-byte id, 3-hex name size, name, 8-hex payload size,
    payload) and, for ``cls=None``, of ``n`` (the same without the id)."""
    digits_at = 1 if cls is None else 5

    def parse_named(data: bytes, pos: int, end: int, max_size: int) -> _ParseResult:
        digits = pos + digits_at
        name_at = digits + 3
        if end < name_at:
            return None, name_at
        hexval = _HEXVAL
        name_size = (
            hexval[data[digits]] << 8 | hexval[data[digits + 1]] << 4 | hexval[data[digits + 2]]
        )
        if name_size > MAX_NAME_SIZE:
            raise _bad_hex("name size", data[digits:name_at])
        size_at = name_at + name_size
        head_end = size_at + 8
        if end < head_end:
            return None, head_end
        try:
            size = _from_bytes(_unhexlify(data[size_at:head_end]))
        except _HexError:
            raise _bad_hex("payload size", data[size_at:head_end]) from None
        if size > max_size:
            raise _too_large(size, max_size)
        stop = head_end + size
        if end < stop:
            return None, stop
        try:
            name = data[name_at:size_at].decode()
        except UnicodeDecodeError:
            raise _bad_utf8(data[name_at:size_at]) from None
        if cls is None:
            return Notification(name, data[head_end:stop]), stop
        return cls(data[pos + 1 : pos + 5], name, data[head_end:stop]), stop

    return parse_named


def _id_parser(
    cls: type[StreamRequestPart] | type[Result] | type[StreamResult] | type[ErrorResult],
) -> _Parser:
    def parse_with_id(data: bytes, pos: int, end: int, max_size: int) -> _ParseResult:
        head_end = pos + 13
        if end < head_end:
            return None, head_end
        try:
            size = _from_bytes(_unhexlify(data[pos + 5 : head_end]))
        except _HexError:
            raise _bad_hex("payload size", data[pos + 5 : head_end]) from None
        if size > max_size:
            raise _too_large(size, max_size)
        stop = head_end + size
        if end < stop:
            return None, stop
        return cls(data[pos + 1 : pos + 5], data[head_end:stop]), stop

    return parse_with_id


def _parse_retry(data: bytes, pos: int, end: int, max_size: int) -> _ParseResult:
    head_end = pos + 21
    if end < head_end:
        return None, head_end
    try:
        fields = _from_bytes(_unhexlify(data[pos + 5 : head_end]))
    except _HexError:
        raise _bad_hex("wait or payload size", data[pos + 5 : head_end]) from None
    size = fields & U32_MAX
    if size > max_size:
        raise _too_large(size, max_size)
    stop = head_end + size
    if end < stop:
        return None, stop
    return RetryResult(data[pos + 1 : pos + 5], fields >> 32, data[head_end:stop]), stop


def _parse_heartbeat(data: bytes, pos: int, end: int, max_size: int) -> _ParseResult:
    stop = pos + 13
    if end < stop:
        return None, stop
    try:
        fields = _from_bytes(_unhexlify(data[pos + 1 : stop]))
    except _HexError:
        raise _bad_hex("heartbeat", data[pos + 1 : stop]) from None
    return Heartbeat(fields >> 32, fields & U32_MAX), stop


def _parse_fault(data: bytes, pos: int, end: int, max_size: int) -> _ParseResult:
    stop = pos + 9
    if end < stop:
        return None, stop
    try:
        code = _from_bytes(_unhexlify(data[pos + 1 : stop]))
    except _HexError:
        raise _bad_hex("fault code", data[pos + 1 : stop]) from None
    if code < len(_CODES):  # a branch of its own: compiled, a join with int would unbox it
        return Fault(_CODES[code]), stop
    return Fault(code), stop


PARSERS: list[_Parser | None] = [None] * 256
PARSERS[ord(MessageType.REQUEST)] = _named_parser(Request)
PARSERS[ord(MessageType.STREAM_REQUEST)] = _named_parser(StreamRequest)
PARSERS[ord(MessageType.STREAM_REQUEST_PART)] = _id_parser(StreamRequestPart)
PARSERS[ord(MessageType.RESULT)] = _id_parser(Result)
PARSERS[ord(MessageType.STREAM_RESULT)] = _id_parser(StreamResult)
PARSERS[ord(MessageType.ERROR_RESULT)] = _id_parser(ErrorResult)
PARSERS[ord(MessageType.RETRY_RESULT)] = _parse_retry
PARSERS[ord(MessageType.NOTIFICATION)] = _named_parser(None)
PARSERS[ord(MessageType.HEARTBEAT)] = _parse_heartbeat
PARSERS[ord(MessageType.FAULT)] = _parse_fault


def unknown_type(byte: int) -> MalformedMessage:
    return MalformedMessage(f"unknown message type {bytes([byte])!r}", code=_INVALID)
