"""A connection's RPC state: the ``asyncio.Protocol`` the loop drives, correlation, dispatch.

Path of a request, in one direction: the transport calls :meth:`Peer.data_received`; the
peer's protocol adapter (:mod:`rpc.gotalk_peer`, :mod:`rpc.chatter_peer`) decodes the bytes
into codec messages and :meth:`Peer._run` hands each to the adapter's ``dispatch``, which
calls :meth:`Peer.on_request` (or ``on_result`` ...); the handler runs (inline when it is a
plain function, as a task when it is a coroutine or async generator); its result goes back
through the adapter's encoder into the :class:`~rpc.outbox.Outbox`, which writes once per
read.

Everything per connection is bounded and freed when the connection goes:
- calls of ours in ``_calls`` (bounded by the caller; each has a deadline);
- incoming streams in ``_streams`` (at most ``max_concurrent``; each queue at most
  ``max_stream_queue`` parts, past which that stream alone fails);
- handler tasks in a :class:`~rpc.tasks.TaskSet` (at most ``max_concurrent``);
- decoded messages waiting in ``_backlog`` while reading is paused (at most one read's worth:
  reading stops as soon as the backlog is non-empty);
- output in the outbox and the transport: reading pauses above ``high_water`` bytes.
All timers share one :class:`~rpc.deadlines.Deadlines` per connection.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import random
from collections import OrderedDict, deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rpc import intercept
from rpc.deadlines import Deadlines
from rpc.errors import ConnectionClosed, PayloadError, RemoteError, RequestTimeout, RetryLater
from rpc.logs import violations
from rpc.middleware import Middleware
from rpc.outbox import Outbox
from rpc.payload import encode_value
from rpc.registry import Handler, HandlerKind, Registry, default_registry
from rpc.tasks import TaskSet
from wire.errors import ProtocolError

log = logging.getLogger("peerwire.rpc")

current_peer: contextvars.ContextVar[Peer] = contextvars.ContextVar("peerwire_current_peer")
"""The peer whose request is being handled; lets a handler call back into its caller."""

_END = object()
_NO_ENTRIES: Mapping[str, str] = {}
ENDED_STREAMS = 256
"""Incoming streams remembered after we stopped taking their parts (refused, failed or
answered early), so their late parts are dropped instead of counting as parts of an
unknown stream (a protocol violation for Gotalk). Older ones are forgotten."""
# result types that are never awaitable: skip inspect.isasyncgen/isawaitable (ABC checks)
_PLAIN_RESULTS = frozenset({bytes, bytearray, str, int, float, bool, dict, list, type(None)})


@dataclass(slots=True)
class Options:
    """Per-connection settings; every limit is per connection."""

    timeout: float | None = None
    """Seconds a request waits for its result; None = the protocol's default (Chatter 5 s,
    the Chatter conversation timeout; Gotalk 30 s)."""
    max_concurrent: int = 1024
    """Handlers running at once. Past it, peers that understand retry results get one
    (waiting ``retry_wait``); others (browsers' gotalk.js) are not read from until a handler
    finishes."""
    retry_wait: float = 0.5
    """Wait we ask for in our retry results, in seconds."""
    retries: int = 5
    """At most this many retry results are honoured per request, all within its timeout."""
    max_size: int = 16 * 1024 * 1024
    """Largest message accepted or sent, in bytes. A result above it becomes an error result;
    a request above it raises PayloadError before anything is sent."""
    max_stream_queue: int = 256
    """Parts buffered per incoming stream; past it that stream fails with an error result."""
    high_water: int = 256 * 1024
    """Unsent output (bytes) above which we stop reading from the peer."""
    low_water: int = 64 * 1024
    """Unsent output (bytes) below which reading resumes."""
    handshake_timeout: float | None = 10.0
    """Seconds a new connection may take to send its version (Gotalk) or first frame
    (Chatter) before it is closed."""
    middleware: tuple[Middleware, ...] = ()
    """Wrapped around every call of the connection, both ways, first outermost (see
    :mod:`rpc.middleware`); the registry's own middleware run inside these."""


class Adapter(Protocol):
    """What the peer needs from a wire format (see :mod:`rpc.gotalk_peer`)."""

    name: str
    default_timeout: float
    retry_results: bool
    cancels: bool
    """True once both sides announced the cancellation extension."""
    metadata: bool
    """True once both sides take request metadata (extension level 2)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def handshake_done(self) -> bool: ...
    def decode(self, data: bytes) -> list[Any]: ...
    def dispatch(self, message: Any) -> None: ...
    def last_word(self, exc: ProtocolError) -> None: ...
    def send_request(self, op: str, payload: Any, stream: bool) -> Any: ...
    def send_request_meta(
        self, op: str, payload: Any, stream: bool, entries: Mapping[str, str], timeout: float | None
    ) -> Any: ...
    def send_request_part(self, key: Any, payload: bytes) -> None: ...
    def send_request_end(self, key: Any) -> None: ...
    def send_result(self, key: Any, payload: Any, stream: bool) -> None: ...
    def send_result_part(self, key: Any, payload: Any) -> None: ...
    def send_result_end(self, key: Any, failed: bool) -> None: ...
    def send_error(self, key: Any, message: str) -> None: ...
    def send_retry(self, key: Any, wait: float, message: str) -> None: ...
    def send_notification(self, name: str, payload: Any) -> None: ...
    def abandon(self, key: Any) -> None: ...
    def encode_request(self, op: str, value: Any) -> Any: ...
    def encode_result(self, value: Any) -> Any: ...
    def decode_params(self, handler: Handler, payload: Any) -> Any: ...
    def decode_result(self, payload: Any) -> Any: ...


class _Call:
    """One outstanding request of ours: a future (single result) or a queue (stream)."""

    __slots__ = ("deadline", "future", "queue")

    def __init__(
        self,
        future: asyncio.Future[Any] | None,
        queue: asyncio.Queue[Any] | None,
        deadline: float | None,
    ) -> None:
        self.future = future
        self.queue = queue
        self.deadline = deadline


class _Expired(Exception):
    """Set on a call's future when its deadline passes."""


class Peer(asyncio.Protocol):
    """One connection's RPC state. Built by :class:`~rpc.gotalk_peer.GotalkPeer` or
    :class:`~rpc.chatter_peer.ChatterPeer` with their adapter."""

    def __init__(
        self,
        adapter_factory: Callable[[Peer], Adapter],
        registry: Registry | None = None,
        options: Options | None = None,
    ) -> None:
        self.registry = registry if registry is not None else default_registry
        self.options = options or Options()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._transport: Any = None
        self.outbox = Outbox(loop)
        self.deadlines = Deadlines(loop)
        self._tasks = TaskSet(loop, self._task_done)
        self._calls: dict[Any, _Call] = {}
        self._calls_at = float("inf")
        self._streams: dict[Any, asyncio.Queue[Any]] = {}
        self._ended: OrderedDict[Any, None] = OrderedDict()
        self._running: dict[Any, asyncio.Task[Any]] = {}
        """Handler tasks by request key, kept only while the peer may cancel them."""
        self._backlog: deque[Any] = deque()
        self._reading = True
        self.closed: asyncio.Future[BaseException | None] = loop.create_future()
        """Resolves (with the transport's exception or None) once the connection is gone."""
        self.remote_address: Any = None
        self.on_open: Callable[[Peer], Any] | None = None
        """Called once the connection is up (a coroutine result runs as a task)."""
        self.state: dict[str, Any] = {}
        """Free room for the application's per-connection data (e.g. a session)."""
        self.violation: Exception | None = None
        """Why we closed the connection when the peer broke the protocol (else None)."""
        self.middleware = (*self.options.middleware, *self.registry.middleware)
        """The middleware of calls served here, outermost first (fixed at connection time;
        our own calls go through ``options.middleware`` alone)."""
        self._intercepted = bool(self.middleware)
        self.adapter = adapter_factory(self)

    @property
    def protocol_name(self) -> str:
        return self.adapter.name

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def has_call(self, key: Any) -> bool:
        """True while a call of ours with this key waits for its result."""
        return key in self._calls

    # --- transport callbacks -------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        if self.closed.done():  # given up on during its TLS handshake (closed or timed out)
            transport.abort()
            return
        self._transport = transport
        self.remote_address = transport.get_extra_info("peername")
        self.outbox.attach(
            transport, high_water=self.options.high_water, low_water=self.options.low_water
        )
        self.adapter.start()
        if self.options.handshake_timeout:
            when = self._loop.time() + self.options.handshake_timeout
            self.deadlines.set("handshake", when, self._handshake_due)
        if self.on_open is not None:
            token = current_peer.set(self)
            try:
                result = self.on_open(self)
                if inspect.isawaitable(result):
                    self._tasks.spawn(_awaited(result))
            except Exception:
                log.exception("on_open callback failed; closing")
                self.abort()
            finally:
                current_peer.reset(token)
        self.outbox.flush()

    def data_received(self, data: bytes) -> None:
        try:
            messages = self.adapter.decode(data)
            if self._backlog:
                self._backlog.extend(messages)
            elif messages:
                self._run(messages)
        except ProtocolError as exc:
            self._violation(exc)
            return
        except Exception:  # a bug of ours must not leave a half-dead connection behind
            log.exception("%s: unexpected error handling input; closing", self.protocol_name)
            self.abort()
            return
        self.outbox.flush()

    def eof_received(self) -> bool:
        return False  # half-closed peers are closed: nothing more can be answered to them

    def connection_lost(self, exc: BaseException | None) -> None:
        self._transport = None
        self.deadlines.close()
        self.adapter.stop()
        error = ConnectionClosed(f"connection closed: {exc}" if exc else "connection closed")
        self.outbox.lost(error)
        for call in self._calls.values():
            if call.future is not None and not call.future.done():
                call.future.set_exception(error)
                call.future.exception()  # retrieved: no "never retrieved" noise
            if call.queue is not None:
                call.queue.put_nowait(error)
        self._calls.clear()
        for queue in self._streams.values():
            queue.put_nowait(error)
        self._streams.clear()
        self._ended.clear()
        self._running.clear()
        self._backlog.clear()
        self._tasks.cancel_all()
        if not self.closed.done():
            self.closed.set_result(exc)

    def pause_writing(self) -> None:
        self.outbox.pause()
        self._pause_reading()

    def resume_writing(self) -> None:
        self.outbox.resume()
        self._continue()

    # --- input flow ----------------------------------------------------------------------

    def _held(self) -> bool:
        """True when no more input may be handled now: output is backed up, or every
        handler slot is taken and the peer does not understand retry results."""
        return self.outbox.blocked or (
            not self.adapter.retry_results and len(self._tasks) >= self.options.max_concurrent
        )

    def _run(self, messages: list[Any]) -> None:
        # _held() inlined: this check runs once per message
        dispatch = self.adapter.dispatch
        outbox = self.outbox
        slots = None if self.adapter.retry_results else self.options.max_concurrent
        tasks = self._tasks
        for index, message in enumerate(messages):
            if outbox.blocked or (slots is not None and len(tasks) >= slots):
                self._backlog.extend(messages[index:])
                self._pause_reading()
                return
            dispatch(message)

    def _continue(self) -> None:
        """Handle held-back messages once output drained or a handler slot freed."""
        backlog = self._backlog
        if self._transport is None:
            return
        try:
            while backlog and not self._held():
                self.adapter.dispatch(backlog.popleft())
        except ProtocolError as exc:
            self._violation(exc)
            return
        self.outbox.flush()
        if not backlog and not self.outbox.blocked and not self._reading:
            self._reading = True
            self._transport.resume_reading()

    def _pause_reading(self) -> None:
        if self._reading and self._transport is not None:
            self._reading = False
            self._transport.pause_reading()

    def _violation(self, exc: ProtocolError) -> None:
        self.violation = exc
        violations.warning(
            "%s peer %s broke the protocol: %s", self.protocol_name, self.remote_address, exc
        )
        self.adapter.last_word(exc)
        self.abort(exc)

    def _handshake_due(self) -> None:
        if not self.adapter.handshake_done():
            self.violation = TimeoutError("no handshake")
            violations.warning(
                "%s peer %s sent nothing valid within %s s; closing",
                self.protocol_name,
                self.remote_address,
                self.options.handshake_timeout,
            )
            self.abort()

    # --- state ---------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def _check_open(self) -> None:
        if not self.is_open:
            raise ConnectionClosed("connection is closed")

    @property
    def transport(self) -> Any:
        """The transport (None once closed): ``get_extra_info`` gives the TLS certificate."""
        return self._transport

    async def drain(self) -> None:
        """Send what is queued and wait while the peer is not taking our output: call it
        between notifications to a slow reader. Raises ConnectionClosed if it goes away."""
        self.outbox.flush()
        await self.outbox.wait_writable()
        self._check_open()

    @property
    def write_buffer_size(self) -> int:
        """Bytes queued or held by the transport that the peer has not taken yet."""
        return self.outbox.buffered

    # --- closing -------------------------------------------------------------------------

    def abort(self, exc: BaseException | None = None) -> None:
        """Close now, dropping work in flight. Queued bytes (a protocol's last word, such as
        Gotalk's ``f`` message) still go out, unless the peer has stopped reading: then the
        connection is cut at once rather than waiting on it forever."""
        if self._transport is None:
            return
        if self.outbox.blocked:
            self._transport.abort()
            return
        self.outbox.flush()
        self._transport.close()

    async def close(self, *, drain_timeout: float = 5.0) -> None:
        """Graceful close: wait (up to ``drain_timeout``) for in-flight work, then close."""
        if self._transport is None and not self.closed.done():
            self.connection_lost(None)  # never opened (a TLS handshake still running)
            return
        pending: list[Any] = [
            c.future for c in self._calls.values() if c.future is not None and c.queue is None
        ]
        pending += list(self._tasks)
        if pending:
            await asyncio.wait(pending, timeout=drain_timeout)
        self.outbox.flush()
        if self._transport is not None:
            self._transport.close()
        await asyncio.shield(self.closed)

    # --- calls of ours ---------------------------------------------------------------------

    def _timeout(self, timeout: float | None) -> float:
        if timeout is not None:
            return timeout
        if self.options.timeout is not None:
            return self.options.timeout
        return self.adapter.default_timeout

    def _checked_payload(self, op: str, payload: Any) -> Any:
        if payload.__class__ is bytes and len(payload) > self.options.max_size:
            raise PayloadError(
                f"{op}: request of {len(payload)} bytes exceeds max_size {self.options.max_size}"
            )
        return payload

    async def request(
        self, op: str, value: Any = None, *, timeout: float | None = None, raw: bool = False
    ) -> Any:
        """Send a request and wait for its result.

        Retry results are honoured (the peer's wait plus up to 50% jitter, then the request
        is sent again), at most ``options.retries`` times and only while the retry still
        fits ``timeout``. Raises RemoteError, RetryLater, RequestTimeout, ConnectionClosed,
        or PayloadError (a value that cannot be encoded or a result that cannot be decoded).
        """
        if self._intercepted:
            return await intercept.request(self, op, value, timeout, raw)
        adapter = self.adapter
        payload = self._checked_payload(op, adapter.encode_request(op, value))
        # a timeout the caller chose travels to peers that take request metadata
        timed = (timeout is not None or self.options.timeout is not None) and adapter.metadata
        timeout = self._timeout(timeout)
        loop = self._loop
        deadline = loop.time() + timeout
        attempt = 0
        while True:
            reply = await self.send_and_wait(
                op, payload, deadline, timeout, None, _NO_ENTRIES if timed else None
            )
            if reply.__class__ is RetryLater:
                attempt += 1
                wait = reply.wait * (1 + 0.5 * random.random())
                if attempt > self.options.retries or loop.time() + wait > deadline:
                    raise reply
                await asyncio.sleep(wait)
                continue
            return reply if raw else adapter.decode_result(reply)

    async def send_and_wait(
        self,
        op: str,
        payload: Any,
        deadline: float,
        timeout: float,
        sent: Callable[[Any], None] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Any:
        """One attempt of a request: send the encoded ``payload`` and return the raw reply
        (or a RetryLater) by loop time ``deadline``; ``sent(key)`` learns the request's key.
        ``metadata`` (only for a peer whose adapter takes it) goes before the request with
        the time left. A call given up on (timeout, cancellation) is abandoned, which tells
        a peer that took the cancellation extension."""
        if self.outbox.blocked:
            await self.outbox.wait_writable()
        self._check_open()
        adapter = self.adapter
        future: asyncio.Future[Any] = self._loop.create_future()
        if metadata is None:
            key = adapter.send_request(op, payload, False)
        else:
            left = deadline - self._loop.time()
            key = adapter.send_request_meta(op, payload, False, metadata, left)
        if sent is not None:
            sent(key)
        self._calls[key] = _Call(future, None, deadline)
        if deadline < self._calls_at:
            self._watch_calls(deadline)
        try:
            return await future
        except _Expired:
            raise RequestTimeout(f"{op}: no result within {timeout} s") from None
        finally:
            if self._calls.pop(key, None) is not None:
                adapter.abandon(key)

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
        if self._intercepted:
            async for item in intercept.stream(self, op, parts, value, timeout, raw):
                yield item
            return
        await self.outbox.wait_writable()
        self._check_open()
        adapter = self.adapter
        timeout = self._timeout(timeout)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        if parts is None:
            payload = self._checked_payload(op, adapter.encode_request(op, value))
            key = adapter.send_request(op, payload, False)
            self._calls[key] = _Call(None, queue, None)
        else:
            iterator = _aiter(parts)
            first = await anext(iterator, _END)
            data = b"" if first is _END else encode_value(first)
            key = adapter.send_request(op, self._checked_payload(op, data), True)
            self._calls[key] = _Call(None, queue, None)
            if first is not _END:
                async for part in iterator:
                    await self.outbox.wait_writable()
                    self._check_open()
                    adapter.send_request_part(key, self._checked_payload(op, encode_value(part)))
            adapter.send_request_end(key)
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout)
                except TimeoutError:
                    raise RequestTimeout(f"{op}: no result within {timeout} s") from None
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item if raw else adapter.decode_result(item)
        finally:
            if self._calls.pop(key, None) is not None:
                adapter.abandon(key)

    def notify(self, name: str, value: Any = None) -> None:
        """Send a notification (no reply)."""
        self._check_open()
        payload = self._checked_payload(name, self.adapter.encode_request(name, value))
        self.adapter.send_notification(name, payload)

    def _watch_calls(self, when: float) -> None:
        self._calls_at = when
        self.deadlines.set("calls", when, self._expire_calls)

    def _expire_calls(self) -> None:
        """Fail every call past its deadline; watch the nearest remaining one."""
        self._calls_at = float("inf")
        now = self._loop.time()
        nearest = None
        for call in self._calls.values():
            deadline = call.deadline
            if deadline is None or call.future is None:
                continue
            if deadline <= now:
                if not call.future.done():
                    call.future.set_exception(_Expired())
            elif nearest is None or deadline < nearest:
                nearest = deadline
        if nearest is not None:
            self._watch_calls(nearest)

    # --- results of our calls (from the adapter) -------------------------------------------

    def on_result(self, key: Any, payload: Any) -> None:
        call = self._calls.pop(key, None)
        if call is None:
            return  # late or unknown: ignored, as Go peers do
        if call.queue is not None:
            call.queue.put_nowait(payload)
            call.queue.put_nowait(_END)
        elif call.future is not None and not call.future.done():
            call.future.set_result(payload)

    def on_result_part(self, key: Any, payload: Any) -> None:
        call = self._calls.get(key)
        if call is not None and call.queue is not None:
            call.queue.put_nowait(payload)

    def on_result_end(self, key: Any) -> None:
        call = self._calls.pop(key, None)
        if call is not None and call.queue is not None:
            call.queue.put_nowait(_END)

    def on_error(self, key: Any, message: str) -> None:
        self._fail_call(key, RemoteError(message))

    def on_retry(self, key: Any, wait: float, message: str) -> None:
        call = self._calls.get(key)
        if call is None:
            return
        if call.queue is not None:
            self._fail_call(key, RetryLater(message, wait))
        elif call.future is not None and not call.future.done():
            call.future.set_result(RetryLater(message, wait))

    def _fail_call(self, key: Any, exc: BaseException) -> None:
        call = self._calls.pop(key, None)
        if call is None:
            return
        if call.queue is not None:
            call.queue.put_nowait(exc)
        elif call.future is not None and not call.future.done():
            call.future.set_exception(exc)

    # --- requests and notifications from the peer (from the adapter) -----------------------

    def on_notification(self, name: str, payload: Any) -> None:
        if self._intercepted:
            intercept.serve_notification(self, name, payload)
            return
        handler = self.registry.get_notification(name)
        if handler is None:
            log.debug("no handler for notification %r", name)
            return
        try:
            value = self.adapter.decode_params(handler, payload)
        except PayloadError as exc:
            log.warning("notification %r from %s dropped: %s", name, self.remote_address, exc)
            return
        token = current_peer.set(self)
        try:
            result = handler.fn(value)
            if inspect.isawaitable(result):
                self._tasks.spawn(_awaited(result))
        except Exception:
            log.exception("notification handler %r failed", name)
        finally:
            current_peer.reset(token)

    def on_request(self, key: Any, op: str, payload: Any, stream: bool) -> None:
        """Run the handler of ``op``; a refused stream request keeps no state (its later
        parts are dropped as parts of an unknown stream)."""
        if self._intercepted:
            intercept.serve_request(self, key, op, payload, stream)
            return
        adapter = self.adapter
        handler = self.registry.get(op)
        if handler is None or (handler.kind is HandlerKind.STREAM) != stream:
            if handler is None:
                adapter.send_error(key, f'unknown operation "{op}"')
            else:
                kind = "stream" if stream else "single"
                adapter.send_error(key, f'operation "{op}" does not take {kind} requests')
            if stream:
                self._end_stream(key)
            return
        if len(self._tasks) >= self.options.max_concurrent:
            adapter.send_retry(key, self.options.retry_wait, "request rate limit")
            if stream:
                self._end_stream(key)
            return
        token = current_peer.set(self)  # tasks created below inherit it
        try:
            if stream:
                queue: asyncio.Queue[Any] = asyncio.Queue()
                self._streams[key] = queue
                if payload:
                    queue.put_nowait(payload)
                result = handler.fn(_parts(queue, handler.decode))
            else:
                result = handler.fn(adapter.decode_params(handler, payload))
            if result.__class__ in _PLAIN_RESULTS:
                self._reply(key, result, stream)
            elif inspect.isasyncgen(result):
                task = self._tasks.spawn(self._stream_result(key, result))
                if adapter.cancels:
                    self._running[key] = task
            elif inspect.isawaitable(result):
                task = self._tasks.spawn(self._await_result(key, result, stream))
                if adapter.cancels:
                    self._running[key] = task
            else:
                self._reply(key, result, stream)
        except PayloadError as exc:
            if stream:
                self._end_stream(key)
            adapter.send_error(key, str(exc))
        except Exception as exc:
            if stream:
                self._end_stream(key)
            log.debug("handler %r failed", op, exc_info=True)
            adapter.send_error(key, str(exc) or type(exc).__name__)
        finally:
            current_peer.reset(token)

    def _end_stream(self, key: Any) -> None:
        """Stop taking parts of incoming stream ``key``; remember it for a while."""
        self._streams.pop(key, None)
        ended = self._ended
        ended[key] = None
        if len(ended) > ENDED_STREAMS:
            ended.popitem(last=False)

    def on_request_part(self, key: Any, payload: Any) -> bool:
        """Queue a part for its stream's handler. False: no such stream, now or lately."""
        queue = self._streams.get(key)
        if queue is None:
            return key in self._ended  # refused, failed or answered: dropped
        if queue.qsize() >= self.options.max_stream_queue:
            self._end_stream(key)
            queue.put_nowait(
                RemoteError(
                    f"stream request parts arrive faster than handled "
                    f"(more than {self.options.max_stream_queue} queued)"
                )
            )
            return True
        queue.put_nowait(payload)
        return True

    def on_request_end(self, key: Any) -> bool:
        """End a stream's parts. False: no such stream, now or lately."""
        queue = self._streams.pop(key, None)
        if queue is None:
            if key not in self._ended:
                return False
            del self._ended[key]
            return True
        queue.put_nowait(_END)
        return True

    def has_stream(self, key: Any) -> bool:
        """True while an incoming stream request ``key`` takes parts."""
        return key in self._streams

    # --- handler completion ----------------------------------------------------------------

    def on_cancel(self, key: Any) -> None:
        """The caller gave up on request ``key`` (peerwire extension): cancel its handler.
        Its late result, if any, is dropped by the caller."""
        task = self._running.pop(key, None)
        if task is not None:
            task.cancel()
        if key in self._streams:
            self._end_stream(key)

    def _task_done(self) -> None:
        if self._backlog and self._transport is not None:
            self._continue()

    async def _await_result(self, key: Any, awaitable: Any, stream: bool) -> None:
        try:
            result = await awaitable
        except asyncio.CancelledError:
            if self._running.pop(key, None) is not None or not self.is_open:
                raise  # shut down with the connection
            self.adapter.send_error(key, "cancelled by the caller")  # ends the conversation
            raise
        except Exception as exc:
            log.debug("handler failed", exc_info=True)
            if self.is_open:
                self.adapter.send_error(key, str(exc) or type(exc).__name__)
            return
        finally:
            self._running.pop(key, None)
            if stream and key in self._streams:
                self._end_stream(key)
        if self.outbox.blocked:
            await self.outbox.wait_writable()
        if self.is_open:
            self._reply(key, result, stream)

    async def _stream_result(self, key: Any, agen: Any) -> None:
        adapter = self.adapter
        try:
            async for item in agen:
                await self.outbox.wait_writable()
                if not self.is_open:
                    return
                adapter.send_result_part(key, self._encoded_result(item))
        except asyncio.CancelledError:
            if self.is_open and key not in self._running:  # the caller cancelled it
                adapter.send_error(key, "cancelled by the caller")
                adapter.send_result_end(key, True)
            raise
        except Exception as exc:
            if self.is_open:
                adapter.send_error(key, str(exc) or type(exc).__name__)
                adapter.send_result_end(key, True)
            return
        finally:
            self._running.pop(key, None)
            if key in self._streams:
                self._end_stream(key)
        if self.is_open:
            adapter.send_result_end(key, False)

    def _encoded_result(self, value: Any) -> Any:
        payload = self.adapter.encode_result(value)
        if payload.__class__ is bytes and len(payload) > self.options.max_size:
            raise PayloadError(
                f"result of {len(payload)} bytes exceeds max_size {self.options.max_size}"
            )
        return payload

    def _reply(self, key: Any, result: Any, stream: bool) -> None:
        """Send a handler's single result (to a stream request too: then the handler is
        done with the request's parts, and the stream's state goes)."""
        if stream and key in self._streams:
            self._end_stream(key)
        try:
            payload = self._encoded_result(result)
        except PayloadError as exc:
            self.adapter.send_error(key, str(exc))
            return
        self.adapter.send_result(key, payload, stream)


async def _awaited(awaitable: Any) -> None:
    await awaitable


async def _parts(queue: asyncio.Queue[Any], decode: Any) -> AsyncIterator[Any]:
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
