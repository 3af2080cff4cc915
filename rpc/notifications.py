"""Running a notification handler on its decoded value: the one dispatch shared by a peer
connection (:meth:`rpc.peer.Peer.on_notification`) and a group node
(:class:`rpc.group.dispatch.Dispatcher`).

Nothing is answered, so nothing is raised: a handler's failure is logged with its
traceback, at most 20 per 10 s (a peer can send what makes a handler fail). A coroutine
handler runs as a task of the caller's :class:`~rpc.tasks.TaskSet`; with ``max_tasks``, a
notification that arrives while that many run is not dispatched: a warning through the
same rate-limited log (a group member can send such notifications by the thousand).

A handler's BaseException that is not an Exception stops the notification, not the
connection: see :mod:`rpc.escapes`.

One exception is raised: :class:`~rpc.stream_hold.InputHeld`, which a handler raises before
it acts on the notification to say it must wait (the Eventer client, past its deliveries'
bytes). A peer connection then keeps it and the rest of its read, reading paused, until
one of its tasks ends (:class:`~rpc.responder.NotificationsHeld`); the handler keeps a task
running until it can take more. A group node's handlers have no such use for it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable
from typing import Any

from rpc.escapes import PASSED_ON, report
from rpc.registry import Handler
from rpc.stream_hold import InputHeld
from rpc.tasks import TaskSet
from transports.logs import RateLimitedLog

__all__ = ["run_notification"]

log = logging.getLogger("peerwire.rpc")
failures = RateLimitedLog(log)
"""Where notification handlers' failures, and notifications not run, are logged."""


def run_notification(
    handler: Handler, value: Any, tasks: TaskSet, *, max_tasks: int | None = None
) -> bool:
    """Call ``handler.fn(value)`` (in the caller's context, e.g. with ``current_peer``
    set); False only if its coroutine was not run for ``max_tasks`` (a handler that
    failed did run: its failure is logged). InputHeld from the handler is raised."""
    try:
        result = handler.fn(value)
    except InputHeld:  # nothing done: the caller holds the notification (module doc)
        raise
    except Exception:
        failures.exception("notification handler %r failed", handler.name)
        return True
    except BaseException as exc:
        report(
            exc,
            "notification handler %r raised %s, not an Exception",
            handler.name,
            type(exc).__name__,
            loop=asyncio.get_running_loop(),  # KeyboardInterrupt: then on to the loop's run
        )
        return True
    if not inspect.isawaitable(result):
        return True
    if max_tasks is not None and len(tasks) >= max_tasks:
        failures.warning(
            "handler %r not run: %d handlers already running", handler.name, len(tasks)
        )
        if inspect.iscoroutine(result):
            result.close()
        return False
    tasks.spawn(_run(handler.name, result))
    return True


async def _run(name: str, awaitable: Awaitable[Any]) -> None:
    try:
        await awaitable
    except Exception:
        failures.exception("notification handler %r failed", name)
    except (asyncio.CancelledError, GeneratorExit):
        raise  # the task cancelled, or its coroutine closed unfinished
    except BaseException as exc:
        report(exc, "notification handler %r raised %s, not an Exception", name, type(exc).__name__)
        if isinstance(exc, PASSED_ON):
            raise  # the task passes it on to the loop's run
