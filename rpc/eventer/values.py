"""Eventer values: event types, ids, timestamps, payloads, queries, errors.

The values are ``NamedTuple`` records: immutable, hashable, cheap to build on the hot path,
and ordered field by field, which is exactly the natural order of :class:`EventId` and
:class:`Timestamp`. Their SBS shapes are :mod:`rpc.eventer.codec`'s; everything here is
also importable from :mod:`rpc.eventer.common`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from rpc.errors import RequestTimeout
from wire.sbs import INT64_MAX, INT64_MIN

MODULE = "HatEventer"
MSG_INIT_REQ = "HatEventer.MsgInitReq"
MSG_INIT_RES = "HatEventer.MsgInitRes"
MSG_STATUS_NOTIFY = "HatEventer.MsgStatusNotify"
MSG_EVENTS_NOTIFY = "HatEventer.MsgEventsNotify"
MSG_EVENTS_ACK = "HatEventer.MsgEventsAck"
MSG_REGISTER_REQ = "HatEventer.MsgRegisterReq"
MSG_REGISTER_RES = "HatEventer.MsgRegisterRes"
MSG_QUERY_REQ = "HatEventer.MsgQueryReq"
MSG_QUERY_RES = "HatEventer.MsgQueryRes"

EventType = tuple[str, ...]
"""Segments of an event type; in subscriptions ``?`` is one segment, ``*`` (last) the rest."""
MAX_TYPE_SEGMENTS = 256
"""Segments of an event type, or of a subscription's or query's type, at most (hat-event
has no limit; its types have a handful). Past it the server refuses the registration
(``failure``), the init (an error response) or the query (the connection closes)."""


class EventerError(Exception):
    """Base of the eventer's errors."""


class EventerInitError(EventerError):
    """The server refused our init (e.g. a wrong token); the message is the server's."""


class EventerInitTimeout(EventerError, RequestTimeout):
    """The server accepted the connection but did not answer our init (the Eventer's
    handshake) within the client's ``timeout``: it is hung, overloaded, or not an Eventer
    server. Also an ``rpc.RequestTimeout`` (what ``connect`` raised for it before), so a
    TimeoutError."""


class InvalidMessage(EventerError):
    """A peer sent bytes that do not decode as the HatEventer message they claim to be."""


class QueryError(EventerError):
    """The server answered a query with an error instead of a result (e.g. a latest result
    larger than its ``max_message_size``); the message is the server's."""


class RegistrationTooLarge(EventerError):
    """A registration (or the response it would get) does not fit in one message of
    ``max_size`` bytes; nothing was sent and the connection is unaffected."""


ENVELOPE_RESERVE = 256
"""Bytes of a Chatter message that are not the Eventer payload (ids, flags, type name)."""
MAX_EVENT_GROWTH = 50
"""Bytes an event gains from register request to event at most (id and timestamp)."""


class Status(enum.Enum):
    STANDBY = "standby"
    STARTING = "starting"
    OPERATIONAL = "operational"
    STOPPING = "stopping"


class Order(enum.Enum):
    DESCENDING = "descending"
    ASCENDING = "ascending"


class OrderBy(enum.Enum):
    TIMESTAMP = "timestamp"
    SOURCE_TIMESTAMP = "sourceTimestamp"


class Timestamp(NamedTuple):
    s: int
    """Seconds since 1970-01-01 UTC (may be negative)."""
    us: int
    """Microseconds in [0, 1e6)."""

    def to_us(self) -> int:
        """Microseconds since the epoch, clamped to int64 (SQLite's integer range)."""
        return min(max(self.s * 1_000_000 + self.us, INT64_MIN), INT64_MAX)

    def key(self) -> bytes:
        """16 bytes whose byte order is the order of (s, us): lossless for int64 fields."""
        return timestamp_key(self.s, self.us)

    @classmethod
    def from_us(cls, us: int) -> Timestamp:
        s, rest = divmod(us, 1_000_000)
        return cls(s, rest)

    def to_float(self) -> float:
        return self.s + self.us * 1e-6


def timestamp_key(s: int, us: int) -> bytes:
    """Order-preserving bytes of a timestamp: ``s`` and ``us`` offset by 2**63, big-endian
    (values beyond int64 are clamped; a registered timestamp never is)."""
    s = min(max(s, INT64_MIN), INT64_MAX) - INT64_MIN
    us = min(max(us, INT64_MIN), INT64_MAX) - INT64_MIN
    return s.to_bytes(8, "big") + us.to_bytes(8, "big")


def now() -> Timestamp:
    """The current time as a :class:`Timestamp`."""
    s, us = divmod(time.time_ns() // 1000, 1_000_000)
    return Timestamp(s, us)


class EventId(NamedTuple):
    """Natural order of one server's events: (server, session, instance)."""

    server: int
    session: int
    instance: int


class EventPayloadBinary(NamedTuple):
    type: str
    data: bytes


class EventPayloadJson(NamedTuple):
    data: Any
    """Any JSON value (on the wire: JSON text)."""


EventPayload = EventPayloadBinary | EventPayloadJson


class Event(NamedTuple):
    id: EventId
    type: EventType
    timestamp: Timestamp
    source_timestamp: Timestamp | None
    payload: EventPayload | None


class RegisterEvent(NamedTuple):
    type: EventType
    source_timestamp: Timestamp | None = None
    payload: EventPayload | None = None


class QueryLatestParams(NamedTuple):
    event_types: Sequence[EventType] | None = None


class QueryTimeseriesParams(NamedTuple):
    event_types: Sequence[EventType] | None = None
    t_from: Timestamp | None = None
    t_to: Timestamp | None = None
    source_t_from: Timestamp | None = None
    source_t_to: Timestamp | None = None
    order: Order = Order.DESCENDING
    order_by: OrderBy = OrderBy.TIMESTAMP
    max_results: int | None = None
    last_event_id: EventId | None = None


class QueryServerParams(NamedTuple):
    server_id: int
    persisted: bool = False
    max_results: int | None = None
    last_event_id: EventId | None = None


QueryParams = QueryLatestParams | QueryTimeseriesParams | QueryServerParams


class QueryResult(NamedTuple):
    events: list[Event]
    more_follows: bool
