"""peerwire transports: move bytes between peers (TCP, TLS, WebSocket)."""

__peerwire__ = "transports"  # marks this package as peerwire's (see rpc._packages)
