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

from wire.gotalk.connection import GotalkConnection
from wire.gotalk.encoding import (
    encode,
    encode_parts,
    id_format,
    id_header,
    request_format,
    request_header,
)
from wire.gotalk.messages import (
    MAX_NAME_SIZE,
    MAX_PAYLOAD_SIZE,
    VERSION,
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
    "id_format",
    "id_header",
    "request_format",
    "request_header",
]
