"""Gotalk v1 message types: one frozen struct per type byte, and the wire's limits.

Request ids are 4 opaque ``bytes``; names are ``str`` (at most 4095 UTF-8 bytes); payloads
are ``bytes``. Encoding is :mod:`wire.gotalk.encoding`, decoding :mod:`wire.gotalk.decoding`.

The types are ``msgspec.Struct`` classes: msgspec leaves a struct whose fields are all
untracked (bytes, text, ints) out of Python's cyclic garbage collector, so a server holding
many decoded messages (a backlog of 16,384 per flooding connection) does not make every
full collection walk them (a frozen dataclass is always tracked). A struct built with a
tracked payload (a ``memoryview`` given to an encoder) is tracked as any object. They
compare, hash, print, pickle and pattern-match by field as dataclasses do, and build about
three times faster than a frozen dataclass.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import ClassVar, TypeAlias

import msgspec

VERSION = b"01"
"""The only protocol version spoken (and accepted from peers)."""

MAX_NAME_SIZE = 0xFFF
"""Largest operation/notification name in UTF-8 bytes: its size is 3 hex digits."""

MAX_PAYLOAD_SIZE = 0xFFFFFFFF
"""Largest payload the size field can express (8 hex digits)."""

U32_MAX = 0xFFFFFFFF
"""Bound of the 8-hex-digit fields (wait, heartbeat time, fault code)."""

U16_MAX = 0xFFFF
"""Bound of the heartbeat's 4-hex-digit load."""


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


class Request(msgspec.Struct, frozen=True):
    """``r``: a single-payload request; answered by R, S, E or e with the same id."""

    TYPE: ClassVar[MessageType] = MessageType.REQUEST
    id: bytes
    op: str
    payload: bytes


class StreamRequest(msgspec.Struct, frozen=True):
    """``s``: first chunk of a streaming request; ``p`` parts follow, an empty one ends it."""

    TYPE: ClassVar[MessageType] = MessageType.STREAM_REQUEST
    id: bytes
    op: str
    payload: bytes


class StreamRequestPart(msgspec.Struct, frozen=True):
    """``p``: a further chunk of a streaming request; an empty payload ends the stream."""

    TYPE: ClassVar[MessageType] = MessageType.STREAM_REQUEST_PART
    id: bytes
    payload: bytes


class Result(msgspec.Struct, frozen=True):
    """``R``: the single-payload result of request ``id``."""

    TYPE: ClassVar[MessageType] = MessageType.RESULT
    id: bytes
    payload: bytes


class StreamResult(msgspec.Struct, frozen=True):
    """``S``: one chunk of a streaming result; an empty payload ends the stream."""

    TYPE: ClassVar[MessageType] = MessageType.STREAM_RESULT
    id: bytes
    payload: bytes


class ErrorResult(msgspec.Struct, frozen=True):
    """``E``: the request failed on the requestor's account (do not retry as is).

    Real peers put plain UTF-8 text in the payload, not JSON.
    """

    TYPE: ClassVar[MessageType] = MessageType.ERROR_RESULT
    id: bytes
    payload: bytes


class RetryResult(msgspec.Struct, frozen=True):
    """``e``: the responder could not serve the request now; retry after ``wait`` ms.

    gotalk.js does not understand it (it answers ``f00000002``): never send it to a browser.
    """

    TYPE: ClassVar[MessageType] = MessageType.RETRY_RESULT
    id: bytes
    wait: int
    payload: bytes


class Notification(msgspec.Struct, frozen=True):
    """``n``: a one-way message; never answered."""

    TYPE: ClassVar[MessageType] = MessageType.NOTIFICATION
    name: str
    payload: bytes


class Heartbeat(msgspec.Struct, frozen=True):
    """``h``: keeps read deadlines from expiring; ``load`` 0..65535, ``time`` unix seconds."""

    TYPE: ClassVar[MessageType] = MessageType.HEARTBEAT
    load: int
    time: int


class Fault(msgspec.Struct, frozen=True):
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
