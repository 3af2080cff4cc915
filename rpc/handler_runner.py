"""Request handlers run by a few worker tasks instead of a task each.

Why: on Python 3.11 a task per handler costs more than most handlers do (building the
task, a loop callback for its first step, its removal from the owner's set), and most
coroutine handlers finish without waiting. :class:`HandlerRunner` queues one job per
request (a coroutine that runs the handler, or the middleware chain, and sends the reply)
and a worker task runs the queue, one job after another in one step of the loop. The same
on every Python version (workers never start eagerly).

A job that waits keeps its worker for the rest of its run, as a task of its own would:
inside it ``asyncio.current_task()`` stays the same, and ``asyncio.timeout``,
``asyncio.TaskGroup`` and cancellation behave as in a task of its own. The queue never
waits behind it: before a worker waits while jobs are queued, a worker starts for each
queued job that none on its way will take. Each job runs in its own copy of the context it
was queued in (:func:`contextvars.copy_context`), so a context variable one sets is never
seen by another; a worker is made in the context of the job it was made for.

What a handler can tell: jobs that do not wait share their worker, so
``asyncio.current_task()`` is the same task for several requests (a done callback added to
it runs when the worker ends, not when the request does). A handler must not cancel that
task itself; the peer's cancellation of one request goes through
:meth:`HandlerRunner.cancel`.

A job answers its own errors (every Exception). One that ends in a BaseException that is
not an Exception (a handler's or middleware's ``class Stop(BaseException)``), other than
CancelledError (see :meth:`HandlerRunner.cancel`) and GeneratorExit (its coroutine closed),
is answered here: the peer whose request it served (:data:`rpc.current_peer` in the job's
context) gives its caller an error result at once and logs it
(:meth:`rpc.handler_results.HandlerResults.escaped`), and the worker goes on with the queue.
KeyboardInterrupt and SystemExit (:data:`rpc.escapes.PASSED_ON`) are answered so too,
then passed on as asyncio passes them on: they end the worker and leave the loop's run;
the queue goes on in another worker should the loop run again.

Bounds: one worker per job that is waiting plus at most one per queued job on its way
(see :meth:`HandlerRunner.cover`); the queue holds what the owner admits (the peer's
``max_concurrent`` counts :attr:`HandlerRunner.jobs`). Freed by :meth:`HandlerRunner.close`:
the workers are cancelled and the queued coroutines closed unrun.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Callable, Collection, Coroutine, Generator
from typing import Any, Generic, TypeAlias

from rpc import responder  # a module in the making when this one is first imported
from rpc.escapes import PASSED_ON, report
from rpc.key import K
from rpc.request_bytes import RequestBytes
from rpc.streaming import StreamQueue
from rpc.tasks import TaskSet

log = logging.getLogger("peerwire.rpc")

Job: TypeAlias = tuple[
    K,
    Coroutine[Any, Any, Any],
    contextvars.Context,
    Coroutine[Any, Any, Any] | None,
    int,
    int,
    StreamQueue | None,
]
"""A queued job: its request's key, its coroutine, its context, the coroutine it awaits
first if the job's owner made that one already (the handler's, closed with an unrun job),
its number (jobs are numbered as submitted, from 1), the bytes of its request's payload
(counted in the owner's :class:`~rpc.request_bytes.RequestBytes` until the job ends) and a
stream request's parts queue (whose bytes left unread stop counting when the job ends)."""


class _Resumed:
    """The rest of a job whose first step waited, as its worker awaits it: each further
    step runs in the job's context (``run``; None when that is the worker's own), and
    before the job waits again its runner makes sure the queue goes on."""

    __slots__ = ("_coro", "_first", "_run", "_runner")

    def __init__(
        self,
        runner: HandlerRunner[Any],
        coro: Coroutine[Any, Any, Any],
        run: Callable[..., Any] | None,
        first: Any,
    ) -> None:
        self._runner = runner
        self._coro = coro
        self._run = run
        self._first = first
        """What the job's first step yielded (the future it waits for), for the task."""

    def __await__(self) -> Generator[Any, Any, None]:
        coro, run, runner = self._coro, self._run, self._runner
        yielded, self._first = self._first, None
        while True:
            thrown: BaseException | None = None
            try:
                sent = yield yielded  # to the worker's task, which waits for it
            except BaseException as exc:  # cancellation (or close) thrown into the task
                thrown = exc  # thrown in below, outside this handler (no __context__)
            try:
                if thrown is not None:
                    yielded = coro.throw(thrown) if run is None else run(coro.throw, thrown)
                else:
                    yielded = coro.send(sent) if run is None else run(coro.send, sent)
            except StopIteration:
                return
            finally:
                thrown = None
            if runner._queue:
                runner.cover()


class HandlerRunner(Generic[K]):
    """Runs one connection's jobs (see the module doc): each a coroutine that serves one
    request, its handler and its reply, and handles its own errors. ``on_done`` runs after
    each job, run or dropped (e.g. to admit more)."""

    __slots__ = (
        "_cancelled",
        "_closed",
        "_drain_left",
        "_drain_upto",
        "_drained",
        "_held",
        "_loop",
        "_on_done",
        "_queue",
        "_starting",
        "_submitted",
        "_waiting_jobs",
        "_workers",
        "jobs",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_done: Callable[[], None] | None = None,
        held: RequestBytes | None = None,
    ) -> None:
        self._on_done = on_done
        self._held = held
        self._loop = loop
        self._workers: TaskSet | None = None
        self._queue: deque[Job[K]] | None = None
        """Made with the workers' set at the first job: a connection that never serves a
        coroutine handler holds neither (about 0.9 KiB)."""
        self._starting = 0
        """Workers made that have not taken their first job yet: each will take one."""
        self._waiting_jobs: dict[K, asyncio.Task[Any]] = {}
        """Jobs that are running and may wait (or have), by key: the worker each one holds."""
        self._cancelled: dict[K, None] = {}
        """Running jobs whose worker :meth:`cancel` cancelled for them, until they end (a
        dict: empty, it is smaller than a set)."""
        self._closed = False
        self._submitted = 0
        self._drained: asyncio.Future[None] | None = None
        """Resolved once every job submitted up to ``_drain_upto`` has ended (see drain)."""
        self._drain_upto = 0
        self._drain_left = 0
        self.jobs = 0
        """Jobs queued or running."""

    def submit(
        self,
        key: K,
        coro: Coroutine[Any, Any, Any],
        inner: Coroutine[Any, Any, Any] | None = None,
        size: int = 0,
        parts: StreamQueue | None = None,
    ) -> None:
        """Queue the job ``coro`` for request ``key``, to run in a copy of the current
        context. ``inner``: a coroutine the job awaits, made before it (the handler's):
        closed too if the job is dropped unrun, so that it is not reported as never
        awaited. ``size``: the request's payload bytes, held (counted in the runner's
        ``held``) until the job ends, as the unread bytes of ``parts`` (a stream request's
        queue) are. After :meth:`close` the job is dropped at once."""
        self._submitted += 1
        job = (key, coro, contextvars.copy_context(), inner, self._submitted, size, parts)
        if self._closed:
            _drop(job)
            return
        if size and self._held is not None:
            self._held.used += size  # RequestBytes.take written out: once per request
        queue = self._queue
        if queue is None:
            queue = self._queue = deque()
            self._workers = TaskSet(self._loop)
        queue.append(job)
        self.jobs += 1
        if not self._starting:
            self._start_worker(job[2])

    def cancel(self, key: K) -> None:
        """Cancel job ``key``: a running one gets CancelledError where it waits (its worker
        goes on with the queue afterwards); a queued one is dropped unrun at once."""
        worker = self._waiting_jobs.get(key)
        if worker is not None:
            if key not in self._cancelled:
                self._cancelled[key] = None
                worker.cancel()
            return
        queue = self._queue
        if queue is None:
            return  # never a job: nothing to cancel
        for job in queue:
            if job[0] == key:
                queue.remove(job)
                _drop(job)
                self._done(job[4], job[5], job[6])
                return

    def drain(self, closing: Collection[asyncio.Task[Any]] = ()) -> asyncio.Future[None] | None:
        """A future that resolves once every job submitted so far has ended (None: there is
        none), for a graceful close: jobs submitted later are not waited for, nor those
        the tasks in ``closing`` run, if they are ours (handlers waiting for the close: it
        does not wait for them). Asked again before it resolved, the same future counts
        again. (Should such a job end after all, the drain may end one job early.)"""
        left = self.jobs
        workers = self._workers
        if workers is not None:
            left -= sum(1 for task in closing if task in workers)
        if left <= 0:
            if self._drained is not None and not self._drained.done():
                self._drained.set_result(None)  # an earlier close waits for no more
            return None
        if self._drained is None or self._drained.done():
            self._drained = self._loop.create_future()
        self._drain_upto = self._submitted
        self._drain_left = left
        return self._drained

    def cover(self) -> None:
        """Called before a worker waits: start a worker for each queued job that none on its
        way will take. A job that waits suggests that those queued behind it (often for the
        same handler) will wait too: they all start in the next turn of the loop, not one
        turn after another; if they do not wait, the first new worker runs them all and the
        others find nothing to do (a task each, as without the runner)."""
        queue = self._queue
        while queue and self._starting < len(queue) and not self._closed:
            self._start_worker(queue[self._starting][2])

    def workers(self) -> list[asyncio.Task[Any]]:
        """The worker tasks now (for tests and diagnostics)."""
        return list(self._workers or ())

    def close(self) -> None:
        """Cancel the workers (and the jobs they hold); close the queued coroutines unrun."""
        self._closed = True
        queue = self._queue
        while queue:
            job = queue.popleft()
            _drop(job)
            if job[5] and self._held is not None:
                self._held.release(job[5])
            if job[6] is not None:
                job[6].release_held()
        self.jobs = len(self._waiting_jobs)
        self._cancelled.clear()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)  # what is left is being cancelled
        if self._workers is not None:
            self._workers.cancel_all()

    def _done(self, number: int, size: int, parts: StreamQueue | None) -> None:
        """Job ``number``, holding ``size`` bytes (and ``parts``), ended or was dropped."""
        self.jobs -= 1
        if size and self._held is not None:
            self._held.release(size)
        if parts is not None:
            parts.release_held()
        if self._drained is not None and number <= self._drain_upto:
            self._drain_step()
        if self._on_done is not None:
            self._on_done()

    def _drain_step(self) -> None:
        """One of the jobs a :meth:`drain` waits for has ended."""
        self._drain_left -= 1
        if not self._drain_left and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _start_worker(self, context: contextvars.Context) -> None:
        """A worker in ``context``, the context of the job it will most likely take first."""
        queue, workers = self._queue, self._workers
        if queue is None or workers is None:
            raise RuntimeError("a worker started before the first job")  # submit makes both
        self._starting += 1
        workers.start_leaving(self._work(context, queue, workers), context=context)

    async def _work(self, own: contextvars.Context, queue: deque[Job[K]], workers: TaskSet) -> None:
        self._starting -= 1
        me = asyncio.current_task(self._loop)  # given the loop: no lookup of the running one
        if me is None:  # a coroutine run as a task always has one
            raise RuntimeError("a handler runner's worker must run as a task")
        waiting = self._waiting_jobs
        cancelled = self._cancelled
        try:
            while queue and not self._closed:
                key, coro, context, _, number, size, parts = queue.popleft()
                try:
                    if context is own and len(queue) <= self._starting:
                        # the job this worker was made for, and every job queued behind it
                        # has a worker on its way: awaited as in a task of its own
                        waiting[key] = me
                        await coro
                    else:
                        run = None if context is own else context.run
                        try:
                            first = coro.send(None) if run is None else run(coro.send, None)
                        except StopIteration:
                            pass  # done without waiting: the common case, no more to it
                        else:  # it waits: it keeps this worker, and the queue goes on
                            waiting[key] = me
                            if queue:
                                self.cover()
                            await _Resumed(self, coro, run, first)
                except asyncio.CancelledError:
                    if key not in cancelled or me.cancelling() > 1:
                        raise  # the worker itself (closing, or its loop shutting down)
                    # the job alone was cancelled (see cancel): the worker goes on
                except Exception:  # jobs answer their own errors: this is a bug of ours
                    log.exception("the job of request %r failed", key)
                except GeneratorExit:
                    raise  # the worker is closed (collected, or with its loop)
                except BaseException as exc:  # not an Exception: the job left it unanswered
                    _escaped(key, context, exc)
                    if isinstance(exc, PASSED_ON):
                        raise
                finally:
                    worker_cancelled = False
                    if waiting and waiting.get(key) is me:
                        del waiting[key]
                        if key in cancelled:
                            del cancelled[key]
                            # a cancellation of the worker's own came with the job's: it stands
                            worker_cancelled = me.uncancel() > 0
                    if size or parts is not None or self._drained is not None:
                        self._done(number, size, parts)
                    else:  # _done's common case written out: once per job
                        self.jobs -= 1
                        if self._on_done is not None:
                            self._on_done()
                    if worker_cancelled:
                        raise asyncio.CancelledError
        except GeneratorExit:
            raise  # collected unrun or closed with its loop: nothing more may start
        except BaseException:
            if queue:  # left early (cancelled): the queue goes on without it
                self.cover()
            raise
        finally:
            workers.leave(me)


def _drop(job: Job[K]) -> None:
    """Close an unrun job's coroutines (never started: nothing of theirs runs)."""
    job[1].close()
    if job[3] is not None:
        job[3].close()


def _escaped(key: Any, context: contextvars.Context, exc: BaseException) -> None:
    """Job ``key`` (run in ``context``) ended in ``exc``, a BaseException that is not an
    Exception: its peer answers it (logged there), or, for a runner of no peer's, it is
    logged here."""
    peer = context.get(responder.current_peer)
    if peer is None:
        report(exc, "the job of request %r ended in %s", key, type(exc).__name__)
        return
    try:
        peer.escaped(key, exc)
    except Exception:  # a bug of ours: the worker goes on all the same
        log.exception("request %r: its handler's %s could not be answered", key, exc)
