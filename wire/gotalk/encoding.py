"""Gotalk v1 encoding: messages to ``(header, payload)`` or to one ``bytes``.

Every encoder validates what the peer could not parse back (raising
:class:`~wire.errors.LocalProtocolError`), then formats the header with one bytes %-format
(lowercase hex, like Go).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeAlias

from wire.errors import LocalProtocolError
from wire.gotalk.messages import (
    MAX_NAME_SIZE,
    MAX_PAYLOAD_SIZE,
    U16_MAX,
    U32_MAX,
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

_Payload: TypeAlias = Any
"""A payload as the encoders read it: ``bytes`` or any bytes-like object (:func:`encode_parts`
sends those as bytes). The compiled build (setup.py) checks declared types at run time, also
of an attribute read from a typed message, so the encoders that read a payload take their
message as ``Any`` (the type they are registered for is named in :data:`_ENCODERS`) and it
takes what the interpreted code takes."""


def _check_id(message_id: bytes) -> None:
    if len(message_id) != 4:
        raise LocalProtocolError(f"request id must be 4 bytes, got {len(message_id)}")


def _check_size(payload: _Payload) -> int:
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
    if not 0 <= value <= U32_MAX:
        raise LocalProtocolError(f"{what} {value} does not fit an unsigned 32-bit field")


def _named_encoder(kind: MessageType) -> Callable[[Any], tuple[bytes, _Payload]]:
    fmt = kind.encode() + b"%b%03x%b%08x"

    def encode_named(m: Any) -> tuple[bytes, _Payload]:  # Request | StreamRequest
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


def _id_encoder(kind: MessageType) -> Callable[[Any], tuple[bytes, _Payload]]:
    fmt = kind.encode() + b"%b%08x"

    def encode_with_id(m: Any) -> tuple[bytes, _Payload]:  # p, R, S or E
        message_id = m.id
        if len(message_id) != 4:
            _check_id(message_id)
        payload = m.payload
        size = len(payload)
        if size > MAX_PAYLOAD_SIZE:
            _check_size(payload)
        return fmt % (message_id, size), payload

    return encode_with_id


def _encode_retry(m: Any) -> tuple[bytes, _Payload]:  # RetryResult
    _check_id(m.id)
    _check_u32("wait", m.wait)
    payload = m.payload
    return b"e%b%08x%08x" % (m.id, m.wait, _check_size(payload)), payload


def _encode_notification(m: Any) -> tuple[bytes, _Payload]:  # Notification
    name = _encode_name(m.name)
    payload = m.payload
    return b"n%03x%b%08x" % (len(name), name, _check_size(payload)), payload


def _encode_heartbeat(m: Heartbeat) -> tuple[bytes, bytes]:
    if not 0 <= m.load <= U16_MAX:
        raise LocalProtocolError(f"heartbeat load {m.load} is outside 0..65535")
    _check_u32("heartbeat time", m.time)
    return b"h%04x%08x" % (m.load, m.time), b""


def _encode_fault(m: Fault) -> tuple[bytes, bytes]:
    _check_u32("fault code", m.code)
    return b"f%08x" % m.code, b""


# Each class maps to its own encoder (a dict keyed by type cannot say so: hence Any).
_ENCODERS: dict[type, Callable[[Any], tuple[bytes, _Payload]]] = {
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


def id_format(kind: MessageType) -> bytes:
    """:func:`id_header` as a ``bytes`` format, for a caller that keeps it:
    ``id_format(kind) % (message_id, size)`` is the header when the id is 4 bytes and
    ``size`` at most :data:`~wire.gotalk.MAX_PAYLOAD_SIZE`, which the caller checks
    (``id_header`` checks both). Raises :class:`LocalProtocolError` for a kind without an
    id and a payload size."""
    try:
        return _ID_HEADERS[kind]
    except KeyError:
        raise LocalProtocolError(f"not a p, R, S or E type: {kind!r}") from None


def request_header(kind: MessageType, message_id: bytes, op: str, size: int) -> bytes:
    """Header of an ``r`` or ``s`` message (see :func:`id_header`). The part of it that
    depends on ``op`` alone is encoded once per operation (the last
    :data:`REQUEST_FORMATS` kept): a client calls the same few operations again and again."""
    if len(message_id) != 4:
        _check_id(message_id)
    if size > MAX_PAYLOAD_SIZE:
        raise LocalProtocolError(f"payload of {size} bytes does not fit 8 hex digits")
    return request_format(kind, op) % (message_id, size)


REQUEST_FORMATS = 256
"""Operations whose request header format :func:`request_header` keeps."""


@functools.lru_cache(maxsize=REQUEST_FORMATS)
def request_format(kind: MessageType, op: str) -> bytes:
    """:func:`request_header` as a ``bytes`` format (as :func:`id_format`): ``kind``, a slot
    for the id, ``op`` with its length, a slot for the payload size. Raises
    :class:`LocalProtocolError` for a name that does not fit or a kind other than ``r``
    and ``s``."""
    if kind not in (MessageType.REQUEST, MessageType.STREAM_REQUEST):
        raise LocalProtocolError(f"not a request type: {kind!r}")
    name = _encode_name(op)  # raises for a bad name: lru_cache keeps no failure
    return kind.encode() + b"%%b%03x" % len(name) + name.replace(b"%", b"%%") + b"%08x"


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
