"""Sans-I/O codec for Gotalk protocol version 1.

The wire (all numbers are ASCII hex; lowercase on send, either case on receive)::

    conversation = version ("01") message*
    r, s         = type id(4 bytes) text3(operation) size8 payload
    p, R, S, E   = type id(4 bytes) size8 payload
    e            = type id(4 bytes) wait8(ms) size8 payload
    n            = type text3(name) size8 payload
    h            = type load4 time8(unix seconds)          13 bytes, no payload
    f            = type code8                               9 bytes, no payload
    text3        = size3 + UTF-8 bytes (at most 4095)

Request ids are 4 opaque bytes (the Go client sends a binary little-endian counter,
gotalk.js base-36 ASCII), so they are kept as ``bytes`` and never interpreted.

:class:`GotalkConnection` holds only what framing needs (one partial message, the peer's
version and whether the connection is dead); correlating requests, results and streams is
the RPC core's job. It never performs I/O, reads a clock or starts a thread.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any, ClassVar, TypeAlias

from wire import DEFAULT_MAX_SIZE
from wire.errors import (
    LocalProtocolError,
    MalformedMessage,
    MessageTooLarge,
    ProtocolError,
    UnsupportedVersion,
)

__all__ = [
    "MAX_NAME_SIZE",
    "MAX_PAYLOAD_SIZE",
    "VERSION",
    "ErrorCode",
    "ErrorResult",
    "Fault",
    "GotalkConnection",
    "Heartbeat",
    "Message",
    "MessageType",
    "Notification",
    "Request",
    "Result",
    "RetryResult",
    "StreamRequest",
    "StreamRequestPart",
    "StreamResult",
    "encode",
    "encode_parts",
    "id_header",
    "request_header",
]

VERSION = b"01"
"""The only protocol version spoken (and accepted from peers)."""

MAX_NAME_SIZE = 0xFFF
"""Largest operation/notification name in UTF-8 bytes: its size is 3 hex digits."""

MAX_PAYLOAD_SIZE = 0xFFFFFFFF
"""Largest payload the size field can express (8 hex digits)."""

_U32 = 0xFFFFFFFF
_U16 = 0xFFFF


class ErrorCode(IntEnum):
    """Codes of the ``f`` message, also carried by every :class:`ProtocolError` raised here."""

    ABNORMAL = 0
    UNSUPPORTED_PROTOCOL = 1
    INVALID_MESSAGE = 2
    TIMEOUT = 3


class MessageType(StrEnum):
    """The type byte that starts each message (as text, for logs and dispatch tables)."""

    REQUEST = "r"
    STREAM_REQUEST = "s"
    STREAM_REQUEST_PART = "p"
    RESULT = "R"
    STREAM_RESULT = "S"
    ERROR_RESULT = "E"
    RETRY_RESULT = "e"
    NOTIFICATION = "n"
    HEARTBEAT = "h"
    FAULT = "f"


@dataclass(slots=True, frozen=True)
class Request:
    """``r``: a single-payload request; answered by R, S, E or e with the same id."""

    TYPE: ClassVar[MessageType] = MessageType.REQUEST
    id: bytes
    op: str
    payload: bytes


@dataclass(slots=True, frozen=True)
class StreamRequest:
    """``s``: first chunk of a streaming request; ``p`` parts follow, an empty one ends it."""

    TYPE: ClassVar[MessageType] = MessageType.STREAM_REQUEST
    id: bytes
    op: str
    payload: bytes


@dataclass(slots=True, frozen=True)
class StreamRequestPart:
    """``p``: a further chunk of a streaming request; an empty payload ends the stream."""

    TYPE: ClassVar[MessageType] = MessageType.STREAM_REQUEST_PART
    id: bytes
    payload: bytes


@dataclass(slots=True, frozen=True)
class Result:
    """``R``: the single-payload result of request ``id``."""

    TYPE: ClassVar[MessageType] = MessageType.RESULT
    id: bytes
    payload: bytes


@dataclass(slots=True, frozen=True)
class StreamResult:
    """``S``: one chunk of a streaming result; an empty payload ends the stream."""

    TYPE: ClassVar[MessageType] = MessageType.STREAM_RESULT
    id: bytes
    payload: bytes


@dataclass(slots=True, frozen=True)
class ErrorResult:
    """``E``: the request failed on the requestor's account (do not retry as is).

    Real peers put plain UTF-8 text in the payload, not JSON.
    """

    TYPE: ClassVar[MessageType] = MessageType.ERROR_RESULT
    id: bytes
    payload: bytes


@dataclass(slots=True, frozen=True)
class RetryResult:
    """``e``: the responder could not serve the request now; retry after ``wait`` ms.

    gotalk.js does not understand it (it answers ``f00000002``): never send it to a browser.
    """

    TYPE: ClassVar[MessageType] = MessageType.RETRY_RESULT
    id: bytes
    wait: int
    payload: bytes


@dataclass(slots=True, frozen=True)
class Notification:
    """``n``: a one-way message; never answered."""

    TYPE: ClassVar[MessageType] = MessageType.NOTIFICATION
    name: str
    payload: bytes


@dataclass(slots=True, frozen=True)
class Heartbeat:
    """``h``: keeps read deadlines from expiring; ``load`` 0..65535, ``time`` unix seconds."""

    TYPE: ClassVar[MessageType] = MessageType.HEARTBEAT
    load: int
    time: int


@dataclass(slots=True, frozen=True)
class Fault:
    """``f``: the wire's "ProtocolError" message, sent just before closing.

    Named Fault so it does not clash with the :class:`ProtocolError` exception. Known codes
    decode to :class:`ErrorCode`, others stay plain ints.
    """

    TYPE: ClassVar[MessageType] = MessageType.FAULT
    code: ErrorCode | int


Message: TypeAlias = (
    Request
    | StreamRequest
    | StreamRequestPart
    | Result
    | StreamResult
    | ErrorResult
    | RetryResult
    | Notification
    | Heartbeat
    | Fault
)

# --------------------------------------------------------------------------------------
# Encoding. Every encoder validates what the peer could not parse back, then formats the
# header with one bytes %-format (lowercase hex, like Go) and returns (header, payload).


def _check_id(message_id: bytes) -> None:
    if len(message_id) != 4:
        raise LocalProtocolError(f"request id must be 4 bytes, got {len(message_id)}")


def _check_size(payload: bytes) -> int:
    size = len(payload)
    if size > MAX_PAYLOAD_SIZE:
        raise LocalProtocolError(f"payload of {size} bytes does not fit 8 hex digits")
    return size


def _encode_name(name: str) -> bytes:
    try:
        raw = name.encode()
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"name {name!r} is not encodable as UTF-8") from exc
    if len(raw) > MAX_NAME_SIZE:
        raise LocalProtocolError(f"name of {len(raw)} UTF-8 bytes exceeds {MAX_NAME_SIZE}")
    return raw


def _check_u32(what: str, value: int) -> None:
    if not 0 <= value <= _U32:
        raise LocalProtocolError(f"{what} {value} does not fit an unsigned 32-bit field")


def _named_encoder(kind: MessageType) -> Callable[[Any], tuple[bytes, bytes]]:
    fmt = kind.encode() + b"%b%03x%b%08x"

    def encode_named(m: Request | StreamRequest) -> tuple[bytes, bytes]:
        message_id = m.id
        if len(message_id) != 4:
            _check_id(message_id)
        try:
            op = m.op.encode()
        except UnicodeEncodeError:
            op = _encode_name(m.op)  # raises LocalProtocolError
        name_size = len(op)
        if name_size > MAX_NAME_SIZE:
            _encode_name(m.op)  # raises LocalProtocolError
        payload = m.payload
        size = len(payload)
        if size > MAX_PAYLOAD_SIZE:
            _check_size(payload)
        return fmt % (message_id, name_size, op, size), payload

    return encode_named


def _id_encoder(kind: MessageType) -> Callable[[Any], tuple[bytes, bytes]]:
    fmt = kind.encode() + b"%b%08x"

    def encode_with_id(
        m: StreamRequestPart | Result | StreamResult | ErrorResult,
    ) -> tuple[bytes, bytes]:
        message_id = m.id
        if len(message_id) != 4:
            _check_id(message_id)
        payload = m.payload
        size = len(payload)
        if size > MAX_PAYLOAD_SIZE:
            _check_size(payload)
        return fmt % (message_id, size), payload

    return encode_with_id


def _encode_retry(m: RetryResult) -> tuple[bytes, bytes]:
    _check_id(m.id)
    _check_u32("wait", m.wait)
    payload = m.payload
    return b"e%b%08x%08x" % (m.id, m.wait, _check_size(payload)), payload


def _encode_notification(m: Notification) -> tuple[bytes, bytes]:
    name = _encode_name(m.name)
    payload = m.payload
    return b"n%03x%b%08x" % (len(name), name, _check_size(payload)), payload


def _encode_heartbeat(m: Heartbeat) -> tuple[bytes, bytes]:
    if not 0 <= m.load <= _U16:
        raise LocalProtocolError(f"heartbeat load {m.load} is outside 0..65535")
    _check_u32("heartbeat time", m.time)
    return b"h%04x%08x" % (m.load, m.time), b""


def _encode_fault(m: Fault) -> tuple[bytes, bytes]:
    _check_u32("fault code", m.code)
    return b"f%08x" % m.code, b""


_ENCODERS: dict[type, Callable[[Any], tuple[bytes, bytes]]] = {
    Request: _named_encoder(MessageType.REQUEST),
    StreamRequest: _named_encoder(MessageType.STREAM_REQUEST),
    StreamRequestPart: _id_encoder(MessageType.STREAM_REQUEST_PART),
    Result: _id_encoder(MessageType.RESULT),
    StreamResult: _id_encoder(MessageType.STREAM_RESULT),
    ErrorResult: _id_encoder(MessageType.ERROR_RESULT),
    RetryResult: _encode_retry,
    Notification: _encode_notification,
    Heartbeat: _encode_heartbeat,
    Fault: _encode_fault,
}


def encode_parts(message: Message) -> tuple[bytes, bytes]:
    """Return ``(header, payload)`` of ``message``; payload is ``b""`` when there is none.

    For WebSocket: gotalk.js requires each header in its own frame and the payload (when
    non-empty) in the next one. Raises :class:`LocalProtocolError` for a field that does not
    fit the wire (id not 4 bytes, name over 4095 UTF-8 bytes, payload of 16**8 bytes or
    more, wait/time/code outside 0..2**32-1, load outside 0..65535).
    """
    try:
        encoder = _ENCODERS[message.__class__]
    except KeyError:
        raise TypeError(f"not a Gotalk message: {message!r}") from None
    header, payload = encoder(message)
    if payload.__class__ is not bytes:
        payload = bytes(payload)
    return header, payload


_ID_HEADERS = {
    kind: kind.encode() + b"%b%08x"
    for kind in (
        MessageType.STREAM_REQUEST_PART,
        MessageType.RESULT,
        MessageType.STREAM_RESULT,
        MessageType.ERROR_RESULT,
    )
}
_NAMED_HEADERS = {
    kind: kind.encode() + b"%b%03x%b%08x"
    for kind in (MessageType.REQUEST, MessageType.STREAM_REQUEST)
}


def id_header(kind: MessageType, message_id: bytes, size: int) -> bytes:
    """Header of a ``p``, ``R``, ``S`` or ``E`` message with a payload of ``size`` bytes.

    The hot-path form of :func:`encode_parts` for peers that answer thousands of requests:
    no message object is built. Raises :class:`LocalProtocolError` like it does.
    """
    if len(message_id) != 4:
        _check_id(message_id)
    if size > MAX_PAYLOAD_SIZE:
        raise LocalProtocolError(f"payload of {size} bytes does not fit 8 hex digits")
    return _ID_HEADERS[kind] % (message_id, size)


def request_header(kind: MessageType, message_id: bytes, op: str, size: int) -> bytes:
    """Header of an ``r`` or ``s`` message (see :func:`id_header`)."""
    if len(message_id) != 4:
        _check_id(message_id)
    name = _encode_name(op)
    if size > MAX_PAYLOAD_SIZE:
        raise LocalProtocolError(f"payload of {size} bytes does not fit 8 hex digits")
    return _NAMED_HEADERS[kind] % (message_id, len(name), name, size)


def encode(message: Message) -> bytes:
    """Return the bytes of ``message`` (header and payload together, for byte streams).

    Raises :class:`LocalProtocolError` like :func:`encode_parts`.
    """
    try:
        encoder = _ENCODERS[message.__class__]
    except KeyError:
        raise TypeError(f"not a Gotalk message: {message!r}") from None
    header, payload = encoder(message)
    return header + payload if payload else header


# --------------------------------------------------------------------------------------
# Decoding. One parse function per type byte, looked up in a 256-entry table. Each takes
# (data, pos, end, max_size) over an immutable ``bytes`` and returns either
# (message, end of message) or (None, index the message needs ``data`` to reach), so the
# connection knows how much to buffer. Fields sit at fixed offsets; hex goes through
# binascii.unhexlify, which rejects anything but [0-9a-fA-F] (unlike int(x, 16)).

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


def _fast_init(cls: type, *fields: str) -> tuple[Callable[..., Any], ...]:
    """``object.__new__`` and the slot setters of ``cls``, for building decoded messages.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, which
    is about a third of a small message's decode time. The decoder already holds exactly
    the field values, so it allocates the instance and fills the slots directly; the result
    is indistinguishable from ``cls(...)`` (same fields, eq, hash, repr). This relies on the
    message classes having no ``__post_init__``.
    """
    return (object.__new__, *(cls.__dict__[name].__set__ for name in fields))


def _bad_hex(what: str, raw: bytes) -> MalformedMessage:
    return MalformedMessage(f"non-hex {what} {raw!r}", code=_INVALID)


def _too_large(size: int, max_size: int) -> MessageTooLarge:
    return MessageTooLarge(f"payload of {size} bytes exceeds max_size {max_size}", code=_INVALID)


def _bad_utf8(raw: bytes) -> MalformedMessage:
    return MalformedMessage(f"name {raw!r} is not valid UTF-8", code=_INVALID)


def _named_parser(cls: type[Request] | type[StreamRequest]) -> _Parser:
    new, set_id, set_op, set_payload = _fast_init(cls, "id", "op", "payload")

    def parse_named(data: bytes, pos: int, end: int, max_size: int) -> _ParseResult:
        name_at = pos + 8
        if end < name_at:
            return None, name_at
        hexval = _HEXVAL
        name_size = hexval[data[pos + 5]] << 8 | hexval[data[pos + 6]] << 4 | hexval[data[pos + 7]]
        if name_size > MAX_NAME_SIZE:
            raise _bad_hex("name size", data[pos + 5 : name_at])
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
            op = data[name_at:size_at].decode()
        except UnicodeDecodeError:
            raise _bad_utf8(data[name_at:size_at]) from None
        message = new(cls)
        set_id(message, data[pos + 1 : pos + 5])
        set_op(message, op)
        set_payload(message, data[head_end:stop])
        return message, stop

    return parse_named


def _id_parser(
    cls: type[StreamRequestPart] | type[Result] | type[StreamResult] | type[ErrorResult],
) -> _Parser:
    new, set_id, set_payload = _fast_init(cls, "id", "payload")

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
        message = new(cls)
        set_id(message, data[pos + 1 : pos + 5])
        set_payload(message, data[head_end:stop])
        return message, stop

    return parse_with_id


def _parse_retry(data: bytes, pos: int, end: int, max_size: int) -> _ParseResult:
    head_end = pos + 21
    if end < head_end:
        return None, head_end
    try:
        fields = _from_bytes(_unhexlify(data[pos + 5 : head_end]))
    except _HexError:
        raise _bad_hex("wait or payload size", data[pos + 5 : head_end]) from None
    size = fields & _U32
    if size > max_size:
        raise _too_large(size, max_size)
    stop = head_end + size
    if end < stop:
        return None, stop
    return RetryResult(data[pos + 1 : pos + 5], fields >> 32, data[head_end:stop]), stop


def _parse_notification(data: bytes, pos: int, end: int, max_size: int) -> _ParseResult:
    name_at = pos + 4
    if end < name_at:
        return None, name_at
    hexval = _HEXVAL
    name_size = hexval[data[pos + 1]] << 8 | hexval[data[pos + 2]] << 4 | hexval[data[pos + 3]]
    if name_size > MAX_NAME_SIZE:
        raise _bad_hex("name size", data[pos + 1 : name_at])
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
    return Notification(name, data[head_end:stop]), stop


def _parse_heartbeat(data: bytes, pos: int, end: int, max_size: int) -> _ParseResult:
    stop = pos + 13
    if end < stop:
        return None, stop
    try:
        fields = _from_bytes(_unhexlify(data[pos + 1 : stop]))
    except _HexError:
        raise _bad_hex("heartbeat", data[pos + 1 : stop]) from None
    return Heartbeat(fields >> 32, fields & _U32), stop


def _parse_fault(data: bytes, pos: int, end: int, max_size: int) -> _ParseResult:
    stop = pos + 9
    if end < stop:
        return None, stop
    try:
        code = _from_bytes(_unhexlify(data[pos + 1 : stop]))
    except _HexError:
        raise _bad_hex("fault code", data[pos + 1 : stop]) from None
    return Fault(_CODES[code] if code < len(_CODES) else code), stop


_PARSERS: list[_Parser | None] = [None] * 256
_PARSERS[ord(MessageType.REQUEST)] = _named_parser(Request)
_PARSERS[ord(MessageType.STREAM_REQUEST)] = _named_parser(StreamRequest)
_PARSERS[ord(MessageType.STREAM_REQUEST_PART)] = _id_parser(StreamRequestPart)
_PARSERS[ord(MessageType.RESULT)] = _id_parser(Result)
_PARSERS[ord(MessageType.STREAM_RESULT)] = _id_parser(StreamResult)
_PARSERS[ord(MessageType.ERROR_RESULT)] = _id_parser(ErrorResult)
_PARSERS[ord(MessageType.RETRY_RESULT)] = _parse_retry
_PARSERS[ord(MessageType.NOTIFICATION)] = _parse_notification
_PARSERS[ord(MessageType.HEARTBEAT)] = _parse_heartbeat
_PARSERS[ord(MessageType.FAULT)] = _parse_fault


def _unknown_type(byte: int) -> MalformedMessage:
    return MalformedMessage(f"unknown message type {bytes([byte])!r}", code=_INVALID)


class GotalkConnection:
    """Framing state of one Gotalk connection, either side (client and server are alike).

    Feed received bytes to :meth:`receive_data`; turn messages into bytes with :meth:`send`.
    The first two bytes received are the peer's version; only ``01`` is accepted.

    Memory: at most one incomplete message is buffered, and a payload size above
    ``max_size`` is rejected from its header, before any of the payload is buffered, so the
    buffer never exceeds the header (at most 4111 bytes) plus ``max_size``.

    After :meth:`receive_data` raises, the connection is dead: every later call raises the
    same exception again (the caller should send :meth:`fault` with ``exc.code`` where the
    peer expects one, then close). Messages parsed earlier in the chunk that failed are
    dropped with it, since the connection is being closed anyway.
    """

    __slots__ = ("_buf", "_error", "_max_size", "_need", "_peer_version")

    def __init__(self, *, max_size: int = DEFAULT_MAX_SIZE) -> None:
        if max_size < 0:
            raise ValueError("max_size must be >= 0")
        self._max_size = max_size
        self._buf = bytearray()  # the version, or one incomplete message
        self._need = len(VERSION)  # length _buf must reach before it is parsed again
        self._peer_version: bytes | None = None
        self._error: ProtocolError | None = None

    @property
    def peer_version(self) -> bytes | None:
        """The version the peer sent (``b"01"``), or None until it has arrived."""
        return self._peer_version

    @property
    def max_size(self) -> int:
        """Largest payload accepted from the peer."""
        return self._max_size

    @property
    def buffered(self) -> int:
        """Bytes held back as an incomplete message (for metrics and tests)."""
        return len(self._buf)

    @property
    def error(self) -> ProtocolError | None:
        """The error that killed the connection, or None while it is alive."""
        return self._error

    def handshake(self) -> bytes:
        """Bytes to send first: our version. It may share one write with the first message."""
        return VERSION

    def send(self, message: Message) -> bytes:
        """The bytes of ``message`` (see :func:`encode`)."""
        return encode(message)

    def send_parts(self, message: Message) -> tuple[bytes, bytes]:
        """``(header, payload)`` of ``message``: one WebSocket frame each (:func:`encode_parts`)."""
        return encode_parts(message)

    def fault(self, code: ErrorCode | int) -> bytes:
        """The bytes of an ``f`` message, to send just before closing the connection."""
        return encode(Fault(code))

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Parse ``data`` (any chunking) and return every message it completes, in order.

        Raises :class:`UnsupportedVersion` (code 1) for a version other than ``01``,
        :class:`MalformedMessage` (code 2) for an unknown type, non-hex digits or a name
        that is not UTF-8, and :class:`MessageTooLarge` (code 2) for a payload size above
        ``max_size``. A partial message just waits for more bytes. Once it has raised, the
        connection is dead and every later call raises the same error again.
        """
        if self._error is not None:
            raise self._error.with_traceback(None)
        if data.__class__ is not bytes:
            data = bytes(data)
        out: list[Message] = []
        pos = 0
        try:
            if self._buf or self._peer_version is None:
                pos = self._resume(data, out)
            end = len(data)
            parsers = _PARSERS
            max_size = self._max_size
            while pos < end:
                parser = parsers[data[pos]]
                if parser is None:
                    raise _unknown_type(data[pos])
                message, stop = parser(data, pos, end, max_size)
                if message is None:
                    self._buf += memoryview(data)[pos:]
                    self._need = stop - pos
                    break
                out.append(message)
                pos = stop
        except ProtocolError as exc:
            self._error = exc
            self._buf = bytearray()
            raise
        return out

    def _resume(self, data: bytes, out: list[Message]) -> int:
        """Complete the version or the buffered message from ``data``; return bytes used.

        Only what the pending item needs is copied into the buffer, so the buffer never
        holds more than one message, however large ``data`` is.
        """
        buf = self._buf
        pos = 0
        while True:
            take = self._need - len(buf)
            if take > 0:
                chunk = memoryview(data)[pos : pos + take]
                buf += chunk
                pos += len(chunk)
            if self._peer_version is None:
                if not VERSION.startswith(buf):
                    raise UnsupportedVersion(
                        f"unsupported protocol version {bytes(buf)!r}",
                        code=ErrorCode.UNSUPPORTED_PROTOCOL,
                    )
                if len(buf) < self._need:
                    return pos
                self._peer_version = VERSION
                self._buf = bytearray()
                return pos
            if len(buf) < self._need:
                return pos
            raw = bytes(buf)
            message, stop = _PARSERS[raw[0]](raw, 0, len(raw), self._max_size)
            if message is None:
                self._need = stop
                continue
            out.append(message)
            self._buf = bytearray()
            return pos
