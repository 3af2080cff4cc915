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
    """No result arrived within the request's timeout."""


class ConnectionClosed(RpcError, ConnectionError):
    """The connection closed before the result arrived (or before we could send)."""


class UnknownOperation(RpcError):
    """Raised inside a peer when no handler is registered for an operation."""
