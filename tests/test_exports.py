"""The public names of ``rpc``, ``wire`` and ``transports`` are pinned: adding, removing or
renaming an export is a deliberate change to this list (and to the docs), never a side
effect. ``transports`` exports through its modules, so their ``__all__`` are pinned."""

from __future__ import annotations

import importlib

import pytest

EXPORTS = {
    "rpc": [
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
    ],
    "wire": [
        "COMPILABLE",
        "DEFAULT_MAX_SIZE",
        "ConversationError",
        "LocalProtocolError",
        "MalformedMessage",
        "MessageTooLarge",
        "ProtocolError",
        "UnsupportedVersion",
        "compiled",
    ],
    "wire.chatter": [
        "PING_TYPES",
        "ChatterConnection",
        "Conversation",
        "ConversationTracker",
        "Dialect",
        "FrameReader",
        "Msg",
        "decode_msg",
        "detect_dialect",
        "encode_frame",
        "encode_integer",
        "encode_msg",
        "frame_header",
    ],
    "wire.gotalk": [
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
    ],
    "wire.gossip": [
        "DEFAULT_MAX_NETIDS",
        "KEY_FILLER",
        "PADDING_SIZE",
        "START_BYTE",
        "BroadcastID",
        "BytesLike",
        "Gossip",
        "GossipCodec",
        "NetID",
        "decode_frame",
        "decode_gossip",
        "decode_varint",
        "derive_key",
        "encode_frame",
        "encode_gossip",
        "encode_varint",
        "payload_tag",
    ],
    "transports.stream": [
        "ByteSink",
        "ClosedBeforeReply",
        "ClosedHere",
        "ProtocolFactory",
        "TLS_SHUTDOWN_TIMEOUT",
        "TlsFailure",
        "TlsServer",
        "client_ssl_context",
        "open_stream",
        "server_address",
        "server_ssl_context",
        "start_stream_server",
        "tls_failure",
    ],
    "transports.websocket": [
        "HttpOptions",
        "WebSocketServer",
        "WebSocketTransport",
        "open_websocket",
        "start_websocket_server",
    ],
}


@pytest.mark.parametrize("name", list(EXPORTS))
def test_exported_names_are_pinned(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(EXPORTS[name]), (
        f"{name}.__all__ changed: added {sorted(set(module.__all__) - set(EXPORTS[name]))}, "
        f"removed {sorted(set(EXPORTS[name]) - set(module.__all__))}"
    )
    assert len(set(module.__all__)) == len(module.__all__), f"{name}.__all__ repeats a name"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what {name} does not define"


def test_transports_package_exports_through_its_modules() -> None:
    transports = importlib.import_module("transports")
    assert not hasattr(transports, "__all__")
    public = {n for n in vars(transports) if not n.startswith("_")}
    # only its submodules, as they get imported (by the tests above or by rpc)
    modules = {
        "logs",
        "read_buffer",
        "slow_input",
        "stream",
        "web_files",
        "web_http",
        "websocket",
        "ws_body",
        "ws_connection",
        "ws_head",
        "ws_held",
        "ws_input_rate",
        "ws_settings",
        "ws_transport",
    }
    assert public <= modules, public
