"""The protocol-independent half of a connection: correlation, dispatch, timers, limits.

A :class:`Peer` is driven by a transport (``connection_made`` / ``data_received`` /
``connection_lost``) and by the application (``request``, ``stream``, ``notify``). A
protocol subclass (:mod:`rpc.gotalk_peer`, :mod:`rpc.chatter_peer`) turns codec messages
into the ``_on_*`` events below and the ``_send_*`` calls into codec messages.

Hot path: synchronous handlers run inline inside ``data_received``; a task is created
only for a coroutine handler; all output produced while handling one read is written with
one ``transport.write``; results of async work are flushed once per loop iteration.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rpc.errors import ConnectionClosed, RemoteError, RequestTimeout, RetryLater
from rpc.payload import PayloadError, decode_any, encode_value
from rpc.registry import Handler, HandlerKind, Registry, default_registry
from wire.errors import ProtocolError

log = logging.getLogger("peerwire.rpc")

current_peer: contextvars.ContextVar[Peer] = contextvars.ContextVar("peerwire_current_peer")
"""The peer whose request is being handled; lets a handler call back into its caller."""

_END = object()
FLUSH_EVERY = 16
"""Messages queued before a flush is forced. Writes are coalesced per loop iteration, but
a burst (100 replies from one read) is cut into writes of 16 so the peer starts working
on the first ones while we encode the rest; measured +20-30% with 100 in flight."""
# result types that are never awaitable: skip inspect.isasyncgen/isawaitable (ABC checks)
_PLAIN_RESULTS = frozenset({bytes, bytearray, str, int, float, bool, dict, list, type(None)})


@dataclass(slots=True)
class Options:
    """Per-connection settings (every limit is per connection)."""

    timeout: float | None = None
    """Seconds a request waits for its result; None = the protocol's default (Chatter 5 s,
    the seeds' conversation timeout; Gotalk 30 s)."""
    max_concurrent: int = 1024
    """Requests handled at once; past it the peer answers with a retry result."""
    retry_wait: float = 0.5
    """Wait we ask for in our retry results, in seconds."""
    retries: int = 5
    """How often ``request`` honours a retry result before raising RetryLater."""
    max_size: int = 16 * 1024 * 1024
    """Largest message accepted (codec limit)."""
    max_stream_queue: int = 256
    """Buffered parts per incoming stream before the stream is failed."""


class _Call:
    """One outstanding request of ours."""

    __slots__ = ("deadline", "future", "queue")

    def __init__(
        self,
        future: asyncio.Future[Any],
        queue: asyncio.Queue[Any] | None,
        deadline: float | None = None,
    ) -> None:
        self.future = future
        self.queue = queue
        self.deadline = deadline


class _Expired(Exception):
    """Set on a call's future by the deadline sweep."""


class Peer:
    """One connection's RPC state. Subclasses implement the ``_send_*`` methods and
    ``_receive`` (bytes -> ``_on_*`` events)."""

    protocol_name = "?"
    default_timeout = 30.0

    def __init__(self, registry: Registry | None = None, options: Options | None = None) -> None:
        self.registry = registry if registry is not None else default_registry
        self.options = options or Options()
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._calls: dict[Any, _Call] = {}
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._sweep_at = float("inf")
        # incoming stream requests; None = refused, its parts are dropped
        self._incoming_streams: dict[Any, asyncio.Queue[Any] | None] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._active = 0
        self._write_ready: asyncio.Future[None] | None = None
        self._framed = False
        self._queued = 0
        self.closed: asyncio.Future[BaseException | None] = self._loop.create_future()
        """Resolves (with the transport's exception or None) once the connection is gone."""
        self.remote_address: Any = None
        self.on_open: Callable[[Peer], Any] | None = None
        """Called once the connection is up (a coroutine result runs as a task)."""
        self.state: dict[str, Any] = {}
        """Free room for the application's per-connection data (e.g. a session)."""

    # --- transport callbacks -------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._framed = bool(transport.get_extra_info("message_framed", False))
        self.remote_address = transport.get_extra_info("peername")
        self._start()
        if self.on_open is not None:
            token = current_peer.set(self)
            try:
                result = self.on_open(self)
                if inspect.isawaitable(result):
                    self._spawn(result)
            except Exception:
                log.exception("on_open callback failed; closing")
                self.abort()
            finally:
                current_peer.reset(token)
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            self._receive(data)
        except ProtocolError as exc:
            log.warning(
                "%s protocol error from %s: %s", self.protocol_name, self.remote_address, exc
            )
            self._protocol_failed(exc)
            self._flush()
            self.abort(exc)
            return
        except Exception:  # a bug of ours must not leave a half-dead connection behind
            log.exception("%s: unexpected error handling input; closing", self.protocol_name)
            self.abort()
            return
        self._flush()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._transport = None
        self._stop_timers()
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        error = ConnectionClosed(f"connection closed: {exc}" if exc else "connection closed")
        for call in self._calls.values():
            if not call.future.done():
                call.future.set_exception(error)
                call.future.exception()  # retrieved: no "never retrieved" noise
            if call.queue is not None:
                call.queue.put_nowait(error)
        self._calls.clear()
        for queue in self._incoming_streams.values():
            if queue is not None:
                queue.put_nowait(error)
        self._incoming_streams.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_exception(error)
            self._write_ready.exception()
        if not self.closed.done():
            self.closed.set_result(exc)

    def pause_writing(self) -> None:
        if self._write_ready is None or self._write_ready.done():
            self._write_ready = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)

    # --- output ----------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Queue bytes; they go out with the next flush (coalesced)."""
        self._out.append(data)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        self._queued += 1
        if self._queued >= FLUSH_EVERY:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _collect_output(self) -> None:
        """Move output a codec keeps queued itself into ``_out`` (Chatter does)."""

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._queued = 0
        self._collect_output()
        out = self._out
        if not out or self._transport is None:
            return
        self._out = []
        if self._framed:  # each queued piece is one message of the transport (WebSocket)
            self._transport.writelines(out)
        else:
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def _check_open(self) -> None:
        if not self.is_open:
            raise ConnectionClosed("connection is closed")

    async def _wait_writable(self) -> None:
        if self._write_ready is not None and not self._write_ready.done():
            await self._write_ready

    async def drain(self) -> None:
        """Send what is queued and wait while the transport's buffer is above its high-water
        mark: call it between notifications to a slow reader to keep memory bounded.
        Raises ConnectionClosed if the connection goes away meanwhile."""
        self._flush()
        await self._wait_writable()
        self._check_open()

    @property
    def write_buffer_size(self) -> int:
        """Bytes the transport holds that the peer has not taken yet."""
        if self._transport is None:
            return 0
        return self._transport.get_write_buffer_size()

    # --- closing -------------------------------------------------------------------------

    def abort(self, exc: BaseException | None = None) -> None:
        """Close now, dropping work in flight. Queued bytes (a protocol's last word, such as
        Gotalk's ``f`` message) still go out, unless the peer has stopped reading (writing
        is paused): then the connection is cut at once rather than waiting on it forever."""
        if self._transport is None:
            return
        if self._write_ready is not None and not self._write_ready.done():
            self._transport.abort()
            return
        self._flush()
        self._transport.close()

    async def close(self, *, drain_timeout: float = 5.0) -> None:
        """Graceful close: wait (up to ``drain_timeout``) for in-flight work, then close."""
        # single requests of ours and handlers still running (streams end with their tasks)
        pending = [c.future for c in self._calls.values() if c.queue is None]
        pending += self._tasks
        if pending:
            await asyncio.wait(pending, timeout=drain_timeout)
        self._flush()
        if self._transport is not None:
            self._transport.close()
        await asyncio.shield(self.closed)

    # --- client side ---------------------------------------------------------------------

    async def request(
        self, op: str, value: Any = None, *, timeout: float | None = None, raw: bool = False
    ) -> Any:
        """Send a request and wait for its result.

        Retry results are honoured (wait, then resend) up to ``options.retries`` times within
        ``timeout``. Raises RemoteError, RetryLater, RequestTimeout or ConnectionClosed.
        """
        payload = self._encode_request(op, value)
        timeout = self._timeout(timeout)
        loop = self._loop
        deadline = loop.time() + timeout
        attempt = 0
        while True:
            if self._write_ready is not None and not self._write_ready.done():
                await self._write_ready
            self._check_open()
            future: asyncio.Future[Any] = loop.create_future()
            key = self._send_request(op, payload, stream=False)
            self._calls[key] = _Call(future, None, deadline)
            if deadline < self._sweep_at:
                self._arm_sweep(deadline)
            try:
                reply = await future
            except _Expired:
                raise RequestTimeout(f"{op}: no result within {timeout} s") from None
            finally:
                if self._calls.pop(key, None) is not None:
                    self._abandon(key)
            if isinstance(reply, RetryLater):
                attempt += 1
                if attempt > self.options.retries or self._loop.time() + reply.wait > deadline:
                    raise reply
                await asyncio.sleep(reply.wait)
                continue
            return reply if raw else self._decode_result(reply)

    async def stream(
        self,
        op: str,
        parts: Iterable[Any] | AsyncIterable[Any] | None = None,
        value: Any = None,
        *,
        timeout: float | None = None,
        raw: bool = False,
    ) -> AsyncIterator[Any]:
        """Send a request (a stream request when ``parts`` is given) and yield each result.

        A single result yields once; a streamed result yields every part. ``timeout``
        bounds the wait for each next result.
        """
        await self._wait_writable()
        self._check_open()
        timeout = self._timeout(timeout)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        future: asyncio.Future[Any] = self._loop.create_future()
        if parts is None:
            key = self._send_request(op, self._encode_request(op, value), stream=False)
            self._calls[key] = _Call(future, queue)
        else:
            iterator = _aiter(parts)
            first = await anext(iterator, _END)
            key = self._send_request(op, b"" if first is _END else encode_value(first), stream=True)
            self._calls[key] = _Call(future, queue)
            if first is not _END:
                async for part in iterator:
                    await self._wait_writable()
                    self._check_open()
                    self._send_request_part(key, encode_value(part))
            self._send_request_end(key)
        try:
            while True:
                async with asyncio.timeout(timeout):
                    item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item if raw else self._decode_result(item)
        except TimeoutError:
            raise RequestTimeout(f"{op}: no result within {timeout} s") from None
        finally:
            if self._calls.pop(key, None) is not None:
                self._abandon(key)

    def _timeout(self, timeout: float | None) -> float:
        if timeout is not None:
            return timeout
        return self.options.timeout if self.options.timeout is not None else self.default_timeout

    def notify(self, name: str, value: Any = None) -> None:
        """Send a notification (no reply)."""
        self._check_open()
        self._send_notification(name, self._encode_request(name, value))

    # --- events from the protocol subclass ------------------------------------------------

    def _arm_sweep(self, when: float) -> None:
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
        self._sweep_at = when
        self._sweep_timer = self._loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Fail every call past its deadline; re-arm for the nearest remaining one."""
        self._sweep_timer = None
        self._sweep_at = float("inf")
        now = self._loop.time()
        nearest = None
        for call in self._calls.values():
            deadline = call.deadline
            if deadline is None:
                continue
            if deadline <= now:
                if not call.future.done():
                    call.future.set_exception(_Expired())
            elif nearest is None or deadline < nearest:
                nearest = deadline
        if nearest is not None:
            self._arm_sweep(nearest)

    def _on_result(self, key: Any, payload: Any) -> None:
        call = self._calls.pop(key, None)
        if call is None:
            return  # late or unknown: ignored, as Go peers do
        if call.queue is not None:
            call.queue.put_nowait(payload)
            call.queue.put_nowait(_END)
        elif not call.future.done():
            call.future.set_result(payload)

    def _on_result_part(self, key: Any, payload: Any) -> None:
        call = self._calls.get(key)
        if call is not None and call.queue is not None:
            call.queue.put_nowait(payload)

    def _on_result_end(self, key: Any) -> None:
        call = self._calls.pop(key, None)
        if call is not None and call.queue is not None:
            call.queue.put_nowait(_END)

    def _on_error(self, key: Any, message: str) -> None:
        self._fail_call(key, RemoteError(message))

    def _on_retry(self, key: Any, wait: float, message: str) -> None:
        call = self._calls.get(key)
        if call is None:
            return
        if call.queue is not None:
            self._fail_call(key, RetryLater(message, wait))
        elif not call.future.done():
            call.future.set_result(RetryLater(message, wait))

    def _fail_call(self, key: Any, exc: BaseException) -> None:
        call = self._calls.pop(key, None)
        if call is None:
            return
        if call.queue is not None:
            call.queue.put_nowait(exc)
        elif not call.future.done():
            call.future.set_exception(exc)

    def _on_notification(self, name: str, payload: Any) -> None:
        handler = self.registry.get_notification(name)
        if handler is None:
            log.debug("no handler for notification %r", name)
            return
        try:
            value = self._decode_params(handler, payload)
        except PayloadError as exc:
            log.warning("notification %r: %s", name, exc)
            return
        token = current_peer.set(self)
        try:
            result = handler.fn(value)
            if inspect.isawaitable(result):
                self._spawn(result)
        except Exception:
            log.exception("notification handler %r failed", name)
        finally:
            current_peer.reset(token)

    def _on_request(self, key: Any, op: str, payload: Any, stream: bool) -> None:
        handler = self.registry.get(op)
        if handler is None or (handler.kind is HandlerKind.STREAM) != stream:
            if handler is None:
                self._send_error(key, f'unknown operation "{op}"')
            else:
                kind = "stream" if stream else "single"
                self._send_error(key, f'operation "{op}" does not take {kind} requests')
            if stream:
                self._incoming_streams[key] = None
            return
        if self._active >= self.options.max_concurrent:
            self._send_retry(key, self.options.retry_wait, "request rate limit")
            if stream:
                self._incoming_streams[key] = None
            return
        token = current_peer.set(self)  # tasks created below inherit it
        try:
            if stream:
                queue: asyncio.Queue[Any] = asyncio.Queue()
                self._incoming_streams[key] = queue
                if payload:
                    queue.put_nowait(payload)
                result = handler.fn(_drain(queue, handler.decode))
            else:
                result = handler.fn(self._decode_params(handler, payload))
            if result.__class__ in _PLAIN_RESULTS:
                self._reply(key, result)
            elif inspect.isasyncgen(result):
                self._spawn(self._stream_result(key, result))
            elif inspect.isawaitable(result):
                self._spawn(self._await_result(key, result))
            else:
                self._reply(key, result)
        except PayloadError as exc:
            self._send_error(key, str(exc))
        except Exception as exc:
            log.debug("handler %r failed", op, exc_info=True)
            self._send_error(key, str(exc) or type(exc).__name__)
        finally:
            current_peer.reset(token)

    def _on_request_part(self, key: Any, payload: Any) -> bool:
        """Returns False for a part of a stream we do not know (the caller decides)."""
        if key not in self._incoming_streams:
            return False
        queue = self._incoming_streams[key]
        if queue is None:
            return True  # a stream we refused: its parts are dropped
        if queue.qsize() >= self.options.max_stream_queue:
            self._incoming_streams.pop(key)
            queue.put_nowait(RemoteError("stream request parts arrive faster than handled"))
            return True
        queue.put_nowait(payload)
        return True

    def _on_request_end(self, key: Any) -> bool:
        if key not in self._incoming_streams:
            return False
        queue = self._incoming_streams.pop(key)
        if queue is not None:
            queue.put_nowait(_END)
        return True

    # --- handler completion ----------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        self._active += 1
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._active -= 1
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("handler task failed", exc_info=task.exception())

    async def _await_result(self, key: Any, awaitable: Any) -> None:
        try:
            result = await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("handler failed", exc_info=True)
            if self.is_open:
                self._send_error(key, str(exc) or type(exc).__name__)
            return
        if self.is_open:
            self._reply(key, result)

    async def _stream_result(self, key: Any, agen: Any) -> None:
        try:
            async for item in agen:
                if not self.is_open:
                    return
                await self._wait_writable()
                self._send_result_part(key, self._encode_result(item))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.is_open:
                self._send_error(key, str(exc) or type(exc).__name__)
                self._send_result_end_after_error(key)
            return
        if self.is_open:
            self._send_result_end(key)

    def _reply(self, key: Any, result: Any) -> None:
        try:
            payload = self._encode_result(result)
        except PayloadError as exc:
            self._send_error(key, str(exc))
            return
        self._send_result(key, payload)

    # --- payload hooks (overridden where a protocol has typed payloads) ---------------------

    def _encode_request(self, op: str, value: Any) -> Any:
        return encode_value(value)

    def _encode_result(self, value: Any) -> Any:
        return encode_value(value)

    def _decode_params(self, handler: Handler, payload: Any) -> Any:
        return handler.decode(payload)

    def _decode_result(self, payload: Any) -> Any:
        return decode_any(payload)

    # --- protocol subclass interface -------------------------------------------------------

    def _start(self) -> None:
        """Connection is up: send a handshake, start timers."""

    def _stop_timers(self) -> None:
        """Connection is gone: cancel timers."""

    def _receive(self, data: bytes) -> None:
        raise NotImplementedError

    def _protocol_failed(self, exc: ProtocolError) -> None:
        """Queue whatever the protocol sends before closing on a peer's error."""

    def _abandon(self, key: Any) -> None:
        """A call of ours ended without its final message (timeout, cancellation)."""

    def _send_request(self, op: str, payload: Any, stream: bool) -> Any:
        raise NotImplementedError

    def _send_request_part(self, key: Any, payload: bytes) -> None:
        raise NotImplementedError

    def _send_request_end(self, key: Any) -> None:
        raise NotImplementedError

    def _send_result(self, key: Any, payload: Any) -> None:
        raise NotImplementedError

    def _send_result_part(self, key: Any, payload: Any) -> None:
        raise NotImplementedError

    def _send_result_end(self, key: Any) -> None:
        raise NotImplementedError

    def _send_result_end_after_error(self, key: Any) -> None:
        """Some protocols close a failed stream explicitly after its error (Gotalk)."""

    def _send_error(self, key: Any, message: str) -> None:
        raise NotImplementedError

    def _send_retry(self, key: Any, wait: float, message: str) -> None:
        raise NotImplementedError

    def _send_notification(self, name: str, payload: Any) -> None:
        raise NotImplementedError


async def _drain(queue: asyncio.Queue[Any], decode: Any) -> AsyncIterator[Any]:
    """The async iterator a stream handler reads its request parts from."""
    while True:
        item = await queue.get()
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield decode(item)


async def _aiter(items: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
