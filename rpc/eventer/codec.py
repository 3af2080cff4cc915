"""SBS shapes of the Eventer values, and HatEventer messages as bytes.

``*_to_sbs`` / ``*_from_sbs`` convert :mod:`rpc.eventer.values` to and from the value
shapes hat-sbs uses for the ``HatEventer`` schema (Record = dict, Choice = ``(name,
value)``).

Peers of the eventer run with :func:`peer_repository` (every schema except ``HatEventer``),
so HatEventer payloads reach us as bytes and each event is encoded ONCE: a session notified
to ten clients, answered to its registrant and stored in SQLite is one SBS encoding, and
messages are concatenations of those bytes (:func:`encode_events`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from rpc.eventer.values import (
    MODULE,
    MSG_EVENTS_NOTIFY,
    Event,
    EventId,
    EventPayload,
    EventPayloadBinary,
    EventPayloadJson,
    EventType,
    InvalidMessage,
    Order,
    OrderBy,
    QueryLatestParams,
    QueryParams,
    QueryResult,
    QueryServerParams,
    QueryTimeseriesParams,
    RegisterEvent,
    Status,
    Timestamp,
)
from wire import schemas
from wire.sbs import encode_integer

if TYPE_CHECKING:
    import hat.sbs

HAT_SBS_ERRORS = schemas.SBS_ERRORS
"""What hat-sbs raises on undecodable input (:data:`wire.schemas.SBS_ERRORS`)."""


@functools.cache
def eventer_repository() -> hat.sbs.Repository:
    """The repository holding ``HatEventer`` (peerwire's schema folder)."""
    return schemas.repository()


@functools.cache
def peer_repository() -> hat.sbs.Repository:
    """Every peerwire schema except ``HatEventer``: peers given this repository hand
    HatEventer payloads over as bytes, which this package encodes and decodes itself."""
    import hat.sbs  # not at the top: its import is a third of ``import rpc``'s time

    texts = [text for name, text in schemas.schema_texts().items() if name != MODULE]
    return hat.sbs.Repository(*texts)


@functools.cache
def _ref(type_name: str) -> hat.sbs.Ref:
    import hat.sbs

    module, _, name = type_name.partition(".")
    return hat.sbs.Ref(module, name)  # hat-sbs parses a str name on every call otherwise


def encode(type_name: str, value: Any) -> bytes:
    data: bytes = eventer_repository().encode(_ref(type_name), value)
    return data


def decode(type_name: str, data: object) -> Any:
    """Decode, turning every hat-sbs failure (including its SystemError on truncated
    input) into :class:`InvalidMessage`, and so ``data`` that is not bytes (a reply that
    came as another type). The bytes are checked first (:func:`wire.schemas.check`):
    hat-sbs would allocate an Array from a peer's count."""
    if not isinstance(data, bytes):
        raise InvalidMessage(f"expected {type_name}, got {type(data).__name__}")
    repo = eventer_repository()
    try:
        schemas.check(repo, type_name, data)
        return repo.decode(_ref(type_name), data)
    except HAT_SBS_ERRORS as exc:
        raise InvalidMessage(f"{type_name}: {type(exc).__name__}: {exc}") from None


_EVENT = f"{MODULE}.Event"
_NONE = ("none", None)
_TRUE = b"\x01"
_FALSE = b"\x00"


def encode_event(value: dict[str, Any]) -> bytes:
    """SBS bytes of one ``HatEventer.Event`` in its hat-sbs shape."""
    data: bytes = eventer_repository().encode(_ref(_EVENT), value)
    return data


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
