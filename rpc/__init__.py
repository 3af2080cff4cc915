"""peerwire RPC core: connections, requests, streams, handlers (see README)."""
