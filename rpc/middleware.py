"""Middleware (interceptors): async callables wrapped around every call on a connection.

A middleware is ``async def mw(call: Call, call_next) -> result``: it sees the call, may
change it, and either returns ``await call_next(call)`` (the handler's result, or what the
next middleware made of it), returns a result of its own, or raises:

- :class:`~rpc.errors.Rejected` (or any exception): the caller gets an error result with
  its message; the connection lives on;
- :class:`~rpc.errors.RetryLater`: the caller gets a retry result (peers that do not take
  retry results, e.g. browsers, get an error result instead).

Where they are set and the order they run in, outermost first: ``serve(middleware=...)`` /
``connect(middleware=...)`` (every call of those connections, both directions), then
:meth:`Registry.use <rpc.registry.Registry.use>` (the calls its handlers serve), then the
handler. ``call.side`` says which way a call goes: ``"server"`` for calls the peer makes to
us, ``"client"`` for ours (requests and streams; ``notify()`` stays synchronous and
in order, so client middleware does not see it).

Limits: requests past ``Options.max_concurrent`` are answered by the core before any
middleware (as gRPC's ``max_concurrent_rpcs``); with middleware set, every incoming call
runs as a job of the peer's :class:`~rpc.handler_runner.HandlerRunner` (a task of its own
once it waits). For a streamed result the middleware gets the async iterator of its parts;
:func:`on_finish` helps to see its end. A stream request's parts are read once: a
``call_next`` after a handler read them to their end fails with RuntimeError (an error
result), as no part would come for it. With no middleware set nothing of this runs.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rpc import errors

if TYPE_CHECKING:
    from rpc.peer import Peer

CallNext = Callable[["Call"], Awaitable[Any]]
CallKind = Literal["request", "stream", "notification"]
Middleware = Callable[["Call", CallNext], Awaitable[Any]]

current_call: contextvars.ContextVar[Call] = contextvars.ContextVar("peerwire_current_call")
"""The call being served, while middleware and the handler run (``call.context`` holds what
middleware added, e.g. the authorised subject)."""


@dataclass(slots=True, eq=False)
class Call:
    """One call as middleware sees it."""

    op: str
    kind: CallKind
    """``stream``: a stream request (the handler reads parts)."""
    side: Literal["server", "client"]
    """``server``: the peer calls us; ``client``: we call the peer."""
    peer: Peer
    payload: Any
    """Server: the payload as received (bytes; for typed Chatter messages an
    ``rpc.chatter_payloads.Sbs``: its ``data``, and its ``value`` decoded when first read;
    the first part of a stream request). Client: the value given to ``request()``."""
    id: Any = None
    """The request id (Gotalk: 4 bytes; Chatter: the conversation). Client calls get it
    once sent; notifications have none."""
    metadata: dict[str, str] = field(default_factory=dict)
    """peerwire-only per-call metadata (trace context): received from, or sent to, peers
    that took request metadata at connect (extension level 2); never sent to any other
    peer. Client middleware add entries before calling ``call_next``."""
    context: dict[str, Any] = field(default_factory=dict)
    """Free room for middleware to pass things on (to each other and to the handler)."""
    deadline: float | None = None
    """Loop time (``peer.loop.time()``) by which the caller wants the result: a client's
    own deadline, or on a server the caller's that came with the request (the handler is
    cancelled past it). None: none known (notifications, streams, peers without request
    metadata, callers that chose no timeout)."""

    def time_left(self) -> float | None:
        """Seconds until :attr:`deadline` (negative once past; None without one): e.g. the
        ``timeout`` of the calls a handler makes on the caller's behalf."""
        if self.deadline is None:
            return None
        return self.deadline - self.peer.loop.time()

    @property
    def protocol(self) -> str:
        """``gotalk`` or ``chatter``."""
        return self.peer.protocol_name

    @property
    def address(self) -> Any:
        """The remote address (host, port) of the connection."""
        return self.peer.remote_address

    @property
    def certificate(self) -> dict[str, Any] | None:
        """The peer's verified TLS certificate (``ssl.SSLSocket.getpeercert()`` form), or
        None without TLS or without a client certificate."""
        transport = self.peer.transport
        return transport.get_extra_info("peercert") if transport is not None else None


def run(middleware: tuple[Middleware, ...], call: Call, innermost: CallNext) -> Awaitable[Any]:
    """Run ``call`` through ``middleware`` (first outermost), ending in ``innermost``: the
    outermost is called here, each other one through a ``call_next`` made per call (none
    for a chain of one)."""
    if not middleware:  # no chain to build (our calls when only served calls have middleware)
        return innermost(call)
    following = innermost
    for index in range(len(middleware) - 1, 0, -1):
        following = _link(middleware[index], following)
    return middleware[0](call, following)


def _link(mw: Middleware, following: CallNext) -> CallNext:
    """``call_next`` for the middleware before ``mw``: ``mw`` with ``following`` after it."""
    return lambda call: mw(call, following)


def on_finish(result: Any, finished: Callable[[BaseException | None], None]) -> Any:
    """``finished(error)`` once ``result`` is done: now for a plain result, after the last
    part (or the failure, or the consumer's leaving) for a streamed one, which is then
    returned wrapped."""
    if not inspect.isasyncgen(result):
        finished(None)
        return result
    return _watched(result, finished)


async def _watched(
    parts: AsyncGenerator[Any, Any], finished: Callable[[BaseException | None], None]
) -> AsyncIterator[Any]:
    """``parts``, then ``finished(error)``. When the consumer leaves early (cancels the
    stream, the connection closes) ``parts`` is closed here and then, so the handler's own
    cleanup (``finally``, ``async with lock``) runs now rather than whenever a garbage
    collection finds it; ``error`` is dropped first, as its traceback holds this frame."""
    error: BaseException | None = None
    try:
        async for part in parts:
            yield part
    except BaseException as exc:
        error = exc
        raise
    finally:
        try:
            finished(error)
        finally:
            error = None  # no frame -> exception -> traceback -> frame cycle
            await parts.aclose()


UNKNOWN_OP = "(unknown)"
"""The name metrics and spans give a served call whose op has no handler."""
MAX_OP_NAME = 128
"""Characters of a peer-sent op name kept where it is recorded as given (tracing's
``rpc.peerwire.requested_op``); default 128."""


def op_name(call: Call) -> str:
    """What metrics and spans call ``call``'s op: ours as we gave it; a served one as the
    peer sent it when the serving registry has a handler for it (a notification handler for
    a notification), else :data:`UNKNOWN_OP`, so a peer cannot grow the set of names."""
    if call.side == "client":
        return call.op
    registry = call.peer.registry
    if call.kind == "notification":
        known: object = registry.get_notification(call.op)
    else:
        known = registry.get(call.op)
    return call.op if known is not None else UNKNOWN_OP


def outcome(error: BaseException | None, side: str) -> str:
    """What a call's end is called in metrics and spans: ``ok``, ``retry``, ``cancelled``,
    or the kind of error (``rejected``, ``unknown_operation``, ``payload``, ``remote``,
    ``timeout``, ``connection``, and ``handler`` / ``local`` for any other exception on
    the server / client side)."""
    if error is None or isinstance(error, GeneratorExit):
        return "ok"  # a consumer that stops reading a streamed result is not an error
    for cls, name in _OUTCOMES:
        if isinstance(error, cls):
            return name
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"  # (a handler's other BaseExceptions are answered as errors)
    return "handler" if side == "server" else "local"


_OUTCOMES: tuple[tuple[type[BaseException], str], ...] = (
    (errors.RetryLater, "retry"),
    (errors.Rejected, "rejected"),
    (errors.UnknownOperation, "unknown_operation"),
    (errors.PayloadError, "payload"),
    (errors.RemoteError, "remote"),
    (errors.RequestTimeout, "timeout"),
    (errors.ConnectionClosed, "connection"),
)
