"""peerwire transports: move bytes between peers (TCP, TLS, WebSocket)."""
