"""The calls a connection serves: the peer's requests, stream requests and notifications,
dispatched to the registry's handlers, within the connection's limits.

:class:`Responder` is the half of :class:`~rpc.peer.Peer` that does this (calls with
middleware or request metadata go through :mod:`rpc.intercept` instead, which hands a
single request for an ``async def`` with its caller's deadline back, when there is no
middleware, to :meth:`Responder.serve_bounded`); it turns away what comes past the limits
or during a graceful close (:meth:`Responder.refuses`). Its bases: the parts of stream
requests reach their handlers through :class:`~rpc.served_streams.ServedStreams`, and the
handlers' results go back through :class:`~rpc.handler_results.HandlerResults` (handlers
that return an awaitable or an async generator are served as jobs of the peer's
:class:`~rpc.handler_runner.HandlerRunner`). Its state, set up by the peer: the keys of
the requests the peer may cancel in ``_running``, freed with the connection.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from types import CoroutineType
from typing import TYPE_CHECKING, Any

from rpc import intercept
from rpc.errors import CLOSING, PayloadError, RetryLater
from rpc.handler_results import PLAIN_RESULTS, HandlerResults
from rpc.key import K
from rpc.logs import violations
from rpc.middleware import Call, current_call
from rpc.notifications import run_notification
from rpc.registry import Handler, HandlerKind, Registry
from rpc.request_bytes import UNCOUNTED, counted_size
from rpc.served_streams import _parts as _parts
from rpc.stream_hold import InputHeld

if TYPE_CHECKING:
    from rpc.backlog import Backlog
    from rpc.peer import Peer
    from rpc.tasks import TaskSet

log = logging.getLogger("peerwire.rpc")

current_peer: contextvars.ContextVar[Peer] = contextvars.ContextVar("peerwire_current_peer")
"""The peer whose request is being handled; lets a handler call back into its caller."""

_STREAM = HandlerKind.STREAM
"""A module global: reading an Enum member off its class costs about 100 ns in Python 3.11,
a global about 10, and it is read per request."""


class NotificationsHeld(InputHeld):
    """Raised by :meth:`Responder.on_notification` when the connection's tasks are all taken:
    a notification has no answer to refuse it with, so the peer keeps it (and what follows
    it) until a task ends. Raised only then, so that the per-message loop checks nothing
    for it."""


class NoTaskSlot(NotificationsHeld):
    """Raised by :meth:`Responder.on_notification` itself when ``max_concurrent`` tasks run.
    Unlike a handler's own refusal, which pauses reading until the message runs, the peer
    reads on (see :meth:`rpc.input_flow.InputFlow._holds_all`): the tasks holding the
    slots may wait for replies from this very peer."""


class Responder(HandlerResults[K]):
    """The calls the peer makes to us (mixed into :class:`~rpc.peer.Peer`, which sets up
    the attributes below and those of its bases)."""

    registry: Registry
    remote_address: Any
    _tasks: TaskSet
    _intercepted: bool
    _task_slots: int
    _kept: Backlog
    gave_up: BaseException | None

    if TYPE_CHECKING:

        def calls_waited_for(self) -> list[asyncio.Future[Any]]: ...

    @property
    def handlers_running(self) -> int:
        """Handlers running or queued to run: coroutine handlers, streamed results and
        notifications' tasks (requests among them: at most ``options.max_concurrent``)."""
        return len(self._tasks) + self._runner.jobs

    def refuses(self, key: K, stream: bool) -> bool:
        """Turn request ``key`` away unrun (True) when it comes past ``max_concurrent`` or
        ``max_request_bytes`` ("request rate limit"), or while a graceful
        :meth:`~rpc.closing.Closing.close` drains the connection once no call of ours is in
        flight (until then the peer's requests run: its handlers of those calls may call us
        back to answer them). A peer that takes retry results gets one (for the close,
        :data:`~rpc.errors.CLOSING`: its caller may send it again, on another connection);
        one that does not has its requests wait for the limits before they come here (see
        :mod:`rpc.input_flow`), and during the close gets nothing for what it sent after
        the close began (:meth:`turned_away`), while what it sent before runs. Calls of
        ours: those the drain waits for (not streams). :meth:`on_request` and
        :meth:`serve_bounded` call it only when their inlined copy of the tests below (no
        call per request) finds a limit reached or a close begun: these tests then say
        which (the message), and are the only ones for :func:`rpc.intercept.serve_request`."""
        if self.gave_up is not None and self.turned_away():  # (before the limits: it takes
            if stream:  # no slot) its parts are dropped as they come
                self._end_stream(key)
            self.adapter.drop_request(key)
            return True
        if self.handlers_running >= self.options.max_concurrent or self._request_bytes.full:
            if not self.adapter.retry_results:  # learnt in this very read (a plain Hat
                raise NoTaskSlot  # peer): it waits, and what follows it, as it would have
            message = "request rate limit"
        elif self.gave_up is None or self.calls_waited_for() or not self.adapter.retry_results:
            return False
        else:
            message = CLOSING
        self.adapter.send_retry(key, self.options.retry_wait, message)
        if stream:
            self._end_stream(key)
        return True

    def turned_away(self) -> bool:
        """True for a request or notification a graceful close does not run, from a peer
        that takes no retry results: read after the close began, while no call of ours is
        in flight. It is dropped unanswered, as if never read: its caller sees the
        connection close, the request not run (safe to send again), and the close does not
        wait for it, however busy the peer. What such a peer sent before the close runs and
        is answered (kept unrun till then: when its turn comes); the replies to our calls,
        its cancellations and the parts of its stream requests that run are read and
        handled throughout the drain. Kept ones count as read before or during a call of
        ours by their read (:meth:`rpc.peer.Peer._read_in_close`), in one clock tick too."""
        return (
            not self.adapter.retry_results
            and self._kept.read_at >= self._close_began
            and not self.calls_waited_for()
        )

    # --- requests and notifications from the peer (from the adapter) -----------------------

    def on_notification(self, name: str, payload: Any) -> None:
        """Run ``name``'s handler; raises :class:`NoTaskSlot` while ``max_concurrent`` tasks
        run, at least one (the peer keeps this message and what follows it until one
        ends)."""
        if self.gave_up is not None and self.turned_away():
            return  # (before its slot is waited for)
        if len(self._tasks) >= self._task_slots:
            raise NoTaskSlot
        if self._intercepted:
            intercept.serve_notification(self, name, payload)  # type: ignore[arg-type]
            return
        handler = self.registry.get_notification(name)
        if handler is None:
            log.debug("no handler for notification %r", name)
            return
        try:
            value = self.adapter.decode_params(handler, payload)
        except PayloadError as exc:  # the peer's fault, per message: rate-limited
            violations.warning(
                "notification %r from %s dropped: %s", name, self.remote_address, exc
            )
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
        if handler is None or (handler.kind is _STREAM) != stream:
            if handler is None:
                adapter.send_error(key, f'unknown operation "{op}"')
            else:
                kind = "stream" if stream else "single"
                adapter.send_error(key, f'operation "{op}" does not take {kind} requests')
            if stream:
                self._end_stream(key)
            return
        # handlers_running inlined: once per request
        held = self._request_bytes
        if (
            len(self._tasks) + self._runner.jobs >= self.options.max_concurrent
            or held.used >= held.limit
            or self.gave_up is not None
        ) and self.refuses(key, stream):
            return
        parts = None  # a stream's, until its job has it: released if none will
        try:  # current_peer is set: the peer sets it around every batch it dispatches
            if stream:
                parts = self.open_parts(key)
                if payload:
                    parts.put(payload)
                result = handler.fn(_parts(parts, handler.decode))
            else:
                result = handler.fn(adapter.decode_params(handler, payload))
            if result.__class__ in PLAIN_RESULTS:
                self._reply(key, result, stream)
                return
            if result.__class__ is CoroutineType:
                job, inner = self._serve_result(key, result, stream), result
            elif inspect.isawaitable(result):
                job, inner = self._serve_result(key, result, stream), None
            elif inspect.isasyncgen(result):
                job, inner = self._stream_result(key, result), None
            else:
                self._reply(key, result, stream)
                return
            if adapter.cancels:  # before the job can run (and end)
                self._running.add(key)
            if stream:
                self._runner.submit(key, job, inner, 0, parts)
            elif payload.__class__ is bytes:  # counted_size() written out: once per request
                size = len(payload)
                self._runner.submit(key, job, inner, size if size > UNCOUNTED else 0)
            else:
                self._runner.submit(key, job, inner, counted_size(payload))
            parts = None
        except PayloadError as exc:
            if stream:
                self._end_stream(key)
            adapter.send_error(key, str(exc))
        except RetryLater as exc:
            if stream:
                self._end_stream(key)
            self.send_retry_later(key, exc)
        except Exception as exc:
            if stream:
                self._end_stream(key)
            log.debug("handler %r failed", op, exc_info=True)
            adapter.send_error(key, str(exc) or type(exc).__name__)
        except BaseException as exc:  # not an Exception: a `class Stop(BaseException)`
            self.escaped(key, exc, job=False)  # (KeyboardInterrupt: then on to the loop)
        finally:
            if parts is not None:
                parts.release_held()

    def serve_bounded(
        self, key: K, handler: Handler, payload: Any, call: Call, when: float
    ) -> None:
        """A single request for an ``async def`` handler that came with its caller's
        deadline, on a connection without middleware: served as :meth:`on_request` serves
        one, with ``call`` as the handler's :data:`rpc.current_call` and its coroutine
        cancelled at loop time ``when`` (the caller then gets an error result saying its
        deadline passed). The middleware path would cost a job running a chain of one, a
        frame more per step and a context it sets itself."""
        adapter = self.adapter
        if (
            len(self._tasks) + self._runner.jobs >= self.options.max_concurrent
            or self._request_bytes.full
            or self.gave_up is not None
        ) and self.refuses(key, False):
            return
        token = current_call.set(call)  # the job's context is a copy of this one
        try:
            result = handler.fn(adapter.decode_params(handler, payload))
            inner = result if result.__class__ is CoroutineType else None
            if inner is None and not inspect.isawaitable(result):
                self._reply(key, result, False)  # marked a coroutine function, yet is not
                return
            if adapter.cancels:  # before the job can run (and end)
                self._running.add(key)
            job = self._serve_result(key, result, False, when, call.op)
            self._runner.submit(key, job, inner, counted_size(payload))
        except PayloadError as exc:
            adapter.send_error(key, str(exc))
        except Exception as exc:
            log.debug("handler %r failed", call.op, exc_info=True)
            adapter.send_error(key, str(exc) or type(exc).__name__)
        except BaseException as exc:  # not an Exception: as in on_request
            self.escaped(key, exc, job=False)
        finally:
            current_call.reset(token)

    def cancellable(self, key: K) -> bool:
        """True while request ``key``'s handler runs and the peer may cancel it (it takes
        the cancellation extension)."""
        return key in self._running

    def on_cancel(self, key: K) -> None:
        """The caller gave up on request ``key`` (peerwire extension): cancel its handler.
        Its late result, if any, is dropped by the caller."""
        if key in self._running:
            self._running.discard(key)
            self._runner.cancel(key)
        if key in self._streams:
            self._end_stream(key)
