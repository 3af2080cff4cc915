"""Registrations become sessions: ids and one timestamp assigned on arrival, events spliced.

A session holds its events' SBS bytes (``HatEventer.Event``, built from the request's own
field bytes by :mod:`rpc.eventer.splice`), their store rows and types, and the future of a
registrant waiting for the commit. The :class:`TypeCatalog` numbers event types for the
store; new types are written with the first batch that uses them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rpc.eventer.codec import check_json_text
from rpc.eventer.splice import RegisterPart
from rpc.eventer.store import Row
from rpc.eventer.values import EventType, InvalidMessage, now
from wire.sbs import encode_integer

SessionFuture = asyncio.Future[list[bytes] | None]
"""Resolved after the commit: the session's events' bytes, or None if the commit failed."""


class Session:
    """One registration: its events' SBS bytes, store rows and types, and who waits."""

    __slots__ = ("blobs", "future", "id", "rows", "size", "types")

    def __init__(self, session_id: int, future: SessionFuture | None) -> None:
        self.id = session_id
        self.size = 0
        """Bytes of its events (the blobs), as the writer's ``pending_bytes`` counts them."""
        self.blobs: list[bytes] = []
        self.rows: list[Row] = []
        self.types: list[EventType] = []
        self.future = future
        """None when nobody waits (a registration sent as a notification)."""

    def resolve(self, blobs: list[bytes] | None) -> None:
        """Answer the registrant, if one waits (``None``: the commit failed)."""
        if self.future is not None and not self.future.done():
            self.future.set_result(blobs)


class TypeCatalog:
    """Event type <-> id, in the order types were first registered."""

    __slots__ = ("_unsaved", "ids", "items")

    def __init__(self, types: Sequence[tuple[int, EventType]]) -> None:
        self.items: list[tuple[int, EventType]] = list(types)
        """(id, type) in id order; grows only."""
        self.ids: dict[EventType, int] = {t: i for i, t in types}
        self._unsaved: dict[int, EventType] = {}

    def id_of(self, event_type: EventType) -> int:
        """The type's id, numbering it (and keeping it to save) if it is new."""
        type_id = self.ids.get(event_type)
        if type_id is None:
            type_id = self.items[-1][0] + 1 if self.items else 1
            self.ids[event_type] = type_id
            self.items.append((type_id, event_type))
            self._unsaved[type_id] = event_type
        return type_id

    def unsaved(self) -> list[tuple[int, EventType]]:
        """Types numbered since the last :meth:`saved`, to write with the next batch."""
        return list(self._unsaved.items())

    def saved(self, types: list[tuple[int, EventType]]) -> None:
        for type_id, _ in types:
            self._unsaved.pop(type_id, None)


class Registrar:
    """Assigns session ids and timestamps (never backwards: the natural order) and builds
    each session's event bytes and rows."""

    def __init__(
        self,
        server_id: int,
        catalog: TypeCatalog,
        *,
        last_session: int,
        last_ts: int,
        max_event_bytes: int,
        max_message_size: int,
    ) -> None:
        self.server_id = server_id
        self.last_session = last_session
        """Id of the last session with events (empty registrations take no id)."""
        self._catalog = catalog
        self._last_ts = last_ts
        self._max_event_bytes = max_event_bytes
        self._max_message_size = max_message_size

    def session(self, parts: list[RegisterPart], future: SessionFuture | None) -> Session:
        """The session of one request's events. Raises InvalidMessage for a JSON payload
        that is not JSON or events that would not fit in one message; nothing is
        registered then."""
        for part in parts:
            if part.json is not None:
                check_json_text(part.json)
        session = Session(self.last_session + 1, future)
        if not parts:
            session.resolve([])
            return session
        ts = max(now().to_us(), self._last_ts)  # never backwards: natural order
        s, us = divmod(ts, 1_000_000)
        ts_bytes = encode_integer(s) + encode_integer(us)
        server = self.server_id
        sid = session.id
        id_prefix = encode_integer(server) + encode_integer(sid)
        size = sum(len(p.type_bytes) + len(p.tail_bytes) for p in parts) + len(parts) * (
            len(id_prefix) + len(ts_bytes) + len(encode_integer(len(parts)))
        )
        if size > self._max_event_bytes:
            raise InvalidMessage(
                f"registration of {size} bytes of events exceeds max_message_size "
                f"{self._max_message_size}"
            )
        ids = self._catalog.ids
        blobs, rows, types = session.blobs, session.rows, session.types
        for instance, part in enumerate(parts, 1):
            event_type = part.type
            type_id = ids.get(event_type)
            if type_id is None:
                type_id = self._catalog.id_of(event_type)
            # Event = id, type, timestamp, sourceTimestamp, payload
            blob = (
                id_prefix + encode_integer(instance) + part.type_bytes + ts_bytes + part.tail_bytes
            )
            blobs.append(blob)
            rows.append((server, sid, instance, type_id, ts, part.source_key, blob))
            types.append(event_type)
        session.size = size
        self.last_session = sid
        self._last_ts = ts
        return session
