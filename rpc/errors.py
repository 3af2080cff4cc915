"""Exceptions the RPC core raises to callers."""

from __future__ import annotations

import sys

from rpc import _packages

# every rpc module imports this one: a `rpc/__init__.py` of another distribution fails here
_packages.check(sys.modules["rpc"])


class RpcError(Exception):
    """Base of every error a request can end with."""


class RemoteError(RpcError):
    """The peer answered with an error result (its handler failed or refused the input)."""


class RetryLater(RpcError):
    """The peer answered with a retry result and we ran out of retries or time."""

    def __init__(self, message: str, wait: float) -> None:
        super().__init__(message)
        self.wait = wait


class RequestTimeout(RpcError, TimeoutError):
    """No result arrived within the request's timeout (for a stream: its ``timeout`` for
    the whole stream, or its ``item_timeout`` for the next result)."""


class ConnectionClosed(RpcError, ConnectionError):
    """The connection closed before the result arrived (or before we could send)."""


class PayloadError(RpcError, ValueError):
    """A payload could not be encoded or decoded: a handler's parameters that do not match
    its declaration, bytes that are not valid JSON (or UTF-8, or SBS), a value with no JSON
    form, or a message above ``max_size``. On a server it becomes an error result for that
    one request (a notification is dropped with a warning); the connection lives on."""


class StreamOverflow(RpcError):
    """Our stream's results arrived faster than we read them: more than
    ``Options.max_stream_queue`` (default 256) were waiting unread. That stream alone fails
    (the peer is told, as on a cancel, when it speaks the peerwire extension); read faster
    or raise the limit."""


class Rejected(RpcError):
    """Raised by middleware (or a handler) to refuse a call: the caller gets an error result
    with this message; metrics count it as ``rejected``."""


class UnknownOperation(RpcError):
    """No handler is registered for the op (the caller gets an error result saying so)."""
