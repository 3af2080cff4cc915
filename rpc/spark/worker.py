"""The executor side: one event loop per Python worker, a connection pool, a call pipeline.

Spark runs UDFs in long-lived Python worker processes (``spark.python.worker.reuse``), one
task at a time per process. Everything here is per process and survives from task to task:

- :func:`runtime` starts one event loop (:func:`rpc.loops.new_event_loop`: uvloop when
  installed, or as ``PEERWIRE_LOOP`` says) in a daemon thread the first time it is needed
  (and again after a ``fork``: threads do not survive one).
- :class:`ConnectionPool` keeps one :class:`rpc.Peer` per :class:`Endpoint`; a connection
  found closed (Spark recycled the server, the peer went away) is replaced on next use, and
  concurrent users share one connection attempt.
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
import random
import ssl
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rpc import loops
from rpc.api import connect
from rpc.errors import ConnectionClosed, RetryLater, RpcError
from rpc.payload import PayloadError
from rpc.peer import Options, Peer
from rpc.registry import Registry
from transports.stream import client_ssl_context

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


# --- endpoints ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tls:
    """Client TLS settings that travel to executors (an ``SSLContext`` cannot be pickled).

    Paths are read on the executors, so they must exist there. ``verify=False`` turns
    certificate and hostname checks off (tests only).
    """

    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: bool = True
    server_hostname: str | None = None

    def context(self) -> ssl.SSLContext:
        return client_ssl_context(
            cafile=self.cafile, certfile=self.certfile, keyfile=self.keyfile, verify=self.verify
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What a pooled connection is keyed by: the URL and how to connect to it."""

    url: str
    tls: Tls | None = None
    connect_timeout: float = 10.0
    protocol_options: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments for the protocol peer (``ping_interval``, ``heartbeat_interval``)."""


# --- the worker loop ---------------------------------------------------------------------


class Runtime:
    """A process's event loop thread and connection pool."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = loops.new_event_loop()
        self.pool = ConnectionPool(self.loop)
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


# --- connection pool ---------------------------------------------------------------------


class ConnectionPool:
    """One open connection per endpoint, reconnected on demand. Used on its loop only.

    A failed connection attempt is remembered for ``failure_ttl`` seconds, so that the rows
    of a batch aimed at a peer that is down fail fast instead of each waiting for its own
    attempt; a retry asks for a ``fresh`` attempt.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, *, failure_ttl: float = 0.1) -> None:
        self._loop = loop
        self.failure_ttl = failure_ttl
        self._peers: dict[Endpoint, Peer] = {}
        self._connecting: dict[Endpoint, asyncio.Task[Peer]] = {}
        self._failed: dict[Endpoint, tuple[float, ConnectionClosed]] = {}
        self.connects = 0
        """Connections opened so far (a statistic for tests and logs)."""

    def ready(self, endpoint: Endpoint) -> Peer | None:
        """The open connection to ``endpoint``, if there is one (no waiting)."""
        peer = self._peers.get(endpoint)
        return peer if peer is not None and peer.is_open else None

    async def get(self, endpoint: Endpoint, *, fresh: bool = False) -> Peer:
        """The open connection to ``endpoint``, connecting (once for all callers) if needed.
        Raises ConnectionClosed when the peer cannot be reached; unless ``fresh``, a
        failure of the last ``failure_ttl`` seconds is raised again without a new attempt."""
        peer = self._peers.get(endpoint)
        if peer is not None and peer.is_open:
            return peer
        failed = self._failed.pop(endpoint, None)
        if failed is not None and not fresh and self._loop.time() - failed[0] < self.failure_ttl:
            self._failed[endpoint] = failed
            raise ConnectionClosed(str(failed[1]))
        task = self._connecting.get(endpoint)
        if task is None:
            if peer is not None:
                log.info("connection to %s is gone; reconnecting", endpoint.url)
                del self._peers[endpoint]
            task = self._loop.create_task(self._connect(endpoint))
            self._connecting[endpoint] = task
            task.add_done_callback(lambda t: self._connected(endpoint, t))
        # shield: a cancelled caller must not cancel the attempt the others wait for
        return await asyncio.shield(task)

    async def _connect(self, endpoint: Endpoint) -> Peer:
        tls = endpoint.tls
        try:
            return await connect(
                endpoint.url,
                registry=Registry(),  # the remote side may not call anything on executors
                options=Options(retries=0),  # retry results are the caller's to honour
                ssl=tls.context() if tls is not None else None,
                server_hostname=tls.server_hostname if tls is not None else None,
                connect_timeout=endpoint.connect_timeout,
                **dict(endpoint.protocol_options),
            )
        except ConnectionClosed:
            raise
        except (OSError, EOFError) as exc:  # refused, unreachable, TLS handshake failures
            raise ConnectionClosed(f"cannot connect to {endpoint.url}: {exc}") from None

    def _connected(self, endpoint: Endpoint, task: asyncio.Task[Peer]) -> None:
        self._connecting.pop(endpoint, None)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here even if every waiter was cancelled
        if exc is None:
            self._peers[endpoint] = task.result()
            self.connects += 1
        elif isinstance(exc, ConnectionClosed):
            self._failed[endpoint] = (self._loop.time(), exc)

    async def close(self) -> None:
        peers = list(self._peers.values())
        self._peers.clear()
        for task in self._connecting.values():
            task.cancel()
        await asyncio.gather(*(p.close(drain_timeout=1.0) for p in peers), return_exceptions=True)


# --- calls -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallPolicy:
    """How one remote operation is called from executors."""

    op: str
    timeout: float | None = None
    """Seconds each attempt waits for its result; None = the protocol's default."""
    idempotent: bool = False
    """Only idempotent calls are retried (after a retry result or a transport failure)."""
    retries: int = 3
    backoff: float = 0.2
    """First wait before a retry; doubled each time (with jitter), at most ``max_backoff``;
    a retry result's own wait is honoured when longer."""
    max_backoff: float = 5.0


def make_caller(
    pool: ConnectionPool, endpoint: Endpoint, policy: CallPolicy
) -> Callable[[Any], Awaitable[Outcome]]:
    """The per-row coroutine function: one remote call, retried as ``policy`` allows.

    Remote errors, timeouts and payload errors are never retried: the peer may have done
    the work. Retry results and lost connections are retried only for idempotent ops.
    """

    async def call(value: Any) -> Outcome:
        attempt = 0
        while True:
            try:
                peer = pool.ready(endpoint) or await pool.get(endpoint, fresh=attempt > 0)
                return await peer.request(policy.op, value, timeout=policy.timeout), None
            except (RetryLater, ConnectionClosed) as exc:
                if not policy.idempotent or attempt >= policy.retries:
                    return None, describe(exc)
                wait = min(policy.max_backoff, policy.backoff * 2**attempt)
                wait *= 0.5 + random.random() / 2
                if isinstance(exc, RetryLater):
                    wait = max(wait, exc.wait)
                attempt += 1
                await asyncio.sleep(wait)
            except (RpcError, PayloadError) as exc:
                return None, describe(exc)

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
        self, runtime: Runtime, fn: Callable[[Any], Awaitable[Outcome]], window: int = 128
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.runtime = runtime
        self.fn = fn
        self.window = window
        self._batches: deque[_Batch] = deque()  # batches with rows not taken yet
        self._unfinished: set[_Batch] = set()
        self._workers: set[asyncio.Task[None]] = set()
        self._idle = 0
        self._wakeup: asyncio.Event | None = None
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
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        self._wakeup.set()
        queued = sum(len(b.values) - b.next for b in self._batches)
        wanted = min(self.window, len(self._workers) - self._idle + queued)
        while len(self._workers) < wanted:
            task = self.runtime.loop.create_task(self._work())
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    def _close(self) -> None:
        self._closed = True
        for task in list(self._workers):
            task.cancel()
        for batch in self._unfinished:
            batch.future.cancel()
        self._batches.clear()
        self._unfinished.clear()

    async def _work(self) -> None:
        assert self._wakeup is not None
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
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug in fn: the row says so, the batch goes on
                log.exception("peerwire-spark call failed unexpectedly")
                result, error = None, describe(exc)
            batch.results[i] = result
            batch.errors[i] = error
            batch.left -= 1
            if batch.left == 0:
                self._unfinished.discard(batch)
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    batch.future.set_result((batch.results, batch.errors))
