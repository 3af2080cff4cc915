"""The calls a connection serves: the peer's requests, stream requests and notifications,
run by the registry's handlers, and their results sent back.

:class:`Responder` is the half of :class:`~rpc.peer.Peer` that does this (calls with
middleware or request metadata go through :mod:`rpc.intercept` instead). Its state,
set up by the peer: incoming streams in ``_streams`` (at most ``max_concurrent``; each
queue at most ``max_stream_queue`` parts, past which that stream alone fails), streams
ended early in ``_ended`` (the last :data:`ENDED_STREAMS`), and the handler tasks the peer
may cancel in ``_running``; all freed with the connection.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import types
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Generic

from rpc import intercept
from rpc.calls import END
from rpc.errors import ConnectionClosed, PayloadError, RemoteError
from rpc.key import K
from rpc.notifications import run_notification
from rpc.registry import HandlerKind, Registry

if TYPE_CHECKING:
    from rpc.handler_runner import HandlerRunner, Running
    from rpc.options import Adapter, Options
    from rpc.outbox import Outbox
    from rpc.peer import Peer
    from rpc.tasks import TaskSet

log = logging.getLogger("peerwire.rpc")

current_peer: contextvars.ContextVar[Peer] = contextvars.ContextVar("peerwire_current_peer")
"""The peer whose request is being handled; lets a handler call back into its caller."""

ENDED_STREAMS = 256
"""Incoming streams remembered after we stopped taking their parts (refused, failed or
answered early), so their late parts are dropped instead of counting as parts of an
unknown stream (a protocol violation for Gotalk). Older ones are forgotten."""
# result types that are never awaitable: skip inspect.isasyncgen/isawaitable (ABC checks)
_PLAIN_RESULTS = frozenset({bytes, bytearray, str, int, float, bool, dict, list, type(None)})
_END = END
_COROUTINE = types.CoroutineType


class Responder(Generic[K]):
    """The calls the peer makes to us (mixed into :class:`~rpc.peer.Peer`, which sets up
    the attributes below)."""

    registry: Registry
    adapter: Adapter[K]
    options: Options
    outbox: Outbox
    remote_address: Any
    _tasks: TaskSet
    _runner: HandlerRunner[K]
    _streams: dict[K, asyncio.Queue[Any]]
    _ended: OrderedDict[K, None]
    _running: dict[K, asyncio.Task[Any] | HandlerRunner[K]]
    _intercepted: bool

    if TYPE_CHECKING:

        @property
        def is_open(self) -> bool: ...

    # --- requests and notifications from the peer (from the adapter) -----------------------

    def on_notification(self, name: str, payload: Any) -> None:
        if self._intercepted:
            intercept.serve_notification(self, name, payload)  # type: ignore[arg-type]
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
        run_notification(handler, value, self._tasks)  # current_peer: set by the peer

    def on_request(self, key: K, op: str, payload: Any, stream: bool) -> None:
        """Run the handler of ``op``; a refused stream request keeps no state (its later
        parts are dropped as parts of an unknown stream)."""
        if self._intercepted:
            intercept.serve_request(self, key, op, payload, stream)  # type: ignore[arg-type]
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
        if len(self._tasks) + self._runner.jobs >= self.options.max_concurrent:
            adapter.send_retry(key, self.options.retry_wait, "request rate limit")
            if stream:
                self._end_stream(key)
            return
        try:  # current_peer is set: the peer sets it around every batch it dispatches
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
            elif result.__class__ is _COROUTINE:
                self._runner.submit(key, result, stream)
                if adapter.cancels:
                    self._running[key] = self._runner
            elif inspect.isasyncgen(result):
                task = self._tasks.start(self._stream_result(key, result))
                if adapter.cancels and not task.done():
                    self._running[key] = task
            elif inspect.isawaitable(result):
                task = self._tasks.start_leaving(self._await_result(key, result, stream))
                if adapter.cancels and not task.done():
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

    def _end_stream(self, key: K) -> None:
        """Stop taking parts of incoming stream ``key``; remember it for a while."""
        self._streams.pop(key, None)
        ended = self._ended
        ended[key] = None
        if len(ended) > ENDED_STREAMS:
            ended.popitem(last=False)

    def on_request_part(self, key: K, payload: Any) -> bool:
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

    def on_request_end(self, key: K) -> bool:
        """End a stream's parts. False: no such stream, now or lately."""
        queue = self._streams.pop(key, None)
        if queue is None:
            if key not in self._ended:
                return False
            del self._ended[key]
            return True
        queue.put_nowait(_END)
        return True

    def has_stream(self, key: K) -> bool:
        """True while an incoming stream request ``key`` takes parts."""
        return key in self._streams

    # --- handler completion ----------------------------------------------------------------

    def on_cancel(self, key: K) -> None:
        """The caller gave up on request ``key`` (peerwire extension): cancel its handler.
        Its late result, if any, is dropped by the caller."""
        owner = self._running.pop(key, None)
        if owner is self._runner:
            self._runner.cancel(key)
        elif owner is not None:
            self._tasks.cancel(owner)  # type: ignore[arg-type]
        if key in self._streams:
            self._end_stream(key)

    async def _await_result(self, key: K, awaitable: Any, stream: bool) -> None:
        """The task of a handler that returned an awaitable other than a coroutine (those
        go to the runner): serve it, then leave the task set (see
        :meth:`~rpc.tasks.TaskSet.start_leaving`)."""
        try:
            await self.serve_result(key, awaitable, stream)
        finally:
            self._leave(key)

    async def serve_result(self, key: K, awaitable: Running[K] | Any, stream: bool) -> None:
        """Await a handler's result and send it: a job of the runner's, or the body of a
        handler's task. Raises CancelledError when cancelled (by the caller: after telling
        it so); every other exception is answered or logged here."""
        try:
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
                self._runner.cover()  # queued handlers need not wait with this result
                await self.outbox.wait_writable()
            if self.is_open:
                self._reply(key, result, stream)
        except ConnectionClosed:
            return  # gone while waiting to write: nothing to answer to
        except Exception:  # a bug of ours: no done callback would report it
            log.exception("the result of a request could not be sent")

    def _leave(self, key: K) -> None:
        """A handler task's last act: drop its cancel registration if it still holds one
        (made after an eager first step on 3.12 that then waited to write), and leave the
        task set."""
        task = asyncio.current_task()
        if self._running.get(key) is task:
            del self._running[key]
        self._tasks.leave(task)

    async def _stream_result(self, key: K, agen: Any) -> None:
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

    def _reply(self, key: K, result: Any, stream: bool) -> None:
        """Send a handler's single result (to a stream request too: then the handler is
        done with the request's parts, and the stream's state goes)."""
        if result.__class__ is bytes and not stream and len(result) <= self.options.max_size:
            self.adapter.send_result(key, result, False)  # bytes go out as they are
            return
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
