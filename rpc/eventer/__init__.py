"""Hat Eventer on peerwire's Chatter core: server with SQLite persistence, client.

- :class:`EventerServer` (``rpc.eventer.server``) and ``python -m rpc.eventer serve
  --config FILE`` run a server; :func:`connect` (``rpc.eventer.client``) is the client.
- The values (events, ids, queries) live in :mod:`rpc.eventer.common`.
"""

from rpc.eventer.client import Client, connect
from rpc.eventer.common import (
    Event,
    EventerError,
    EventerInitError,
    EventerInitTimeout,
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    EventType,
    Order,
    OrderBy,
    QueryError,
    QueryLatestParams,
    QueryParams,
    QueryResult,
    QueryServerParams,
    QueryTimeseriesParams,
    RegisterEvent,
    RegistrationTooLarge,
    Status,
    Subscription,
    Timestamp,
    now,
)
from rpc.eventer.config import ConfigError, ServerConfig, TlsConfig, load_config
from rpc.eventer.server import ClientInfo, EventerServer

__all__ = [
    "Client",
    "ClientInfo",
    "ConfigError",
    "Event",
    "EventId",
    "EventPayloadBinary",
    "EventPayloadJson",
    "EventType",
    "EventerError",
    "EventerInitError",
    "EventerInitTimeout",
    "EventerServer",
    "Order",
    "OrderBy",
    "QueryError",
    "QueryLatestParams",
    "QueryParams",
    "QueryResult",
    "QueryServerParams",
    "QueryTimeseriesParams",
    "RegisterEvent",
    "RegistrationTooLarge",
    "ServerConfig",
    "Status",
    "Subscription",
    "Timestamp",
    "TlsConfig",
    "connect",
    "load_config",
    "now",
]
