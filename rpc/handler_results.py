"""What becomes of a served request's handler once it is called: its result, error or
retry result sent back, and its job when it returned an awaitable or an async generator.

:class:`HandlerResults` is the half of :class:`~rpc.responder.Responder` (mixed into
:class:`~rpc.peer.Peer`, which sets up the attributes it names) that answers: a plain
result at once (:meth:`~HandlerResults._reply`), a coroutine's or a streamed result as a
job of the peer's :class:`~rpc.handler_runner.HandlerRunner`, written at once when nothing
is coming to join it (:meth:`~HandlerResults._answer`); a handler's BaseException that is
not an Exception answered as an error (:meth:`~HandlerResults.escaped`). Also used by
:mod:`rpc.intercept` for calls that go through middleware.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rpc.errors import ConnectionClosed, PayloadError, RetryLater
from rpc.escapes import PASSED_ON, report
from rpc.key import K
from rpc.served_streams import ServedStreams
from rpc.streaming import PARTS_PER_TURN
from rpc.tasks import being_cancelled

if TYPE_CHECKING:
    from rpc.call_bounds import CallBounds
    from rpc.handler_runner import HandlerRunner
    from rpc.outbox import Outbox

log = logging.getLogger("peerwire.rpc")

OWN_CANCEL = "the handler was cancelled (not by its caller)"
"""The error result of a handler that ended in a CancelledError of its own."""
LEFT_TO_RUNNER = (GeneratorExit, *PASSED_ON)
"""BaseExceptions a handler's job does not answer: its coroutine closed, or one the runner
answers and then passes on (:data:`rpc.escapes.PASSED_ON`)."""
PLAIN_RESULTS = frozenset({bytes, bytearray, str, int, float, bool, dict, list, type(None)})
"""Result types that are never awaitable nor async iterators: no ``inspect`` check for
them (those are ABC checks, slow)."""


class HandlerResults(ServedStreams[K]):
    """The answers to the calls the peer makes to us (see the module doc; mixed into
    :class:`~rpc.peer.Peer` through :class:`~rpc.responder.Responder`)."""

    outbox: Outbox
    _runner: HandlerRunner[K]
    _backlog: deque[Any]
    _running: set[K]
    call_bounds: CallBounds

    if TYPE_CHECKING:

        @property
        def is_open(self) -> bool: ...

    def send_retry_later(self, key: K, exc: RetryLater) -> None:
        """Answer ``key`` with a retry result for a handler's (or middleware's)
        RetryLater, or with an error where the protocol has none."""
        if self.adapter.retry_results:
            self.adapter.send_retry(key, exc.wait, str(exc))
        else:
            self.adapter.send_error(key, str(exc) or "retry later")

    async def _serve_result(
        self, key: K, awaitable: Any, stream: bool, until: float | None = None, op: str = ""
    ) -> None:
        """The runner's job for a handler that returned an awaitable: await its result
        (cancelled at loop time ``until``, if given: the caller's deadline for ``op``) and
        send it. Raises CancelledError when cancelled (by the caller: after telling it
        so); every other exception is answered or logged here. An async generator it
        returns (an ``async def`` that returns one) is streamed, as through middleware."""
        result: Any = None
        try:
            try:
                if until is None:
                    result = await awaitable
                else:
                    result = await self.call_bounds.within(awaitable, until, op)
            except asyncio.CancelledError as exc:
                if self.own_cancel():  # the handler's own: an error as any other
                    if self.is_open:
                        self._answer(self.adapter.send_error, key, str(exc) or OWN_CANCEL)
                    return
                if key not in self._running and self.is_open:  # the caller's (on_cancel)
                    self._answer(self.adapter.send_error, key, "cancelled by the caller")
                raise
            except RetryLater as exc:
                if self.is_open:
                    self._answer(self.send_retry_later, key, exc)
                return
            except Exception as exc:
                log.debug("handler failed", exc_info=True)
                if self.is_open:
                    self._answer(self.adapter.send_error, key, str(exc) or type(exc).__name__)
                return
            except BaseException as exc:  # not an Exception: a `class Stop(BaseException)`
                if isinstance(exc, LEFT_TO_RUNNER):
                    raise
                self.escaped(key, exc)
                return
            finally:  # a streamed result stays cancellable, its stream open, until it ends
                streamed = result.__class__ not in PLAIN_RESULTS and inspect.isasyncgen(result)
                if not streamed:
                    running = self._running
                    if running:  # keys only while the peer takes cancellations
                        running.discard(key)
                    if stream and key in self._streams:
                        self._end_stream(key)
            if streamed:
                await self._stream_result(key, result)
                return
            outbox = self.outbox
            if outbox.blocked:
                await outbox.wait_writable()
            if self.is_open:  # _answer(self._reply, ...) written out: once per request
                held = self._runner.jobs == 1 and not self._backlog and outbox.hold()
                try:
                    self._reply(key, result, stream)
                finally:
                    if held:
                        outbox.release()
        except ConnectionClosed:
            return  # gone while waiting to write: nothing to answer to
        except Exception:  # a bug of ours: no done callback would report it
            log.exception("the result of a request could not be sent")

    async def _stream_result(self, key: K, agen: Any) -> None:
        adapter = self.adapter
        sent = 0
        try:
            async for item in agen:
                if self.outbox.blocked:
                    await self.outbox.wait_writable()  # a turn of the loop too
                    sent = 0
                elif sent >= PARTS_PER_TURN:  # a generator that never waits yields the loop
                    sent = 0
                    await asyncio.sleep(0)
                if not self.is_open:
                    return
                adapter.send_result_part(key, self._encoded_result(item))
                sent += 1
        except asyncio.CancelledError as exc:
            if self.own_cancel():  # the handler's own: an error as any other
                if self.is_open:
                    self._answer(self._fail_stream, key, str(exc) or OWN_CANCEL)
                return
            if self.is_open and key not in self._running:  # the caller cancelled it
                self._answer(self._fail_stream, key, "cancelled by the caller")
            raise
        except Exception as exc:
            if self.is_open:
                self._answer(self._fail_stream, key, str(exc) or type(exc).__name__)
            return
        except BaseException as exc:  # not an Exception: a `class Stop(BaseException)`
            if isinstance(exc, LEFT_TO_RUNNER):
                raise  # (the runner's error result ends the stream on both wire formats)
            self.escaped(key, exc, streamed=True)
            return
        finally:
            self._running.discard(key)
            if key in self._streams:
                self._end_stream(key)
            # left at a yield (cancelled, the connection gone, an unencodable item): its
            # cleanup (finally, async with) runs now, not when a gc finds the cycle our
            # exception's traceback makes with this frame (a lock it held stayed taken)
            await _close(agen)
        if self.is_open:
            self._answer(adapter.send_result_end, key, False)

    def escaped(
        self, key: K, exc: BaseException, *, job: bool = True, streamed: bool = False
    ) -> None:
        """Answer request ``key``, whose handler (or middleware) raised ``exc``, a
        BaseException that is not an Exception (a ``class Stop(BaseException)``; from a
        plain function, a CancelledError or GeneratorExit too: nothing may leave the read),
        with an error result at once, and log it (an error, with its traceback: such an exception
        is meant to stop more than a call, and here stops only its own). The stream
        request's parts are dropped; ``streamed``: its streamed result ends with the
        error. ``job``: from a handler's job (else from the handler's call, in the peer's
        read: one of :data:`~rpc.escapes.PASSED_ON` is then raised again from a callback
        of its own, never in the read, which would leave the outbox held; see
        :mod:`rpc.escapes`). Logged rate-limited. Called by the job itself,
        or for what it leaves to the runner (:data:`LEFT_TO_RUNNER`, a middleware's) by
        :class:`~rpc.handler_runner.HandlerRunner`, which passes those on itself."""
        report(
            exc,
            "request %r: its handler raised %s, not an Exception; answered with an error",
            key,
            type(exc).__name__,
            loop=None if job else self._loop,  # KeyboardInterrupt: then on to the loop's run
        )
        self._running.discard(key)
        if key in self._streams:
            self._end_stream(key)
        if not self.is_open:
            return
        message = str(exc) or type(exc).__name__
        if streamed:
            self._answer(self._fail_stream, key, message)
        elif job:
            self._answer(self.adapter.send_error, key, message)
        else:
            self.adapter.send_error(key, message)

    def own_cancel(self) -> bool:
        """True when a CancelledError that reached a handler's job is the handler's own (it
        awaited something another task cancelled): every cancel of ours (the caller's, a
        deadline's, the connection's end) cancels the task running the job, which is then
        cancelling; the handler's own does not, and is answered as any other error."""
        return not being_cancelled(self._loop)

    def _fail_stream(self, key: K, message: str) -> None:
        """End our streamed result ``key`` with an error."""
        self.adapter.send_error(key, message)
        self.adapter.send_result_end(key, True)

    def _answer(self, send: Callable[..., None], *args: Any) -> None:
        """Send the last word of a handler's job, ``send(*args)``: a coroutine handler's
        single reply (result, error, retry result) or the end of a streamed result (with
        the parts still queued). When it is the runner's only job and no read waits to be
        handled, nothing is coming to join it: it is written at once, under the outbox's
        hold (:meth:`~rpc.outbox.Outbox.hold`), not by a flush scheduled for the next loop
        iteration, which a caller making one call at a time would wait for every time.
        Notification tasks do not take part; a streamed result's parts go out with the
        loop iteration's flush as they come."""
        held = self._runner.jobs == 1 and not self._backlog and self.outbox.hold()
        try:
            send(*args)
        finally:
            if held:
                self.outbox.release()

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


async def _close(agen: Any) -> None:
    """Close a handler's async generator (nothing once it ended); its own failure in doing
    so is logged, not raised over the reason it was closed."""
    try:
        await agen.aclose()
    except Exception:
        log.debug("closing a streamed result's generator failed", exc_info=True)
