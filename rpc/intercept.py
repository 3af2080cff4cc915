"""The core's paths for calls with middleware or request metadata.

:class:`~rpc.peer.Peer` hands its calls here, in both directions, once it has middleware
(:mod:`rpc.middleware`); its protocol adapter hands over incoming requests that came with
metadata (:mod:`wire.metadata`: trace context, the caller's time left). A connection with
neither never comes here. Apart from running the middleware chain (each incoming call as a
job of the peer's :class:`~rpc.handler_runner.HandlerRunner`, so it may await), bounding
handlers by the caller's deadline and sending metadata before requests, every step is the
one of the plain path in :mod:`rpc.peer`, whose per-connection state it shares: the same
handler slots, incoming streams, running handlers (which the cancellation extension
cancels), outstanding calls and deadlines.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Mapping
from types import CoroutineType
from typing import TYPE_CHECKING, Any

from rpc import middleware as mw
from rpc import peer as core  # importing this module; its names are used at call time only
from rpc.call_bounds import BoundPassed
from rpc.closing import refused_closing, stream_error
from rpc.errors import (
    ConnectionClosed,
    PayloadError,
    Rejected,
    RequestTimeout,
    RetryLater,
    UnknownOperation,
)
from rpc.handler_results import OWN_CANCEL, PLAIN_RESULTS
from rpc.logs import violations
from rpc.middleware import Call, CallKind
from rpc.notifications import failures
from rpc.registry import Handler, HandlerKind
from rpc.request_bytes import counted_size
from rpc.streaming import END, ResultWait, StreamQueue
from wire.metadata import RequestMeta

if TYPE_CHECKING:
    from rpc.peer import Peer
    from rpc.request_meta import MetaState

log = logging.getLogger("peerwire.rpc")

_REQUEST, _STREAM = HandlerKind.REQUEST, HandlerKind.STREAM
"""Module globals: an Enum member read off its class costs about 100 ns in Python 3.11."""

_UNSEEN: Any = object()
"""``_handle``'s ``first`` for a call as received: its payload needs no comparing."""

DEADLINE_GRACE = 0.1
"""Seconds a handler may run past its caller's deadline before we cancel it: the caller
gives up first (its RequestTimeout, and its cancel if it took the extension), so our
error result for an overdue handler reaches only callers that could not say so."""


def _enter(peer: Peer, call: Call) -> None:
    """Set the context variables of a served call (in its job's own context)."""
    core.current_peer.set(peer)
    mw.current_call.set(call)


# --- calls the peer makes to us ---------------------------------------------------------------


def request_with_meta(
    peer: Peer, state: MetaState[Any], key: Any, first: Any, op: str, payload: Any, stream: bool
) -> None:
    """An incoming request while metadata waits or a default timeout is set (``state``, the
    adapter's): served with the metadata sent for it (matched by ``first``, its id on the
    wire), if any, else as any other."""
    taken = state.take(first, peer.read_at)
    if taken is None:
        peer.on_request(key, op, payload, stream)
    else:
        serve_with_meta(peer, key, op, payload, stream, *taken)


def serve_with_meta(
    peer: Peer,
    key: Any,
    op: str,
    payload: Any,
    stream: bool,
    meta: RequestMeta,
    received_at: float,
) -> None:
    """An incoming request that came with metadata, read at loop time ``received_at``.

    Past the caller's deadline already (it waited in our input while reading was paused,
    or the caller sent no time at all), it gets an error result at once, before any
    middleware, and its handler never runs. Otherwise an async handler runs bounded by
    that deadline (plus :data:`DEADLINE_GRACE`). On a connection without middleware the
    plain path serves a plain function (which cannot be interrupted) and a request with
    trace context alone, and an ``async def`` handler's single request too, bounded there
    (:meth:`~rpc.responder.Responder.serve_bounded`): no chain to run."""
    deadline = None
    if meta.timeout_ms is not None:
        deadline = received_at + meta.timeout_ms / 1000
        if deadline <= peer.loop.time():
            log.debug("%s from %s: deadline passed on arrival", op, peer.remote_address)
            if stream:
                peer._end_stream(key)
            peer.adapter.send_error(key, f"{op}: the caller's deadline passed before it ran")
            return
    handler = peer.registry.get(op)
    if not peer.middleware:
        if deadline is None or handler is None or not handler.is_async:
            peer.on_request(key, op, payload, stream)  # nothing to bound: the plain path
            return
        if handler.coroutine and not stream and handler.kind is _REQUEST:
            call = Call(
                op, "request", "server", peer, payload, key, dict(meta.entries), deadline=deadline
            )
            peer.serve_bounded(key, handler, payload, call, deadline + DEADLINE_GRACE)
            return
    serve_request(peer, key, op, payload, stream, dict(meta.entries), deadline, handler)


def serve_request(
    peer: Peer,
    key: Any,
    op: str,
    payload: Any,
    stream: bool,
    metadata: dict[str, str] | None = None,
    deadline: float | None = None,
    handler: Handler | None = None,
) -> None:
    """An incoming request or stream request: the chain runs as a job of the peer's runner
    (which a cancel from the caller cancels), its handler (``op``'s, unless the caller
    looked it up already) bounded by ``deadline``."""
    adapter = peer.adapter
    if peer.refuses(key, stream):  # past the limits, or closing
        return
    if handler is None:
        handler = peer.registry.get(op)
    queue: StreamQueue | None = None
    if stream:
        if (handler is not None and handler.kind is _STREAM) or peer.middleware:
            queue = peer.open_parts(key)
            if payload:
                queue.put(payload)
        else:  # no middleware to give the call another op: its parts are dropped
            peer._end_stream(key)  # (the error result says why)
    kind: CallKind = "stream" if stream else "request"
    call = Call(op, kind, "server", peer, payload, key, metadata or {}, deadline=deadline)
    if adapter.cancels:  # before the job can run (and end)
        peer._running.add(key)
    size = 0 if stream else counted_size(payload)
    peer._runner.submit(key, _serve(peer, call, handler, queue), None, size, queue)


async def _serve(
    peer: Peer, call: Call, handler: Handler | None, queue: StreamQueue | None
) -> None:
    """Run the chain for one incoming call and send its outcome: a job of the peer's
    :class:`~rpc.handler_runner.HandlerRunner`."""
    try:
        key, stream, adapter = call.id, call.kind == "stream", peer.adapter
        _enter(peer, call)
        try:
            if peer.middleware:
                result = await mw.run(peer.middleware, call, _innermost(call, handler, queue))
            else:  # a call that came with a deadline: no chain to build
                result = await _handle(call, handler, queue)
        except asyncio.CancelledError as exc:
            _end(peer, key, stream)
            if peer.own_cancel():  # the handler's own: an error as any other
                peer._running.discard(key)
                if peer.is_open:
                    peer._answer(adapter.send_error, key, str(exc) or OWN_CANCEL)
                return
            if key not in peer._running and peer.is_open:  # the caller cancelled (on_cancel)
                peer._answer(adapter.send_error, key, "cancelled by the caller")  # ends it
            peer._running.discard(key)
            raise
        except RetryLater as exc:
            peer._running.discard(key)
            _end(peer, key, stream)
            if peer.is_open:
                peer._answer(peer.send_retry_later, key, exc)
            return
        except Exception as exc:
            peer._running.discard(key)
            _end(peer, key, stream)
            if not isinstance(exc, Rejected | UnknownOperation | PayloadError):
                log.debug("handler %r failed", call.op, exc_info=True)
            if peer.is_open:
                peer._answer(adapter.send_error, key, str(exc) or type(exc).__name__)
            return
        if result.__class__ not in PLAIN_RESULTS and inspect.isasyncgen(result):
            await peer._stream_result(key, result)  # a cancel from now on ends it there
            return
        peer._running.discard(key)
        if peer.outbox.blocked:
            await peer.outbox.wait_writable()
        if peer.is_open:
            peer._answer(peer._reply, key, result, stream)
        else:
            _end(peer, key, stream)
    except ConnectionClosed:
        pass  # gone while waiting to write: nothing to answer to
    except Exception:  # a bug of ours: no done callback would report it
        log.exception("the result of a request could not be sent")


def _end(peer: Peer, key: Any, stream: bool) -> None:
    if stream and key in peer._streams:
        peer._end_stream(key)


def _innermost(received: Call, handler: Handler | None, queue: StreamQueue | None) -> mw.CallNext:
    """The last ``call_next`` of a served call's chain: ``handler`` (``received.op``'s) for
    the call as received; for one middleware changed or replaced, the handler of its op,
    and its payload (a stream request's first part too)."""
    op, first = received.op, received.payload
    given = False  # a stream request's parts handed to a handler already

    def innermost(call: Call) -> Any:
        nonlocal given
        if queue is not None:
            if given and not len(queue) and received.peer._streams.get(received.id) is not queue:
                return _parts_gone(op)  # they ended: a second reader would wait forever
            given = True
        if call is received and call.op is op and call.payload is first:  # the common case
            return _handle(call, handler, queue)
        return _handle(call, _changed(call, received, op, handler, False), queue, first)

    return innermost


async def _parts_gone(op: str) -> Any:
    """``call_next`` once more for a stream request whose parts an earlier one's handler
    read to their end (or failure): nothing is left for another handler to read."""
    raise RuntimeError(f"{op}: the stream request's parts were all taken by an earlier call")


def _changed(
    call: Call, received: Call, op: str, handler: Handler | None, notification: bool
) -> Handler | None:
    """The handler for a call middleware changed or replaced (``received``: the call as
    received, for ``op``): looked up again when its op is another one; ``current_call`` is
    the call the handler is given from now on."""
    if call is not received:
        mw.current_call.set(call)
    if call.op == op:
        return handler
    registry = call.peer.registry
    return registry.get_notification(call.op) if notification else registry.get(call.op)


async def _handle(
    call: Call, handler: Handler | None, queue: StreamQueue | None, first: Any = _UNSEEN
) -> Any:
    """The innermost step: the handler itself (a streamed result is returned unread);
    ``handler`` is ``call.op``'s, ``first`` the payload received if middleware may have
    changed it (else :data:`_UNSEEN`)."""
    peer = call.peer
    if handler is None:
        raise UnknownOperation(f'unknown operation "{call.op}"')
    if (handler.kind is _STREAM) != (call.kind == "stream"):
        kind = "stream" if call.kind == "stream" else "single"
        raise UnknownOperation(f'operation "{call.op}" does not take {kind} requests')
    if queue is not None:
        parts = core._parts(queue, handler.decode)
        if first is not _UNSEEN and call.payload is not first:  # middleware changed it
            parts = _first_replaced(call.payload, first, queue, parts, handler.decode)
        result = handler.fn(parts)
    else:
        result = handler.fn(peer.adapter.decode_params(handler, call.payload))
    if result.__class__ in PLAIN_RESULTS:  # no inspect checks (ABC checks, slow)
        return result
    deadline = call.deadline
    if result.__class__ is not CoroutineType and inspect.isasyncgen(result):
        return result if deadline is None else _parts_until(call, result, deadline)
    if result.__class__ is CoroutineType or inspect.isawaitable(result):
        if deadline is None:
            return await result
        try:
            return await peer.call_bounds.within(result, deadline + DEADLINE_GRACE, call.op)
        except BoundPassed as exc:  # middleware see a RequestTimeout
            raise RequestTimeout(str(exc)) from None
    return result


def _first_replaced(
    first: Any, received: Any, queue: StreamQueue, parts: AsyncIterator[Any], decode: Any
) -> AsyncIterator[Any]:
    """A stream handler's parts when middleware changed ``call.payload`` (the request's first
    part): ``first`` in place of ``received``, queued first (none if it is empty)."""
    if received and len(queue):
        queue.take()
    return _after(first, parts, decode) if first else parts


async def _after(first: Any, parts: AsyncIterator[Any], decode: Any) -> AsyncIterator[Any]:
    yield decode(first)
    async for part in parts:
        yield part


async def _parts_until(call: Call, parts: Any, deadline: float) -> AsyncIterator[Any]:
    """A handler's streamed result, each next part bounded by the caller's deadline."""
    bounds = call.peer.call_bounds
    try:
        while True:
            try:
                part = await bounds.within(anext(parts), deadline + DEADLINE_GRACE, call.op)
            except StopAsyncIteration:
                return
            except BoundPassed as exc:
                raise RequestTimeout(str(exc)) from None
            yield part
    finally:
        await parts.aclose()


def serve_notification(peer: Peer, name: str, payload: Any) -> None:
    """An incoming notification: the chain runs as one of the peer's tasks."""
    call = Call(name, "notification", "server", peer, payload)
    handler = peer.registry.get_notification(name)
    peer._tasks.spawn(_notify(peer, call, handler))


async def _notify(peer: Peer, call: Call, handler: Handler | None) -> None:
    _enter(peer, call)
    name = call.op

    def innermost(c: Call) -> Any:
        if c is call and c.op is name:
            return _handle_notification(c, handler)
        return _handle_notification(c, _changed(c, call, name, handler, True))

    try:
        await mw.run(peer.middleware, call, innermost)
    except (Rejected, UnknownOperation, RetryLater) as exc:
        log.debug("notification %r from %s dropped: %s", call.op, peer.remote_address, exc)
    except PayloadError as exc:  # the peer's fault, per message: rate-limited
        violations.warning("notification %r from %s dropped: %s", call.op, peer.remote_address, exc)
    except Exception:
        failures.exception("notification handler %r failed", call.op)


async def _handle_notification(call: Call, handler: Handler | None) -> None:
    if handler is None:
        raise UnknownOperation(f'no handler for notification "{call.op}"')
    result = handler.fn(call.peer.adapter.decode_params(handler, call.payload))
    if inspect.isawaitable(result):
        await result


# --- calls we make ------------------------------------------------------------------------------


def _encoded(peer: Peer, call: Call, data: bytes) -> bytes:
    checked: bytes = peer._checked_payload(call.op, data)
    return checked


def _metadata(call: Call, timed: bool) -> Mapping[str, str] | None:
    """What goes before the request: None (nothing) unless the peer takes request metadata
    and there is some (entries, or a deadline the caller chose)."""
    if (timed or call.metadata) and call.peer.adapter.metadata:
        return call.metadata
    return None


async def request(peer: Peer, op: str, value: Any, timeout: float | None, raw: bool) -> Any:
    """:meth:`Peer.request` through the chain: one run of it per attempt, so middleware
    see every retry result (as :class:`RetryLater`) and may replace it. A timeout the
    caller chose (``timeout`` or ``options.timeout``) travels to peers that take request
    metadata, as does what middleware put in ``call.metadata``."""
    timed = timeout is not None or peer.options.timeout is not None
    timeout = peer._timeout(timeout)
    loop = peer.loop
    deadline = loop.time() + timeout
    call = Call(op, "request", "client", peer, value, deadline=deadline)
    attempt = 0
    while True:
        try:
            return await mw.run(
                peer.options.middleware,
                call,
                lambda c: _attempt(c, deadline, timeout, raw, timed),
            )
        except RetryLater as reply:
            if await refused_closing(reply, peer.closed, deadline, loop):  # as Peer.request
                raise
            attempt += 1
            wait = reply.wait * (1 + 0.5 * random.random())
            if attempt > peer.options.retries or loop.time() + wait > deadline:
                raise
            await asyncio.sleep(wait)
            if not peer.is_open:  # closed meanwhile: not run, as Peer.request says
                raise


async def _attempt(call: Call, deadline: float, timeout: float, raw: bool, timed: bool) -> Any:
    peer = call.peer
    adapter = peer.adapter
    payload = _encoded(peer, call, adapter.encode_request(call.op, call.payload))

    def sent(key: Any) -> None:
        call.id = key

    metadata = _metadata(call, timed)
    reply = await peer.send_and_wait(call.op, payload, deadline, timeout, sent, metadata, timed)
    if reply.__class__ is RetryLater:
        raise reply
    return reply if raw else adapter.decode_result(reply)


async def stream(
    peer: Peer,
    op: str,
    parts: Iterable[Any] | AsyncIterable[Any] | None,
    value: Any,
    wait: ResultWait,
    raw: bool,
) -> AsyncGenerator[Any, None]:
    """:meth:`Peer.stream` through the chain: the innermost step sends the request (and
    its parts) and returns the async iterator of results."""
    kind: CallKind = "request" if parts is None else "stream"
    payload = value if parts is None else parts
    call = Call(op, kind, "client", peer, payload, deadline=wait.deadline)
    # the keys of what the chain sent: a middleware may pass call_next another call (whose
    # id this call never gets), or call it twice; each is forgotten here, its hold ended
    sent: list[Any] = []
    try:
        chain = peer.options.middleware
        results = await mw.run(chain, call, lambda c: _open_stream(c, wait, raw, sent))
        async for item in results:
            yield item
    finally:
        for key in sent:
            peer._forget(key)


async def _open_stream(
    call: Call, wait: ResultWait, raw: bool, sent: list[Any]
) -> AsyncIterator[Any]:
    peer = call.peer
    adapter = peer.adapter
    wait.check()
    if peer.outbox.blocked:
        await wait.bounded(peer.outbox.wait_writable(), each=True)
    peer._check_open()
    queue = StreamQueue(peer.loop, wait.item)
    metadata = _metadata(call, call.deadline is not None)
    if call.kind == "request":
        payload = _encoded(peer, call, adapter.encode_request(call.op, call.payload))
        call.id = peer.open_results(lambda: _send_request(call, payload, False, metadata), queue)
    else:
        call.id = await peer.send_stream_request(
            call.op,
            call.payload,
            queue,
            wait,
            lambda data: _send_request(call, _encoded(peer, call, data), True, metadata),
        )
    sent.append(call.id)
    return _results(call, queue, wait, raw)


def _send_request(
    call: Call, payload: bytes, stream: bool, metadata: Mapping[str, str] | None
) -> Any:
    peer = call.peer
    if metadata is None:
        return peer.adapter.send_request(call.op, payload, stream)
    left = None if call.deadline is None else call.deadline - peer.loop.time()
    return peer.adapter.send_request_meta(call.op, payload, stream, metadata, left)


async def _results(
    call: Call, queue: StreamQueue, wait: ResultWait, raw: bool
) -> AsyncIterator[Any]:
    adapter = call.peer.adapter
    while True:
        item = await wait.next(queue)
        if item is END:
            return
        if isinstance(item, BaseException):
            raise await stream_error(item, call.peer.closed, wait)
        yield item if raw else adapter.decode_result(item)
