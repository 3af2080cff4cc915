"""The core's paths for connections with middleware or the request envelope.

:class:`~rpc.peer.Peer` hands its calls here, in both directions, once it has middleware
(:mod:`rpc.middleware`) or takes peerwire's request envelope (:mod:`wire.envelope`); a
connection with neither never comes here. Apart from running the middleware chain (each
incoming call as a task, so it may await) and wrapping payloads in the envelope, every step
is the one of the plain path in :mod:`rpc.peer`, whose per-connection state it shares: the
same handler slots, incoming streams, outstanding calls and deadlines.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from rpc import middleware as mw
from rpc import peer as core  # importing this module; its names are used at call time only
from rpc.errors import PayloadError, Rejected, RetryLater, UnknownOperation
from rpc.middleware import Call
from rpc.payload import encode_value
from rpc.registry import Handler, HandlerKind
from wire import envelope
from wire.errors import ProtocolError

if TYPE_CHECKING:
    from rpc.peer import Peer

log = logging.getLogger("peerwire.rpc")


def _enter(peer: Peer, call: Call) -> None:
    """Set the context variables of a served call (in its task's own context)."""
    core.current_peer.set(peer)
    mw.current_call.set(call)


# --- calls the peer makes to us ---------------------------------------------------------------


def serve_request(peer: Peer, key: Any, op: str, payload: Any, stream: bool) -> None:
    """An incoming request or stream request: the chain runs as one of the peer's tasks."""
    adapter = peer.adapter
    if len(peer._tasks) >= peer.options.max_concurrent:
        adapter.send_retry(key, peer.options.retry_wait, "request rate limit")
        if stream:
            peer._end_stream(key)
        return
    metadata: dict[str, str] = {}
    if peer.envelope and payload.__class__ is bytes:
        try:
            metadata, payload = envelope.unpack(payload)
        except ProtocolError as exc:
            adapter.send_error(key, f"bad peerwire envelope: {exc}")
            if stream:
                peer._end_stream(key)
            return
    handler = peer.registry.get(op)
    queue: asyncio.Queue[Any] | None = None
    if stream:
        if handler is not None and handler.kind is HandlerKind.STREAM:
            queue = asyncio.Queue()
            peer._streams[key] = queue
            if payload:
                queue.put_nowait(payload)
        else:
            peer._end_stream(key)  # its parts are dropped; the chain says why
    call = Call(op, "stream" if stream else "request", "server", peer, payload, key, metadata)
    peer._tasks.spawn(_serve(peer, call, handler, queue))


async def _serve(
    peer: Peer, call: Call, handler: Handler | None, queue: asyncio.Queue[Any] | None
) -> None:
    key, stream, adapter = call.id, call.kind == "stream", peer.adapter
    _enter(peer, call)
    try:
        result = await mw.run(peer.middleware, call, lambda c: _handle(c, handler, queue))
    except RetryLater as exc:
        _end(peer, key, stream)
        if peer.is_open:
            if adapter.retry_results:
                adapter.send_retry(key, exc.wait, str(exc))
            else:
                adapter.send_error(key, str(exc) or "retry later")
        return
    except Exception as exc:
        _end(peer, key, stream)
        if not isinstance(exc, Rejected | UnknownOperation | PayloadError):
            log.debug("handler %r failed", call.op, exc_info=True)
        if peer.is_open:
            adapter.send_error(key, str(exc) or type(exc).__name__)
        return
    if inspect.isasyncgen(result):
        await peer._stream_result(key, result)
        return
    if peer.outbox.blocked:
        await peer.outbox.wait_writable()
    if peer.is_open:
        peer._reply(key, result, stream)
    else:
        _end(peer, key, stream)


def _end(peer: Peer, key: Any, stream: bool) -> None:
    if stream and key in peer._streams:
        peer._end_stream(key)


async def _handle(call: Call, handler: Handler | None, queue: asyncio.Queue[Any] | None) -> Any:
    """The innermost step: the handler itself (a streamed result is returned unread)."""
    peer = call.peer
    if handler is None:
        raise UnknownOperation(f'unknown operation "{call.op}"')
    if (handler.kind is HandlerKind.STREAM) != (call.kind == "stream"):
        kind = "stream" if call.kind == "stream" else "single"
        raise UnknownOperation(f'operation "{call.op}" does not take {kind} requests')
    if queue is not None:
        result = handler.fn(core._parts(queue, handler.decode))
    else:
        result = handler.fn(peer.adapter.decode_params(handler, call.payload))
    if not inspect.isasyncgen(result) and inspect.isawaitable(result):
        result = await result
    return result


def serve_notification(peer: Peer, name: str, payload: Any) -> None:
    """An incoming notification: the chain runs as one of the peer's tasks."""
    call = Call(name, "notification", "server", peer, payload)
    handler = peer.registry.get_notification(name)
    peer._tasks.spawn(_notify(peer, call, handler))


async def _notify(peer: Peer, call: Call, handler: Handler | None) -> None:
    _enter(peer, call)
    try:
        await mw.run(peer.middleware, call, lambda c: _handle_notification(c, handler))
    except (Rejected, UnknownOperation, RetryLater) as exc:
        log.debug("notification %r from %s dropped: %s", call.op, peer.remote_address, exc)
    except PayloadError as exc:
        log.warning("notification %r from %s dropped: %s", call.op, peer.remote_address, exc)
    except Exception:
        log.exception("notification handler %r failed", call.op)


async def _handle_notification(call: Call, handler: Handler | None) -> None:
    if handler is None:
        raise UnknownOperation(f'no handler for notification "{call.op}"')
    result = handler.fn(call.peer.adapter.decode_params(handler, call.payload))
    if inspect.isawaitable(result):
        await result


# --- calls we make ------------------------------------------------------------------------------


def _encoded(peer: Peer, call: Call, data: bytes) -> bytes:
    if peer.envelope:
        data = envelope.pack(data, call.metadata)
    return peer._checked_payload(call.op, data)


async def request(peer: Peer, op: str, value: Any, timeout: float | None, raw: bool) -> Any:
    """:meth:`Peer.request` through the chain: one run of it per attempt, so middleware
    see every retry result (as :class:`RetryLater`) and may replace it."""
    timeout = peer._timeout(timeout)
    loop = peer.loop
    deadline = loop.time() + timeout
    call = Call(op, "request", "client", peer, value)
    attempt = 0
    while True:
        try:
            return await mw.run(
                peer.options.middleware, call, lambda c: _attempt(c, deadline, timeout, raw)
            )
        except RetryLater as reply:
            attempt += 1
            wait = reply.wait * (1 + 0.5 * random.random())
            if attempt > peer.options.retries or loop.time() + wait > deadline:
                raise
            await asyncio.sleep(wait)


async def _attempt(call: Call, deadline: float, timeout: float, raw: bool) -> Any:
    peer = call.peer
    adapter = peer.adapter
    payload = _encoded(peer, call, adapter.encode_request(call.op, call.payload))

    def sent(key: Any) -> None:
        call.id = key

    reply = await peer.send_and_wait(call.op, payload, deadline, timeout, sent)
    if reply.__class__ is RetryLater:
        raise reply
    return reply if raw else adapter.decode_result(reply)


async def stream(
    peer: Peer,
    op: str,
    parts: Iterable[Any] | AsyncIterable[Any] | None,
    value: Any,
    wait: core.ResultWait,
    raw: bool,
) -> AsyncIterator[Any]:
    """:meth:`Peer.stream` through the chain: the innermost step sends the request (and
    its parts) and returns the async iterator of results."""
    kind = "request" if parts is None else "stream"
    call = Call(op, kind, "client", peer, value if parts is None else parts)
    try:
        results = await mw.run(peer.options.middleware, call, lambda c: _open_stream(c, wait, raw))
        async for item in results:
            yield item
    finally:
        if call.id is not None and peer._calls.pop(call.id, None) is not None:
            peer.adapter.abandon(call.id)


async def _open_stream(call: Call, wait: core.ResultWait, raw: bool) -> AsyncIterator[Any]:
    peer = call.peer
    adapter = peer.adapter
    await wait.bounded(peer.outbox.wait_writable())
    peer._check_open()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    if call.kind == "request":
        payload = _encoded(peer, call, adapter.encode_request(call.op, call.payload))
        key = call.id = adapter.send_request(call.op, payload, False)
        peer._calls[key] = core._Call(None, queue, None)
    else:
        iterator = core._aiter(call.payload)
        first = await wait.bounded(anext(iterator, core._END))
        data = _encoded(peer, call, b"" if first is core._END else encode_value(first))
        key = call.id = adapter.send_request(call.op, data, True)
        peer._calls[key] = core._Call(None, queue, None)
        if first is not core._END:
            await peer.send_parts(call.op, key, iterator, wait)
        adapter.send_request_end(key)
    return _results(call, queue, wait, raw)


async def _results(
    call: Call, queue: asyncio.Queue[Any], wait: core.ResultWait, raw: bool
) -> AsyncIterator[Any]:
    adapter = call.peer.adapter
    while True:
        item = await wait.next(queue)
        if item is core._END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item if raw else adapter.decode_result(item)
