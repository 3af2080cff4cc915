"""Dispatch: a received broadcast's value to the notification handler registered for its name.

The gossip names its payload type by tag (``xxh32(name)``); names come from
:class:`~rpc.group.payloads.PayloadTypes`, filled from the registry's notification handlers
when an unknown tag arrives and handlers were registered since they were last read (so a
peer sending unknown tags costs a lookup each). A value the handler cannot decode is
dropped with one rate-limited warning (:data:`rpc.logs.violations`). Coroutine handlers
run as tasks, at most ``max_handler_tasks`` (default 1024) at once; past it a notification
is not dispatched: counted in ``stats.not_run`` (``stats.dispatched`` counts those run),
with a rate-limited warning (:data:`rpc.notifications.failures`).
"""

from __future__ import annotations

import asyncio
import logging

from rpc.group.options import GroupStats
from rpc.group.payloads import PayloadTypes
from rpc.logs import violations
from rpc.notifications import run_notification
from rpc.payload import PayloadError
from rpc.registry import Registry
from rpc.tasks import TaskSet

__all__ = ["JOIN", "RESERVED_PREFIX", "Dispatcher"]

log = logging.getLogger("peerwire.group")

RESERVED_PREFIX = "peerwire.group."
"""Names under this prefix are the group's own messages, never dispatched to handlers."""

JOIN = RESERVED_PREFIX + "join"
"""Broadcast by a node at start (with peers), with its first broadcast (down its tree)
and with the next one after it added or learned a member, so the members it knows learn
of it, use it again and take its sequence numbers as new."""


class Dispatcher:
    """Runs handlers for received broadcasts; owns the tasks of coroutine handlers."""

    def __init__(
        self,
        registry: Registry,
        types: PayloadTypes,
        stats: GroupStats,
        max_tasks: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._registry = registry
        self._types = types
        self._stats = stats
        self._max_tasks = max_tasks
        self._tasks = TaskSet(loop)
        self._indexed = -1
        """The registry's notification count when its names were last indexed: an unknown
        tag (which any peer can send) indexes them again only if names came since."""

    @property
    def running(self) -> int:
        """Coroutine handlers running (at most ``max_handler_tasks``)."""
        return len(self._tasks)

    def dispatch(self, tag: int, data: bytes) -> None:
        """Decode ``data`` for the handler of ``tag`` and call it (once per broadcast)."""
        ptype = self._types.by_tag(tag)
        if ptype is None and self._registry.notification_count != self._indexed:
            self._index_handlers()
            ptype = self._types.by_tag(tag)
        if ptype is None:
            self._stats.unhandled += 1
            return
        if ptype.name.startswith(RESERVED_PREFIX):
            return
        handler = self._registry.get_notification(ptype.name)
        if handler is None:
            self._stats.unhandled += 1
            return
        try:
            value = handler.decode(data)
        except (PayloadError, UnicodeDecodeError) as exc:
            # UnicodeDecodeError: msgspec raises it for invalid UTF-8 in a str-typed value,
            # past rpc.payload's PayloadError conversion.
            violations.warning("group broadcast %r dropped: %s", handler.name, exc)
            self._stats.malformed += 1
            return
        if run_notification(handler, value, self._tasks, max_tasks=self._max_tasks):
            self._stats.dispatched += 1
        else:
            self._stats.not_run += 1

    async def close(self) -> None:
        """Cancel running handlers and wait for them."""
        self._tasks.cancel_all()
        await self._tasks.wait()

    def _index_handlers(self) -> None:
        self._indexed = self._registry.notification_count
        for name in self._registry.notification_names():
            try:
                self._types.register(name)
            except ValueError as exc:
                log.warning("notification %r cannot be received: %s", name, exc)
