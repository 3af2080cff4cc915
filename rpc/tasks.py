"""A set of tasks owned by one object: counted, cancelled together, awaited on close.

Used by every peer (notification handlers, ``on_open``, and the workers of its
:class:`~rpc.handler_runner.HandlerRunner`), the Eventer server and the group node, so that
no task outlives its owner and none is garbage-collected while running.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

log = logging.getLogger("peerwire.rpc")


def being_cancelled(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Whether the running task itself was cancelled (True outside a task), not merely
    handed a CancelledError by something it awaited (a future another task cancelled):
    only the first ends a handler's worker; the second is the handler's own error."""
    task = asyncio.current_task(loop)
    return task is None or task.cancelling() > 0


class TaskSet:
    """Owns tasks until they finish. ``on_done`` runs after each one (e.g. to admit more)."""

    __slots__ = ("_direct", "_loop", "_on_done", "_tasks")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self._loop = loop
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_done = on_done
        self._direct = loop.get_task_factory() is None
        """No task factory when the set was made: :meth:`start_leaving` builds
        ``asyncio.Task`` itself, as ``loop.create_task`` would, without that method's
        Python-level steps (about 1 us a task on 3.11's loop)."""

    def spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        *,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of this set (in ``context`` when given)."""
        task = self._loop.create_task(coro, context=context)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def start_leaving(
        self, coro: Coroutine[Any, Any, Any], *, context: contextvars.Context | None = None
    ) -> asyncio.Task[Any]:
        """Like :meth:`spawn`, for a coroutine whose last act is :meth:`leave` (in a
        ``finally``) and which lets no exception but cancellation escape: the task needs no
        done callback, a loop callback per task saved (the handler runner's workers). Never
        started eagerly, on any Python version. A task cancelled before it ever ran is
        dropped by :meth:`cancel` instead."""
        if self._direct:
            task = asyncio.Task(coro, loop=self._loop, context=context)
        else:
            task = self._loop.create_task(coro, context=context)
        self._tasks.add(task)
        return task

    def leave(self, task: asyncio.Task[Any] | None) -> None:
        """``task``, the current one (started with :meth:`start_leaving`), is done: drop
        it. The caller passes it (``asyncio.current_task()``), having needed it too."""
        if task is not None:
            self._drop(task)

    def cancel(self, task: asyncio.Task[Any]) -> None:
        """Cancel one task of this set; it leaves the set once done, even if it never ran."""
        task.cancel()
        task.add_done_callback(self._drop)

    def _drop(self, task: asyncio.Task[Any]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)
            if self._on_done is not None:
                self._on_done()

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(tuple(self._tasks))

    def __contains__(self, task: object) -> bool:
        return task in self._tasks

    def cancel_all(self) -> None:
        for task in tuple(self._tasks):
            self.cancel(task)

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait for every task (up to ``timeout`` s); True if none is left."""
        if self._tasks:
            await asyncio.wait(tuple(self._tasks), timeout=timeout)
        return not self._tasks

    def _done(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled():
            exc = task.exception()
            if exc is not None:
                log.error("task %s failed", task.get_name(), exc_info=exc)
        self._drop(task)
