"""Request handlers run by a few worker tasks instead of a task each.

Why: on Python 3.11 a task per handler costs more than most handlers do (building the
task, a loop callback for its first step, its removal from the owner's set), and most
coroutine handlers finish without waiting. :class:`HandlerRunner` queues one job per
request (a coroutine that runs the handler, or the middleware chain, and sends the reply)
and a worker task runs the queue, one job after another in one step of the loop.

A job that waits keeps its worker for the rest of its run, as a task of its own would:
inside it ``asyncio.current_task()`` stays the same, and ``asyncio.timeout``,
``asyncio.TaskGroup`` and cancellation behave as in a task of its own. The queue never
waits behind it: when a worker is about to wait while jobs are queued and no other worker
is on its way, a new worker starts. Each job runs in its own copy of the context it was
queued in (:func:`contextvars.copy_context`), so a context variable one sets is never seen
by another. A handler must not cancel ``asyncio.current_task()`` itself (its worker); the
peer's cancellation goes through :meth:`HandlerRunner.cancel`.

Bounds: one worker per job that is waiting plus at most one per queued job on its way
(see :meth:`HandlerRunner.cover`); the queue holds
what the owner admits (the peer's ``max_concurrent`` counts :attr:`HandlerRunner.jobs`).
Freed by :meth:`HandlerRunner.close`: the workers are cancelled and the queued coroutines
closed unrun.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeAlias

from rpc.key import K
from rpc.tasks import TaskSet

log = logging.getLogger("peerwire.rpc")

Job: TypeAlias = tuple[
    K, Coroutine[Any, Any, Any], contextvars.Context, Coroutine[Any, Any, Any] | None
]
"""A queued job: its request's key, its coroutine, its context, and the coroutine it awaits
first if the job's owner made that one already (the handler's), closed with an unrun job."""


class _Resumed:
    """The rest of a job that waited, as its worker awaits it: each of the job's steps runs
    in the job's own context, and before it waits again its runner makes sure the queue
    goes on. (A job's first step runs in :meth:`HandlerRunner._work` itself.)"""

    __slots__ = ("_context", "_coro", "_first", "_runner")

    def __init__(
        self,
        runner: HandlerRunner[Any],
        coro: Coroutine[Any, Any, Any],
        context: contextvars.Context,
        first: Any,
    ) -> None:
        self._runner = runner
        self._coro = coro
        self._context = context
        self._first = first
        """What the job's first step yielded (the future it waits for), for the task."""

    def __await__(self) -> Generator[Any, Any, None]:
        coro = self._coro
        run = self._context.run
        yielded, self._first = self._first, None
        while True:
            try:
                sent = yield yielded  # to the worker's task, which waits for it
            except BaseException as exc:  # cancellation (or close) thrown into the task
                try:
                    yielded = run(coro.throw, exc)
                except StopIteration:
                    return
            else:
                try:
                    yielded = run(coro.send, sent)
                except StopIteration:
                    return
            self._runner.cover()


class HandlerRunner(Generic[K]):
    """Runs one connection's jobs (see the module doc): each a coroutine that serves one
    request, its handler and its reply. ``on_done`` runs after each job (e.g. to admit
    more)."""

    __slots__ = (
        "_cancelled",
        "_closed",
        "_dropped",
        "_on_done",
        "_queue",
        "_starting",
        "_waiting_jobs",
        "_workers",
        "jobs",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self._on_done = on_done
        self._workers = TaskSet(loop)
        self._queue: deque[Job[K]] = deque()
        self._starting = 0
        """Workers made that have not taken their first job yet: each will take one at least."""
        self._waiting_jobs: dict[K, asyncio.Task[Any]] = {}
        """Jobs that have waited at least once, by key: the worker each one holds."""
        self._dropped: set[K] = set()
        """Queued jobs cancelled before they started: skipped, their coroutines closed."""
        self._cancelled: set[K] = set()
        """Waiting jobs whose worker :meth:`cancel` cancelled for them, until they end."""
        self._closed = False
        self.jobs = 0
        """Jobs queued or running."""

    def submit(
        self,
        key: K,
        coro: Coroutine[Any, Any, Any],
        inner: Coroutine[Any, Any, Any] | None = None,
    ) -> None:
        """Queue the job ``coro`` for request ``key``, to run in a copy of the current
        context. The job handles its own errors; a CancelledError ends it alone after
        :meth:`cancel`. ``inner``: a coroutine the job awaits, made before it (the
        handler's): closed too if the job is dropped unrun, so that it is not reported as
        never awaited."""
        self._queue.append((key, coro, contextvars.copy_context(), inner))
        self.jobs += 1
        if not self._starting:
            self._start_worker()

    def cancel(self, key: K) -> None:
        """Cancel job ``key``: a running one gets CancelledError where it waits (its worker
        goes on with the queue afterwards); a queued one is dropped unrun."""
        worker = self._waiting_jobs.get(key)
        if worker is not None:
            if key not in self._cancelled:
                self._cancelled.add(key)
                worker.cancel()
        elif any(job[0] == key for job in self._queue):
            self._dropped.add(key)

    def cover(self) -> None:
        """Called before a worker waits: start a worker for each queued job that none on its
        way will take. A job that waits suggests that those queued behind it (often for the
        same handler) will wait too: they all start in the next turn of the loop, not one
        turn after another; if they do not wait, the first new worker runs them all and the
        others find nothing to do (a task each, as without the runner)."""
        missing = len(self._queue) - self._starting
        if missing > 0 and not self._closed:
            for _ in range(missing):
                self._start_worker()

    def workers(self) -> list[asyncio.Task[Any]]:
        """The worker tasks now (to wait for on a graceful close)."""
        return list(self._workers)

    def close(self) -> None:
        """Cancel the workers (and the jobs they hold); close the queued coroutines unrun."""
        self._closed = True
        queue = self._queue
        while queue:
            _drop(queue.popleft())
        self.jobs = len(self._waiting_jobs)
        self._dropped.clear()
        self._cancelled.clear()
        self._workers.cancel_all()

    def _waiting(self, key: K) -> None:
        """Job ``key`` waits for the first time: it keeps this worker; the queue goes on."""
        task = asyncio.current_task()
        if task is not None:
            self._waiting_jobs[key] = task
        self.cover()

    def _start_worker(self) -> None:
        self._starting += 1
        self._workers.start_leaving(self._work())

    async def _work(self) -> None:
        self._starting -= 1
        queue = self._queue
        on_done = self._on_done
        waiting = self._waiting_jobs
        dropped = self._dropped
        cancelled = self._cancelled
        try:
            while queue and not self._closed:
                job = queue.popleft()
                key, coro, context, _ = job
                if dropped and key in dropped:
                    dropped.discard(key)
                    _drop(job)
                    self.jobs -= 1
                    continue
                try:
                    try:
                        first = context.run(coro.send, None)
                    except StopIteration:
                        pass  # done without waiting: the common case, no more to it
                    else:  # it waits: it keeps this worker, and the queue goes on
                        self._waiting(key)
                        await _Resumed(self, coro, context, first)
                except asyncio.CancelledError:
                    if key not in cancelled:
                        raise  # the worker itself (closing, or its loop shutting down)
                    # the job alone was cancelled (see cancel): the worker goes on
                except Exception:  # jobs answer their own errors: this is a bug of ours
                    log.exception("the job of request %r failed", key)
                finally:
                    if waiting:
                        worker = waiting.pop(key, None)
                        if worker is not None and key in cancelled:
                            cancelled.discard(key)
                            worker.uncancel()  # that cancellation ended with the job
                    self.jobs -= 1
                    if on_done is not None:
                        on_done()
        finally:
            if queue:  # left early (cancelled): the queue goes on
                self.cover()
            self._workers.leave(asyncio.current_task())


def _drop(job: Job[K]) -> None:
    """Close an unrun job's coroutines (never started: nothing of theirs runs)."""
    job[1].close()
    if job[3] is not None:
        job[3].close()
