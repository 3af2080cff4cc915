"""Served calls bounded by their callers' deadlines, on the connection's one timer.

A request that came with its caller's deadline (request metadata) has its async handler
cancelled a grace period past it (:data:`rpc.intercept.DEADLINE_GRACE`). Each bound is an
entry here, not a loop timer of its own: the peer's :class:`~rpc.deadlines.Deadlines` slot
``"served"`` is armed for the nearest bound, and when it fires every handler past its bound
is cancelled and the slot re-armed for the nearest one left. A call that ends first only
drops its entry (the slot may then fire once early, find nothing due and re-arm), so a
bounded call costs a dict entry instead of a timer handle made and cancelled (measured with
``asyncio.timeout_at`` per call: about 6.5 us of a Gotalk server's CPU per call on 3.11).
A bound already passed when a call comes to it (read against the clock: the timer cannot
fire while a handler holds the loop) ends the call at once, its handler never started. A
streamed result's parts are each bounded by the same bound, one after another in one task,
each read against the clock as it starts: a generator that never waits, which leaves the
loop a turn to fire the timer only every :data:`rpc.streaming.PARTS_PER_TURN` (256) parts,
ends at its first part past its bound.
Entries are keyed by the task the handler runs in (a handler runner's worker, held by that
handler while it waits): at most one per waiting handler (``max_concurrent``), freed when
the handler leaves its bound or the connection goes.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Any, TypeVar

from rpc.deadlines import Deadlines

T = TypeVar("T")


class BoundPassed(Exception):
    """Raised by :meth:`CallBounds.within` when the bound, not anything else, ended the wait;
    its message is the error result the caller gets."""


class CallBounds:
    """The bounds of one connection's served calls (see the module doc)."""

    __slots__ = ("_deadlines", "_due", "_expired", "_loop", "_nearest")

    def __init__(self, deadlines: Deadlines, loop: asyncio.AbstractEventLoop) -> None:
        self._deadlines = deadlines
        self._loop = loop
        """The connection's loop: ``asyncio.current_task`` given it need not look up the
        running loop (a ``getpid`` system call on 3.11) per bounded call."""
        self._due: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        """Tasks cancelled by their bound that have not taken that cancellation back yet."""
        self._nearest = float("inf")
        """The time the ``served`` slot is set for (inf: not set); may be earlier than the
        nearest entry left, never later."""

    def __len__(self) -> int:
        return len(self._due)

    async def within(self, awaitable: Awaitable[T], when: float, op: str) -> T:
        """Await ``awaitable`` in the current task, cancelling it at loop time ``when``;
        then raise :class:`BoundPassed` naming ``op``. A cancellation from anywhere else
        goes through as it is, as with ``asyncio.timeout_at``. Past ``when`` already (one
        clock read per call, each part of a streamed result too: the timer cannot fire
        while a handler holds the loop, so an earlier read says nothing of this one), it
        raises at once, ``awaitable`` unawaited: a coroutine is closed unstarted, an asyncio
        Future (a Task a plain function started) cancelled; any other awaitable is left
        as it is."""
        if when <= self._loop.time():
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # the handler never starts
            elif isinstance(awaitable, asyncio.Future):
                awaitable.cancel()  # nor runs on, unawaited, once its caller is told
            raise BoundPassed(f"{op}: the caller's deadline passed")
        task = asyncio.current_task(self._loop)
        if task is None:
            raise RuntimeError("CallBounds.within needs a task")
        pending = task.cancelling()
        self._due[task] = when
        if when < self._nearest:
            self._nearest = when
            self._deadlines.set("served", when, self._expire)
        expired = False
        try:
            return await awaitable
        except asyncio.CancelledError:
            expired = self._release(task)
            if expired and task.uncancel() <= pending:
                raise BoundPassed(f"{op}: the caller's deadline passed") from None
            raise
        finally:
            if not expired and self._release(task):  # cancelled as it finished: it stands
                task.uncancel()

    def _release(self, task: asyncio.Task[Any]) -> bool:
        """Drop ``task``'s bound; True when the bound had passed and cancelled it."""
        if self._due.pop(task, None) is not None:
            return False
        if task in self._expired:
            self._expired.remove(task)
            return True
        return False

    def _expire(self) -> None:
        """The ``served`` slot fired: cancel every task past its bound; re-arm the slot."""
        now = self._deadlines.now()
        nearest = float("inf")
        due = self._due
        for task, when in tuple(due.items()):
            if when <= now:
                del due[task]
                if not task.done():
                    self._expired.add(task)
                    task.cancel()
            elif when < nearest:
                nearest = when
        self._nearest = nearest
        if due:
            self._deadlines.set("served", nearest, self._expire)

    def clear(self) -> None:
        """Forget every bound (the connection is gone; its tasks are being cancelled)."""
        self._due.clear()
        self._expired.clear()
        self._nearest = float("inf")
