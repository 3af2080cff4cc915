"""Eventer values: event types, ids, timestamps, payloads, queries, subscriptions.

The values are ``NamedTuple`` records: immutable, hashable, cheap to build on the hot path,
and ordered field by field, which is exactly the natural order of :class:`EventId` and
:class:`Timestamp`. ``*_to_sbs`` / ``*_from_sbs`` convert them to and from the value shapes
hat-sbs uses for the ``HatEventer`` schema (Record = dict, Choice = ``(name, value)``).

Peers of the eventer run with :func:`peer_repository` (every schema except ``HatEventer``),
so HatEventer payloads reach us as bytes and we encode each event ONCE with
:func:`encode_event`: a session notified to ten clients, answered to its registrant and
stored in SQLite is one SBS encoding, and messages are concatenations of those bytes
(:func:`encode_events`).
"""

from __future__ import annotations

import enum
import functools
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import hat.sbs
import msgspec

from wire import schemas
from wire.chatter import encode_integer

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

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class EventerError(Exception):
    """Base of the eventer's errors."""


class EventerInitError(EventerError):
    """The server refused our init (e.g. a wrong token); the message is the server's."""


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


# --- subscriptions -------------------------------------------------------------------------


class Subscription:
    """A set of query types; :meth:`matches` tells whether an event type is in it.

    ``?`` matches exactly one segment, ``*`` (last position only) zero or more segments, so
    ``("a", "*")`` matches ``("a",)`` and ``("a", "b", "c")``; ``()`` matches only ``()``.
    The types are compiled into a trie, so a match costs one dict lookup per segment.
    """

    __slots__ = ("_root", "matches_all", "query_types")

    def __init__(self, query_types: Iterable[Sequence[str]]) -> None:
        self.query_types: tuple[EventType, ...] = tuple(dict.fromkeys(map(tuple, query_types)))
        self._root: _Node = [{}, False]
        for query_type in self.query_types:
            node = self._root
            for i, segment in enumerate(query_type):
                if segment == "*" and i != len(query_type) - 1:
                    raise ValueError(f"'*' must be the last segment of {query_type!r}")
                child = node[0].get(segment)
                if child is None:
                    child = node[0][segment] = [{}, False]
                node = child
            node[1] = True
        self.matches_all = "*" in self._root[0]

    def matches(self, event_type: Sequence[str]) -> bool:
        return _matches(self._root, event_type, 0)

    def __repr__(self) -> str:
        return f"Subscription({list(self.query_types)!r})"


_Node = list[Any]  # [children: dict[str, _Node], is_leaf: bool]


def _matches(node: _Node, event_type: Sequence[str], index: int) -> bool:
    children = node[0]
    if "*" in children:
        return True
    if index >= len(event_type):
        return node[1]
    child = children.get(event_type[index])
    if child is not None and _matches(child, event_type, index + 1):
        return True
    child = children.get("?")
    return child is not None and _matches(child, event_type, index + 1)


def has_wildcards(query_types: Iterable[Sequence[str]]) -> bool:
    return any("*" in t or "?" in t for t in query_types)


# --- SBS -----------------------------------------------------------------------------------


@functools.cache
def eventer_repository() -> hat.sbs.Repository:
    """The repository holding ``HatEventer`` (peerwire's schema folder)."""
    return schemas.repository()


@functools.cache
def peer_repository() -> hat.sbs.Repository:
    """Every peerwire schema except ``HatEventer``: peers given this repository hand
    HatEventer payloads over as bytes, which this package encodes and decodes itself."""
    texts = [text for name, text in schemas.schema_texts().items() if name != MODULE]
    return hat.sbs.Repository(*texts)


@functools.cache
def _ref(type_name: str) -> hat.sbs.Ref:
    module, _, name = type_name.partition(".")
    return hat.sbs.Ref(module, name)  # hat-sbs parses a str name on every call otherwise


def encode(type_name: str, value: Any) -> bytes:
    return eventer_repository().encode(_ref(type_name), value)


def decode(type_name: str, data: bytes) -> Any:
    """Decode, turning every hat-sbs failure (including its SystemError on truncated
    input) into :class:`InvalidMessage`."""
    try:
        return eventer_repository().decode(_ref(type_name), data)
    except Exception as exc:
        raise InvalidMessage(f"{type_name}: {type(exc).__name__}: {exc}") from None


_EVENT = f"{MODULE}.Event"
_NONE = ("none", None)
_TRUE = b"\x01"
_FALSE = b"\x00"


def encode_event(value: dict[str, Any]) -> bytes:
    """SBS bytes of one ``HatEventer.Event`` in its hat-sbs shape."""
    return eventer_repository().encode(_ref(_EVENT), value)


class RegisterPart(NamedTuple):
    """One RegisterEvent of a MsgRegisterReq, split for splicing into Event bytes."""

    type: EventType
    source_key: bytes | None
    """Source timestamp as :func:`timestamp_key` bytes, None if absent."""
    json: str | None
    """The JSON payload's text (to validate), None for no or a binary payload."""
    type_bytes: bytes
    """SBS bytes of the ``type`` field."""
    tail_bytes: bytes
    """SBS bytes of ``sourceTimestamp`` and ``payload``."""


def split_register_req(data: bytes) -> list[RegisterPart]:
    """Parse a ``MsgRegisterReq`` keeping each event's field bytes.

    ``Event`` is ``id, type, timestamp, sourceTimestamp, payload`` and ``RegisterEvent``
    is ``type, sourceTimestamp, payload``, so an event's bytes are ``id + type_bytes +
    timestamp + tail_bytes``: no decode/encode round trip per event (about a third of
    the cost). Validates what hat-sbs would (and what its C decoder does not): lengths
    within the data, integers within int64, UTF-8, Choice indexes, no trailing bytes.
    """
    try:
        return _split_register_req(data)
    except (IndexError, UnicodeDecodeError) as exc:
        raise InvalidMessage(f"MsgRegisterReq: {type(exc).__name__}: {exc}") from None


def _read_int(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b & 0x80:  # one byte: -64..63
        return (b & 0x3F) - (b & 0x40), pos + 1
    value = -1 if b & 0x40 else 0
    end = pos + 10
    while True:
        value = (value << 7) | (b & 0x7F)
        pos += 1
        if b & 0x80:
            if not INT64_MIN <= value <= INT64_MAX:
                raise InvalidMessage("MsgRegisterReq: integer beyond int64")
            return value, pos
        if pos >= end:
            raise InvalidMessage("MsgRegisterReq: integer longer than 10 bytes")
        b = buf[pos]


def _read_str(buf: bytes, pos: int) -> tuple[str, int]:
    length, pos = _read_int(buf, pos)
    end = pos + length
    if length < 0 or end > len(buf):
        raise InvalidMessage("MsgRegisterReq: truncated")
    return buf[pos:end].decode(), end


def _split_register_req(buf: bytes) -> list[RegisterPart]:
    count, pos = _read_int(buf, 0)
    if count < 0 or count > len(buf):
        raise InvalidMessage(f"MsgRegisterReq: bad event count {count}")
    parts = []
    for _ in range(count):
        start = pos
        n, pos = _read_int(buf, pos)
        if n < 0 or n > len(buf):
            raise InvalidMessage(f"MsgRegisterReq: bad segment count {n}")
        segments = []
        for _ in range(n):
            segment, pos = _read_str(buf, pos)
            segments.append(segment)
        type_end = pos
        choice, pos = _read_int(buf, pos)
        source_key = None
        if choice == 1:
            s, pos = _read_int(buf, pos)
            us, pos = _read_int(buf, pos)
            source_key = timestamp_key(s, us)
        elif choice != 0:
            raise InvalidMessage("MsgRegisterReq: bad sourceTimestamp choice")
        choice, pos = _read_int(buf, pos)
        json_text = None
        if choice == 1:
            kind, pos = _read_int(buf, pos)
            if kind == 0:  # binary: type String, data Bytes
                _, pos = _read_str(buf, pos)
                length, pos = _read_int(buf, pos)
                if length < 0 or pos + length > len(buf):
                    raise InvalidMessage("MsgRegisterReq: truncated")
                pos += length
            elif kind == 1:
                json_text, pos = _read_str(buf, pos)
            else:
                raise InvalidMessage("MsgRegisterReq: bad payload choice")
        elif choice != 0:
            raise InvalidMessage("MsgRegisterReq: bad payload choice")
        parts.append(
            RegisterPart(
                tuple(segments), source_key, json_text, buf[start:type_end], buf[type_end:pos]
            )
        )
    if pos != len(buf):
        raise InvalidMessage("MsgRegisterReq: trailing bytes")
    return parts


def encode_events(blobs: Sequence[bytes]) -> bytes:
    """SBS ``Array(Event)`` made of already encoded events."""
    return encode_integer(len(blobs)) + b"".join(blobs)


def encode_query_result(blobs: Sequence[bytes], more_follows: bool) -> bytes:
    return encode_events(blobs) + (_TRUE if more_follows else _FALSE)


def encode_register_res(blobs: Sequence[bytes] | None) -> bytes:
    """``MsgRegisterRes``: ``events`` (index 0) or ``failure`` (index 1)."""
    if blobs is None:
        return encode_integer(1)
    return encode_integer(0) + encode_events(blobs)


def _opt(value: Any) -> tuple[str, Any]:
    return _NONE if value is None else ("value", value)


def _from_opt(value: tuple[str, Any]) -> Any:
    return value[1] if value[0] == "value" else None


def timestamp_to_sbs(t: Timestamp) -> dict[str, int]:
    return {"s": t.s, "us": t.us}


def timestamp_from_sbs(value: dict[str, int]) -> Timestamp:
    return Timestamp(value["s"], value["us"])


def opt_timestamp_to_sbs(t: Timestamp | None) -> tuple[str, Any]:
    return _NONE if t is None else ("value", {"s": t.s, "us": t.us})


def opt_timestamp_from_sbs(value: tuple[str, Any]) -> Timestamp | None:
    return None if value[0] == "none" else Timestamp(value[1]["s"], value[1]["us"])


def event_id_to_sbs(event_id: EventId) -> dict[str, int]:
    return {"server": event_id.server, "session": event_id.session, "instance": event_id.instance}


def event_id_from_sbs(value: dict[str, int]) -> EventId:
    return EventId(value["server"], value["session"], value["instance"])


_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


def _json_text(data: Any) -> str:
    try:
        return _json_encoder.encode(data).decode()
    except UnicodeEncodeError:  # lone surrogates: the stdlib escapes them, as hat does
        return json.dumps(data, allow_nan=False)


def _json_value(text: str) -> Any:
    """Decode JSON text as the reference does (Python's ``json``, which also takes escaped
    lone surrogates such as ``"\\ud800"``), msgspec first for speed. NaN and Infinity are
    refused: the reference accepts them but cannot send them back."""
    try:
        return _json_decoder.decode(text)
    except msgspec.DecodeError as exc:
        try:
            return json.loads(text, parse_constant=_no_constant)
        except ValueError:
            raise exc from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def payload_to_sbs(payload: EventPayload | None) -> tuple[str, Any]:
    if payload is None:
        return _NONE
    if isinstance(payload, EventPayloadJson):
        return ("value", ("json", _json_text(payload.data)))
    if isinstance(payload, EventPayloadBinary):
        return ("value", ("binary", {"type": payload.type, "data": bytes(payload.data)}))
    raise TypeError(f"not an event payload: {payload!r}")


def payload_from_sbs(value: tuple[str, Any]) -> EventPayload | None:
    if value[0] == "none":
        return None
    kind, data = value[1]
    if kind == "json":
        return EventPayloadJson(_json_value(data))
    return EventPayloadBinary(data["type"], data["data"])


def check_json_text(text: str) -> None:
    """Raise InvalidMessage unless ``text`` is one JSON value the reference accepts."""
    try:
        _json_value(text)
    except msgspec.DecodeError:
        try:
            json.loads(text)
        except ValueError as exc:  # the stdlib says where and what
            raise InvalidMessage(f"invalid JSON payload: {exc}") from None
        raise InvalidMessage("invalid JSON payload: NaN and Infinity are not JSON") from None


def event_to_sbs(event: Event) -> dict[str, Any]:
    return {
        "id": event_id_to_sbs(event.id),
        "type": list(event.type),
        "timestamp": timestamp_to_sbs(event.timestamp),
        "sourceTimestamp": opt_timestamp_to_sbs(event.source_timestamp),
        "payload": payload_to_sbs(event.payload),
    }


def event_from_sbs(value: dict[str, Any]) -> Event:
    ts = value["timestamp"]
    return Event(
        id=event_id_from_sbs(value["id"]),
        type=tuple(value["type"]),
        timestamp=Timestamp(ts["s"], ts["us"]),
        source_timestamp=opt_timestamp_from_sbs(value["sourceTimestamp"]),
        payload=payload_from_sbs(value["payload"]),
    )


def decode_events(data: bytes, type_name: str = MSG_EVENTS_NOTIFY) -> list[Event]:
    return [event_from_sbs(e) for e in decode(type_name, data)]


def register_event_to_sbs(event: RegisterEvent) -> dict[str, Any]:
    return {
        "type": list(event.type),
        "sourceTimestamp": opt_timestamp_to_sbs(event.source_timestamp),
        "payload": payload_to_sbs(event.payload),
    }


def register_event_from_sbs(value: dict[str, Any]) -> RegisterEvent:
    return RegisterEvent(
        type=tuple(value["type"]),
        source_timestamp=opt_timestamp_from_sbs(value["sourceTimestamp"]),
        payload=payload_from_sbs(value["payload"]),
    )


def status_to_sbs(status: Status) -> tuple[str, None]:
    return (status.value, None)


def status_from_sbs(value: tuple[str, Any]) -> Status:
    return Status(value[0])


def _types_to_sbs(types: Sequence[EventType] | None) -> tuple[str, Any]:
    return _NONE if types is None else ("value", [list(t) for t in types])


def _types_from_sbs(value: tuple[str, Any]) -> list[EventType] | None:
    return None if value[0] == "none" else [tuple(t) for t in value[1]]


def query_params_to_sbs(params: QueryParams) -> tuple[str, Any]:
    if isinstance(params, QueryLatestParams):
        return ("latest", {"eventTypes": _types_to_sbs(params.event_types)})
    if isinstance(params, QueryTimeseriesParams):
        return (
            "timeseries",
            {
                "eventTypes": _types_to_sbs(params.event_types),
                "tFrom": opt_timestamp_to_sbs(params.t_from),
                "tTo": opt_timestamp_to_sbs(params.t_to),
                "sourceTFrom": opt_timestamp_to_sbs(params.source_t_from),
                "sourceTTo": opt_timestamp_to_sbs(params.source_t_to),
                "order": (params.order.value, None),
                "orderBy": (params.order_by.value, None),
                "maxResults": _opt(params.max_results),
                "lastEventId": _opt(
                    None if params.last_event_id is None else event_id_to_sbs(params.last_event_id)
                ),
            },
        )
    if isinstance(params, QueryServerParams):
        return (
            "server",
            {
                "serverId": params.server_id,
                "persisted": params.persisted,
                "maxResults": _opt(params.max_results),
                "lastEventId": _opt(
                    None if params.last_event_id is None else event_id_to_sbs(params.last_event_id)
                ),
            },
        )
    raise TypeError(f"not query params: {params!r}")


def query_params_from_sbs(value: tuple[str, Any]) -> QueryParams:
    kind, p = value
    if kind == "latest":
        return QueryLatestParams(_types_from_sbs(p["eventTypes"]))
    last = _from_opt(p["lastEventId"])
    last_id = None if last is None else event_id_from_sbs(last)
    if kind == "timeseries":
        return QueryTimeseriesParams(
            event_types=_types_from_sbs(p["eventTypes"]),
            t_from=opt_timestamp_from_sbs(p["tFrom"]),
            t_to=opt_timestamp_from_sbs(p["tTo"]),
            source_t_from=opt_timestamp_from_sbs(p["sourceTFrom"]),
            source_t_to=opt_timestamp_from_sbs(p["sourceTTo"]),
            order=Order(p["order"][0]),
            order_by=OrderBy(p["orderBy"][0]),
            max_results=_from_opt(p["maxResults"]),
            last_event_id=last_id,
        )
    if kind == "server":
        return QueryServerParams(
            server_id=p["serverId"],
            persisted=p["persisted"],
            max_results=_from_opt(p["maxResults"]),
            last_event_id=last_id,
        )
    raise InvalidMessage(f"unknown query kind {kind!r}")


def query_result_from_sbs(value: dict[str, Any]) -> QueryResult:
    return QueryResult([event_from_sbs(e) for e in value["events"]], value["moreFollows"])


def init_req_to_sbs(
    client_name: str,
    client_token: str | None,
    subscriptions: Iterable[Sequence[str]],
    server_id: int | None,
    persisted: bool,
) -> dict[str, Any]:
    return {
        "clientName": client_name,
        "clientToken": _opt(client_token),
        "subscriptions": [list(t) for t in subscriptions],
        "serverId": _opt(server_id),
        "persisted": persisted,
    }


def optional_from_sbs(value: tuple[str, Any]) -> Any:
    return _from_opt(value)
