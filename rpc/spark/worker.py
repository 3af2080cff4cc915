"""The executor side: one event loop per Python worker, a connection pool, a call pipeline.

Spark runs UDFs in long-lived Python worker processes (``spark.python.worker.reuse``), one
task at a time per process. Everything here is per process and survives from task to task:

- :func:`runtime` starts one event loop (:func:`rpc.loops.new_event_loop`: uvloop when
  installed, or as ``PEERWIRE_LOOP`` says) in a daemon thread the first time it is needed
  (and again after a ``fork``: threads do not survive one).
- :class:`rpc.spark.pool.ConnectionPool` keeps one connection per :class:`Endpoint` (a
  :class:`rpc.spark.reconnect.Link`), at most ``max_connections`` (default 64) of them, the
  least recently used idle one closed to make room; a connection found closed (the peer
  restarted) is replaced by one reconnect task with back-off, which the calls that need it
  wait for within their time budget.
- :func:`make_caller` makes one row's call, resending it only when that is safe.
- :class:`Pipeline` runs the calls of a stream of batches with at most ``window`` in flight
  over that one connection; the core matches replies to requests. The UDF thread hands a
  batch over with :meth:`Pipeline.submit` and collects it later, so the next batch is read
  from Spark while the previous one is on the wire.

Nothing here imports pyspark: the same code runs in tests and benchmarks without Spark.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rpc import loops
from rpc.backoff import full_jitter
from rpc.errors import ConnectionClosed, RequestTimeout, RetryLater, RpcError
from rpc.payload import PayloadError
from rpc.spark.pool import MAX_CONNECTIONS, ConnectionPool, Endpoint, PoolFull
from rpc.spark.reconnect import Link, LoopErrors
from rpc.tasks import being_cancelled

log = logging.getLogger("peerwire.spark")

T = TypeVar("T")

Outcome = tuple[Any, str | None]
"""One row's result: ``(value, None)`` or ``(None, "ErrorType: message")``."""
Results = tuple[list[Any], list[str | None]]
"""A batch's results and errors, in input order."""


def describe(exc: BaseException) -> str:
    """The text of a row's error column: exception type and message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- the worker loop ---------------------------------------------------------------------


class Runtime:
    """A process's event loop thread and connection pool."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = loops.new_event_loop()
        errors = LoopErrors()
        self.loop.set_exception_handler(errors)
        self.pool = ConnectionPool(self.loop, errors)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="peerwire-spark-loop", daemon=True
        )
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run a coroutine on the loop; the caller waits on the returned future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the loop and wait for its result (not from the loop itself)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RuntimeError("blocking call from inside the peerwire-spark loop")
        return self.submit(coro).result(timeout)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self, timeout: float = 2.0) -> None:
        """Close pooled connections, end every task still running (pipelines nobody
        closed), then stop the loop; best effort, for interpreter exit."""
        if not self._thread.is_alive():
            return
        try:
            self.submit(self._shutdown()).result(timeout)
        except Exception:
            log.debug("shutting the peerwire-spark loop down failed", exc_info=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)

    async def _shutdown(self) -> None:
        await self.pool.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


_lock = threading.Lock()
_runtime: Runtime | None = None


def runtime() -> Runtime:
    """This process's runtime, started on first use (and anew in a forked child)."""
    global _runtime
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = Runtime()
        return _runtime


@atexit.register
def _close_runtime() -> None:
    if _runtime is not None and _runtime.pid == os.getpid():
        _runtime.close(timeout=1.0)


# --- calls -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallPolicy:
    """How one remote operation is called from executors."""

    op: str
    timeout: float | None = None
    """Seconds each attempt waits for its result; None = the protocol's default."""
    idempotent: bool = False
    """Calls in flight when their connection died are sent again only for idempotent ops."""
    retry_for: float = 30.0
    """Seconds a row may spend waiting for the peer (reconnecting) and resending."""
    retries: int | None = None
    """At most this many resends per row (None: as many as ``retry_for`` allows)."""
    backoff: float = 0.2
    """First wait before a resend (retry results, lost idempotent calls); doubled each time,
    at most ``max_backoff``, full jitter; a retry result's own wait is honoured when longer."""
    max_backoff: float = 5.0
    max_connections: int = MAX_CONNECTIONS
    """A row of this op that needs a new link closes the pool's least recently used idle
    one first when the pool holds this many (see :mod:`rpc.spark.pool`)."""


@dataclass(slots=True)
class Tally:
    """Per-op counts of one pipeline (one Spark task): rows called, failed, resends."""

    calls: int = 0
    errors: int = 0
    retries: int = 0


def make_caller(
    pool: ConnectionPool, endpoint: Endpoint, policy: CallPolicy, tally: Tally | None = None
) -> Callable[[Any], Awaitable[Outcome]]:
    """The per-row coroutine function: one remote call, resent only when that is safe.

    A row waits for the connection within ``policy.retry_for`` seconds (from its start, or
    the outage's, if earlier). A request that was never sent, or was answered with a retry
    result (the peer did not run it), is sent later for any op. A call in flight when the
    connection died has an unknown fate: it fails unless the op is idempotent. Error
    results, timeouts and payload errors are never resent. A row holds its endpoint's link
    from its start to its end, so the pool never closes it under the row; when the pool is
    full of links with rows on them, the row waits for room within the same budget.
    """
    loop = pool.loop
    budget = policy.retry_for
    borrower = pool.borrower(endpoint, policy.max_connections)
    counts = tally if tally is not None else Tally()
    lost = f"ConnectionClosed: connection to {endpoint.url} lost with the call in flight"

    async def call(value: Any) -> Outcome:
        started = loop.time()
        link = borrower.take()
        if link is None:  # the pool is full and every link has rows on it
            try:
                link = await borrower.wait(started + budget)
            except PoolFull as exc:  # never sent
                return None, describe(exc)
        try:
            return await attempts(link, value, started)
        finally:
            borrower.give_back(link)

    async def attempts(link: Link, value: Any, started: float) -> Outcome:
        resends = 0
        while True:
            peer = link.ready()
            probe = False
            if peer is None:
                try:
                    peer, probe = await link.get(started, budget)
                except ConnectionClosed as exc:  # never sent: the peer stayed down
                    return None, describe(exc)
                if not peer.is_open:
                    if probe:
                        link.settled(peer, answered=False)
                    continue  # closed while this call was being woken: not sent
            # sent from here on (unless the transport's buffer is full and the connection
            # dies while the request waits for room: then it counts as lost too)
            answered: bool | None = False  # a result, an error or a retry result came back
            try:
                result = await peer.request(policy.op, value, timeout=policy.timeout)
                answered = True
                return result, None
            except RetryLater as exc:  # the peer did not run it: safe to send again
                answered = True
                error, wait = describe(exc), exc.wait
            except ConnectionClosed:
                if not policy.idempotent:
                    return None, lost
                error, wait = lost, 0.0
            except RequestTimeout as exc:
                return None, describe(exc)
            except PayloadError as exc:  # maybe ours, before it was sent: not a probe's answer
                answered = None
                return None, describe(exc)
            except RpcError as exc:
                answered = True
                return None, describe(exc)
            finally:
                if probe:
                    link.settled(peer, answered)
            if policy.retries is not None and resends >= policy.retries:
                return None, error
            wait = max(wait, full_jitter(resends + 1, policy.backoff, policy.max_backoff))
            if loop.time() + wait > started + budget:
                return None, error
            resends += 1
            counts.retries += 1
            await asyncio.sleep(wait)

    return call


# --- the pipeline ------------------------------------------------------------------------


class _Batch:
    __slots__ = ("errors", "future", "left", "next", "results", "values")

    def __init__(self, values: Sequence[Any], future: concurrent.futures.Future[Results]) -> None:
        self.values = values
        self.results: list[Any] = [None] * len(values)
        self.errors: list[str | None] = [None] * len(values)
        self.next = 0
        self.left = len(values)
        self.future = future


class Pipeline:
    """Runs ``fn(value)`` for every value of the submitted batches, ``window`` at a time.

    ``fn`` returns an :data:`Outcome` and should not raise (if it does, the row gets the
    error). Workers are started as rows arrive, never more than ``window``; they take rows
    in order, so a batch's calls go out before the next batch's. :meth:`submit` and
    :meth:`close` may be called from any thread.
    """

    def __init__(
        self,
        runtime: Runtime,
        fn: Callable[[Any], Awaitable[Outcome]],
        window: int = 128,
        tally: Tally | None = None,
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.runtime = runtime
        self.fn = fn
        self.window = window
        self.tally = tally if tally is not None else Tally()
        """Rows run and failed so far (resends are counted by ``fn``)."""
        self._bugs = 0
        self._batches: deque[_Batch] = deque()  # batches with rows not taken yet
        self._unfinished: set[_Batch] = set()
        self._workers: set[asyncio.Task[None]] = set()
        self._idle = 0
        self._wakeup = asyncio.Event()  # bound to the runtime's loop by its first wait
        self._closed = False

    def submit(self, values: Sequence[Any]) -> concurrent.futures.Future[Results]:
        """Queue a batch; the future resolves to ``(results, errors)`` in input order."""
        future: concurrent.futures.Future[Results] = concurrent.futures.Future()
        if not values:
            future.set_result(([], []))
        else:
            self.runtime.call_soon(self._add, _Batch(values, future))
        return future

    def close(self) -> None:
        """Stop the workers; batches not finished yet are cancelled."""
        self.runtime.call_soon(self._close)

    # --- on the loop ---

    def _add(self, batch: _Batch) -> None:
        if self._closed:
            batch.future.cancel()
            return
        self._batches.append(batch)
        self._unfinished.add(batch)
        self._wakeup.set()
        queued = sum(len(b.values) - b.next for b in self._batches)
        wanted = min(self.window, len(self._workers) - self._idle + queued)
        while len(self._workers) < wanted:
            task = self.runtime.loop.create_task(self._work())
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    def _close(self) -> None:
        self._closed = True
        if self._bugs > 1:
            log.error("%d more peerwire-spark calls failed unexpectedly", self._bugs - 1)
        for task in list(self._workers):
            task.cancel()
        for batch in self._unfinished:
            batch.future.cancel()
        self._batches.clear()
        self._unfinished.clear()

    async def _work(self) -> None:
        batches = self._batches
        while True:
            if not batches:
                self._idle += 1
                self._wakeup.clear()
                try:
                    await self._wakeup.wait()
                finally:
                    self._idle -= 1
                continue
            batch = batches[0]
            i = batch.next
            batch.next += 1
            if batch.next == len(batch.values):
                batches.popleft()
            try:
                result, error = await self.fn(batch.values[i])
            except asyncio.CancelledError as exc:
                if self._closed or being_cancelled():
                    raise
                # fn's own cancellation (a future someone else cancelled): the row's error,
                # or the row would never finish and its batch never resolve
                result, error = None, describe(exc)
            except Exception as exc:  # a bug in fn: the row says so, the batch goes on
                self._bugs += 1
                if self._bugs == 1:  # once per pipeline; close() gives the count
                    log.exception("peerwire-spark call failed unexpectedly")
                result, error = None, describe(exc)
            tally = self.tally
            tally.calls += 1
            if error is not None:
                tally.errors += 1
            batch.results[i] = result
            batch.errors[i] = error
            batch.left -= 1
            if batch.left == 0:
                self._unfinished.discard(batch)
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    batch.future.set_result((batch.results, batch.errors))
