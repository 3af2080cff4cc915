"""peerwire's RPC core: handlers, ``connect(url)`` and ``serve(url)``.

import rpc

@rpc.handle("greet")
def greet(params: dict) -> dict:
    return {"greeting": f"Hello {params['name']}"}

async with rpc.serve("tcp+gotalk://127.0.0.1:0") as server:
    async with rpc.connect(str(server.url)) as peer:
        await peer.request("greet", {"name": "Ada"})
"""

__peerwire__ = "rpc"  # marks this package as peerwire's (see rpc._packages)

from rpc import _packages

# another distribution's `wire` or `transports` must fail here, naming it, not deep inside
_packages.require("wire")
_packages.require("transports")

from wire import schemas

# a broken install fails at import with SchemaNotFound, not later inside a Chatter connection
schemas.schema_texts()

from rpc import blocking
from rpc.api import Server, connect, serve
from rpc.backoff import Backoff, Reconnect
from rpc.chatter_payloads import Reply
from rpc.chatter_peer import ChatterPeer
from rpc.errors import (
    ConnectionClosed,
    Rejected,
    RemoteError,
    RequestTimeout,
    RetryLater,
    RpcError,
    StreamOverflow,
    TlsCertificateRequired,
    TlsError,
    TlsHostnameMismatch,
    TlsNotSpoken,
    TlsRejected,
    TlsUnknownCA,
    UnknownOperation,
)
from rpc.gotalk_peer import GotalkPeer
from rpc.middleware import Call, Middleware, current_call
from rpc.payload import PayloadError
from rpc.peer import Options, Peer, current_peer
from rpc.reconnect import ConnectionState, ReconnectingPeer, Transition
from rpc.registry import Registry, default_registry, handle, handle_notification, handle_stream
from rpc.url import PeerUrl, UrlError, parse_url

__all__ = [
    "Backoff",
    "Call",
    "ChatterPeer",
    "ConnectionClosed",
    "ConnectionState",
    "GotalkPeer",
    "Middleware",
    "Options",
    "PayloadError",
    "Peer",
    "PeerUrl",
    "Reconnect",
    "ReconnectingPeer",
    "Registry",
    "Rejected",
    "RemoteError",
    "Reply",
    "RequestTimeout",
    "RetryLater",
    "RpcError",
    "Server",
    "StreamOverflow",
    "TlsCertificateRequired",
    "TlsError",
    "TlsHostnameMismatch",
    "TlsNotSpoken",
    "TlsRejected",
    "TlsUnknownCA",
    "Transition",
    "UnknownOperation",
    "UrlError",
    "blocking",
    "connect",
    "current_call",
    "current_peer",
    "default_registry",
    "handle",
    "handle_notification",
    "handle_stream",
    "parse_url",
    "serve",
]
