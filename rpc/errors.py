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
    """The peer answered with a retry result and we ran out of retries or time (raised by a
    handler or middleware: answer with a retry result asking to wait ``wait`` seconds)."""

    def __init__(self, message: str, wait: float) -> None:
        super().__init__(message)
        self.wait = wait


CLOSING = "connection closing: not run"
"""The message of the retry result a peer closing gracefully answers a request with that
came during its drain (not run). A peerwire caller that gets it waits for the connection to
close (within its timeout) instead of sending the request again on it, then raises
RetryLater; other peers read it as any retry result."""

MAX_RETRY_WAIT_MS = 0xFFFFFFFF
"""The longest wait a retry result carries (Gotalk's field: 32 bits of milliseconds)."""


def retry_wait_ms(wait: float) -> int:
    """A retry result's ``wait`` (seconds) in whole milliseconds for the wire, taken within
    0..:data:`MAX_RETRY_WAIT_MS` (NaN: 0): a handler's wait of any value is answered."""
    if not 0 <= wait <= MAX_RETRY_WAIT_MS / 1000:
        return MAX_RETRY_WAIT_MS if wait > 0 else 0
    return int(wait * 1000)


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
    """Our stream's reader fell behind and stopped: ``Options.max_stream_queue`` (default
    256) results were waiting unread, the connection stopped reading for it, and it took
    none of them within the stream's ``item_timeout``. That stream alone fails (the peer is
    told, as on a cancel, when it speaks the peerwire extension), and reading resumes."""


class Rejected(RpcError):
    """Raised by middleware (or a handler) to refuse a call: the caller gets an error result
    with this message; metrics count it as ``rejected``."""


class UnknownOperation(RpcError):
    """No handler is registered for the op (the caller gets an error result saying so)."""


class TlsError(ConnectionClosed):
    """A TLS connection could not be set up; the text says why. Raised by ``connect``."""


class TlsRejected(TlsError):
    """The server did not accept this client: it closed the connection right after the TLS
    handshake (TLS 1.3 servers check client certificates then; Python servers send no
    alert), or its alert refused our certificate."""


class TlsCertificateRequired(TlsRejected):
    """The server requires a client certificate (its alert said so) and we sent none."""


class TlsUnknownCA(TlsError):
    """A certificate is signed by a CA the other side does not trust: the server's, by our
    context, or ours, by the server (its alert said so)."""


class TlsHostnameMismatch(TlsError):
    """The server's certificate is not valid for the host name we connected to."""


class TlsNotSpoken(TlsError):
    """One side speaks TLS and the other does not: the server answered our TLS handshake
    with plain bytes, or closed the connection during it (a plain port?)."""


TLS_ERRORS: dict[str, type[TlsError]] = {
    "certificate-required": TlsCertificateRequired,
    "rejected": TlsRejected,
    "unknown-ca": TlsUnknownCA,
    "hostname-mismatch": TlsHostnameMismatch,
    "not-tls": TlsNotSpoken,
    "tls": TlsError,
}
"""The error for each :class:`transports.stream.TlsFailure` kind."""
