"""The calls a connection makes: requests, streams and notifications of ours, and their
results as the protocol adapter reports them.

:class:`Caller` is the half of :class:`~rpc.peer.Peer` that does this; it shares the peer's
state and keeps its own in ``_calls`` (one :class:`_Call` per outstanding request or stream
of ours, freed when its result, error, deadline or the connection's end comes) and
``_calls_at`` (the deadline the peer's ``calls`` timer is armed for: the nearest one).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

from rpc import intercept, stream_request
from rpc.closing import refused_closing, stream_error
from rpc.errors import (
    ConnectionClosed,
    PayloadError,
    RemoteError,
    RequestTimeout,
    RetryLater,
    StreamOverflow,
)
from rpc.key import K
from rpc.streaming import END, ResultWait, StreamQueue, legacy_stream_args

if TYPE_CHECKING:
    from rpc.deadlines import Deadlines
    from rpc.options import Adapter, Options
    from rpc.outbox import Outbox
    from rpc.stream_hold import StreamHold

T = TypeVar("T")

_NO_ENTRIES: Mapping[str, str] = {}


class _Call(msgspec.Struct):
    """One outstanding request of ours: a future (single result) or a queue (stream).
    A msgspec Struct: one is made per call, and it is built in C (about half the time of a
    class with ``__slots__``)."""

    future: asyncio.Future[Any] | None
    queue: StreamQueue | None
    deadline: float | None
    op: str = ""
    timeout: float = 0.0
    """The operation and timeout a single call's RequestTimeout names."""
    feeder: asyncio.Task[Any] | None = None
    """While a stream request of ours still sends parts: the task doing so, which ends
    with the call (:func:`_stop`: answered, forgotten, or failed with the connection)."""


class Caller(Generic[K]):
    """The calls we make on a connection (mixed into :class:`~rpc.peer.Peer`, which sets
    up the attributes below)."""

    adapter: Adapter[K]
    options: Options
    outbox: Outbox
    deadlines: Deadlines
    _loop: asyncio.AbstractEventLoop
    _transport: Any
    _calls: dict[K, _Call]
    _calls_at: float
    _input_end: int
    _intercepted: bool
    _stream_hold: StreamHold
    closed: asyncio.Future[BaseException | None]

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...

        @property
        def is_open(self) -> bool: ...

    def calls_waited_for(self) -> list[asyncio.Future[Any]]:
        """The futures of our single calls in flight: what a graceful close waits for (not
        our streams: they are cut)."""
        return [c.future for c in self._calls.values() if c.future is not None and c.queue is None]

    def has_call(self, key: K) -> bool:
        """True while a call of ours with this key waits for its result."""
        return key in self._calls

    # --- calls of ours ---------------------------------------------------------------------

    def _timeout(self, timeout: float | None) -> float:
        """The seconds a call waits (also written out in :meth:`request`)."""
        if timeout is not None:
            return timeout
        if self.options.timeout is not None:
            return self.options.timeout
        return self.adapter.default_timeout

    def _checked_payload(self, op: str, payload: T) -> T:
        """``payload``, or PayloadError past ``max_size`` (the check is written out in
        :meth:`request`)."""
        if isinstance(payload, bytes) and len(payload) > self.options.max_size:
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
        fits ``timeout`` and the connection is open. A peer closing gracefully refuses what
        comes during its drain (:data:`~rpc.errors.CLOSING`): that waits for the connection
        to close (within ``timeout``), then raises RetryLater, the request not run. Raises
        RemoteError, RetryLater, RequestTimeout, ConnectionClosed,
        or PayloadError (a value that cannot be encoded or a result that cannot be decoded).
        """
        if self._intercepted:
            return await intercept.request(self, op, value, timeout, raw)  # type: ignore[arg-type]
        adapter, options = self.adapter, self.options
        payload = adapter.encode_request(op, value)
        if len(payload) > options.max_size:  # bytes: _checked_payload written out
            self._checked_payload(op, payload)  # raises PayloadError
        # a timeout the caller chose travels to peers that take request metadata
        if timeout is None:  # _timeout written out
            timeout = options.timeout
            timed = timeout is not None and adapter.metadata
            if timeout is None:
                timeout = adapter.default_timeout
        else:
            timed = adapter.metadata
        loop = self._loop
        deadline = loop.time() + timeout
        attempt = 0
        entries = _NO_ENTRIES if timed else None
        while True:  # send_and_wait written out: a coroutine frame less per call
            if self.outbox.blocked:
                await self._writable_by(deadline, op, timeout)
            key, future = self._send(op, payload, deadline, timeout, entries)
            try:
                reply = await future
            finally:
                if key in self._calls:  # given up on (_forget written out)
                    self._forget(key)
            if reply.__class__ is RetryLater:
                if await refused_closing(reply, self.closed, deadline, loop):
                    raise reply  # not run; waited for the close: sent again here, refused
                attempt += 1
                wait = reply.wait * (1 + 0.5 * random.random())
                if attempt > self.options.retries or loop.time() + wait > deadline:
                    raise reply
                await asyncio.sleep(wait)
                if not self.is_open:  # closed meanwhile (a peer's graceful close refuses
                    raise reply  # what comes during its drain so): not run, as it says
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
        timed: bool = True,
    ) -> Any:
        """One attempt of a request: send the encoded ``payload`` and return the raw reply
        (or a RetryLater) by loop time ``deadline``; ``sent(key)`` learns the request's key.
        ``metadata`` (only for a peer whose adapter takes it) goes before the request, with
        the time left if the caller chose its timeout (``timed``). A call given up on
        (timeout, cancellation) is abandoned, which tells a peer that took the cancellation
        extension."""
        if self.outbox.blocked:
            await self._writable_by(deadline, op, timeout)
        key, future = self._send(op, payload, deadline, timeout, metadata, timed)
        try:
            if sent is not None:
                sent(key)
            return await future
        finally:
            self._forget(key)

    async def _writable_by(self, deadline: float, op: str, timeout: float) -> None:
        """Wait until the transport takes more of our output, within the call's deadline:
        past it, RequestTimeout as when no result comes (a peer that stopped reading must
        not hold a call past its timeout; its ConnectionClosed goes through)."""
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                await self.outbox.wait_writable()
        except TimeoutError:
            if scope.expired():
                raise RequestTimeout(f"{op}: no result within {timeout} s") from None
            raise

    def _send(
        self,
        op: str,
        payload: Any,
        deadline: float,
        timeout: float,
        metadata: Mapping[str, str] | None,
        timed: bool = True,
    ) -> tuple[K, asyncio.Future[Any]]:
        """Send one attempt of a request and register it until ``deadline``: its key and
        the future its reply (or a RetryLater, or past the deadline a RequestTimeout naming
        ``timeout``) resolves; ``metadata`` as in :meth:`send_and_wait`. Raises
        ConnectionClosed."""
        transport = self._transport  # _check_open written out: a call per request
        if transport is None or transport.is_closing() or self._input_end:  # (DROPPED:
            raise ConnectionClosed("connection is closed")  # a graceful close's end)
        adapter = self.adapter
        future: asyncio.Future[Any] = self._loop.create_future()
        calls = self._calls
        outbox = self.outbox
        # alone in flight: no reply is coming to bring requests to join this one, so it is
        # written here, not by a flush scheduled for the next loop iteration (Outbox.hold)
        alone = not calls and outbox.hold()
        try:
            if metadata is None:
                key = adapter.send_request(op, payload, False)
            else:  # the time left travels only when the caller chose the timeout
                left = deadline - self._loop.time() if timed else None
                key = adapter.send_request_meta(op, payload, False, metadata, left)
            calls[key] = _Call(future, None, deadline, op, timeout)  # before it is written
        finally:
            if alone:
                outbox.release()
        if deadline < self._calls_at:
            self._watch_calls(deadline)
        return key, future

    def open_results(self, send: Callable[[], K], queue: StreamQueue) -> K:
        """``send()`` a request that sends no parts, and register ``queue`` for its results
        (a streamed result, or a single one); its key. With no other call in flight the
        request is written at once, as :meth:`_send` writes a lone request."""
        alone = not self._calls and self.outbox.hold()
        try:
            key = send()
            self._stream_call(key, queue)
        finally:
            if alone:
                self.outbox.release()
        return key

    def _forget(self, key: K) -> None:
        """We stop waiting for ``key``'s result: a call still registered was given up on
        (timeout, cancellation, an error of ours), which the adapter tells the peer."""
        call = self._calls.pop(key, None)
        if call is not None:
            if call.queue is not None:
                self._stream_hold.drop(call.queue)  # its reader takes no more
                _stop(call)
            self.adapter.abandon(key)

    async def stream(
        self,
        op: str,
        *legacy: Any,
        value: Any = None,
        parts: Iterable[Any] | AsyncIterable[Any] | None = None,
        timeout: float | None = None,
        item_timeout: float | None = None,
        raw: bool = False,
    ) -> AsyncIterator[Any]:
        """Send a request (a stream request when ``parts`` is given) and yield each result.

        A single result yields once; a streamed result yields every part. ``timeout`` is a
        deadline for the whole stream, as in :meth:`request` (None: none); ``item_timeout``
        bounds the wait for each next result (None: ``options.timeout``, else the
        protocol's default). Either raises RequestTimeout. The old positional form
        ``stream(op, parts, value)`` still works and warns (DeprecationWarning).
        """
        if legacy:
            parts, value = legacy_stream_args(legacy, parts, value)
        wait = ResultWait(self._loop, op, timeout, self._timeout(item_timeout))
        # a deadline for the whole stream travels to peers that take request metadata
        if self._intercepted or (timeout is not None and self.adapter.metadata):
            chained = intercept.stream(self, op, parts, value, wait, raw)  # type: ignore[arg-type]
            try:
                async for item in chained:
                    yield item
            finally:  # left early: the call is forgotten now, not when the loop finalizes it
                await chained.aclose()
            return
        wait.check()
        if self.outbox.blocked:
            await wait.bounded(self.outbox.wait_writable(), each=True)
        self._check_open()
        adapter = self.adapter
        queue = StreamQueue(self._loop, wait.item)
        key = None
        try:
            if parts is None:
                payload = self._checked_payload(op, adapter.encode_request(op, value))
                key = self.open_results(lambda: adapter.send_request(op, payload, False), queue)
            else:
                key = await self.send_stream_request(
                    op,
                    parts,
                    queue,
                    wait,
                    lambda data: adapter.send_request(op, self._checked_payload(op, data), True),
                )
            while True:
                item = await wait.next(queue)
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise await stream_error(item, self.closed, wait)
                yield item if raw else adapter.decode_result(item)
        finally:
            if key is not None:
                self._forget(key)

    async def send_stream_request(
        self,
        op: str,
        parts: Iterable[Any] | AsyncIterable[Any],
        queue: StreamQueue,
        wait: ResultWait,
        send: Callable[[bytes], K],
    ) -> K:
        """Send a stream request of ours and register ``queue`` for its results; its key.
        ``send(data)`` sends the request with its first part; the other parts and the end
        follow, by a task of the call's own once sending them has to wait, while the
        caller reads results (see :mod:`rpc.stream_request`)."""
        return await stream_request.send(self, op, parts, queue, wait, send)

    def _stream_call(self, key: K, queue: StreamQueue) -> _Call:
        """Register ``queue`` for the results of our stream ``key``; its call."""
        call = self._calls[key] = _Call(None, queue, None)
        return call

    def fail_calls(self, error: ConnectionClosed) -> None:
        """The connection is gone: every call of ours fails with ``error``, and a stream
        request still sending parts stops (its feeder is cancelled, even while it waits
        for its source; the stream's reader gets ``error``)."""
        for call in self._calls.values():
            if call.future is not None and not call.future.done():
                call.future.set_exception(error)
                call.future.exception()  # retrieved: no "never retrieved" noise
            if call.queue is not None:
                call.queue.put(error)
                _stop(call)
        self._calls.clear()

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
        now = self.deadlines.now()
        nearest = None
        for call in self._calls.values():
            deadline = call.deadline
            if deadline is None or call.future is None:
                continue
            if deadline <= now:
                if not call.future.done():
                    message = f"{call.op}: no result within {call.timeout} s"
                    call.future.set_exception(RequestTimeout(message))
            elif nearest is None or deadline < nearest:
                nearest = deadline
        if nearest is not None:
            self._watch_calls(nearest)

    # --- results of our calls (from the adapter) -------------------------------------------

    def on_result(self, key: K, payload: Any) -> None:
        call = self._calls.pop(key, None)
        if call is None:
            return  # late or unknown: ignored, as Go peers do
        if call.queue is not None:
            call.queue.put(payload)
            call.queue.put(END)
            _stop(call)
        elif call.future is not None and not call.future.done():
            call.future.set_result(payload)

    def on_result_part(self, key: K, payload: Any) -> None:
        """Queue a result of our stream ``key``. Past ``options.max_stream_queue`` unread
        results or ``options.max_size`` bytes of them, raises InputHeld (see
        :mod:`rpc.stream_hold`): the result waits, and the stream fails alone should its
        reader take none within its ``item_timeout`` (StreamOverflow; the peer is told,
        as on a cancel). A request of ours answered with a streamed result fails at once."""
        call = self._calls.get(key)
        if call is None:
            return
        queue = call.queue
        if queue is None:
            self._fail_call(key, _streamed_answer(call.op))
            self.adapter.abandon(key)  # the peer is told, as on a cancel: it stops
            return
        options = self.options
        if len(queue) >= options.max_stream_queue or queue.bytes >= options.max_size:
            self._stream_hold.hold(queue, lambda: self._stalled_results(key, queue))
        queue.put(payload)

    def _stalled_results(self, key: K, queue: StreamQueue) -> None:
        """Our stream's reader took none of its full queue's results in time: the stream
        fails alone, and the peer is told."""
        waiting, stall = len(queue), queue.stall
        self._fail_call(
            key, StreamOverflow(f"{waiting} stream results waiting, none taken for {stall} s")
        )
        self.adapter.abandon(key)

    def on_result_end(self, key: K) -> None:
        call = self._calls.pop(key, None)
        if call is None:
            return
        if call.queue is not None:
            call.queue.put(END)
            _stop(call)
        elif call.future is not None and not call.future.done():  # a streamed answer
            call.future.set_exception(_streamed_answer(call.op))

    def on_error(self, key: K, message: str) -> None:
        self._fail_call(key, RemoteError(message))

    def on_retry(self, key: K, wait: float, message: str) -> None:
        """A retry result: it answers ``key`` (so the call is done with; no cancel follows)
        and the caller decides whether to send the request again."""
        call = self._calls.pop(key, None)
        if call is None:
            return
        if call.queue is not None:
            call.queue.put(RetryLater(message, wait))
            _stop(call)
        elif call.future is not None and not call.future.done():
            call.future.set_result(RetryLater(message, wait))

    def _fail_call(self, key: K, exc: BaseException) -> None:
        call = self._calls.pop(key, None)
        if call is None:
            return
        if call.queue is not None:
            call.queue.put(exc)
            _stop(call)
        elif call.future is not None and not call.future.done():
            call.future.set_exception(exc)


def _stop(call: _Call) -> None:
    """``call`` is answered or gone: the feeder still sending its parts (if any) stops
    (a feeder failing forgets its call only after it has let go of it)."""
    if call.feeder is not None:
        call.feeder.cancel()
        call.feeder = None


def _streamed_answer(op: str) -> PayloadError:
    """What a request (not a stream) of ours that the peer answered with a streamed result
    fails with: its caller must call ``stream()`` for it."""
    return PayloadError(f"{op}: the peer answered with a streamed result; call stream() for it")
