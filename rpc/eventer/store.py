"""SQLite persistence of events (stdlib ``sqlite3``, WAL mode).

Layout (``PRAGMA user_version`` = :data:`~rpc.eventer.schema.SCHEMA_VERSION`; the tables and the
migration are in :mod:`rpc.eventer.schema`):

- ``events``: one row per event, a WITHOUT ROWID table keyed by the event id
  ``(server, session, instance)``, so the table itself is the natural-order index used by
  ``server`` queries and sentinel look-ups. ``data`` holds the event's SBS bytes
  (``HatEventer.Event``) exactly as sent, so a query result is a concatenation of stored
  bytes. ``ts`` is the server's timestamp in microseconds since the epoch; ``source_ts``
  is the source timestamp as 16 order-preserving bytes (:func:`~rpc.eventer.common.
  timestamp_key`), so any pair of int64 ``s``/``us`` is indexed without loss and in the
  reference's (s, us) order.
- indexes ``(ts)``, ``(type_id, ts)`` and, for events that have one, ``(source_ts)`` and
  ``(type_id, source_ts)``; every index of a WITHOUT ROWID table ends with the key, so
  ``ORDER BY ts, server, session, instance`` (the reference's timeseries order) is read
  straight off an index, and a ``LIMIT`` stops the walk early whatever the table size.
  A query for a few types merges one such walk per type.
- ``latest``: the latest event of each type, updated in the same transaction, so a latest
  query is a primary-key look-up per type.
- ``event_types``: type id <-> type (JSON array text).

Version 1 databases (integer, clamped ``source_ts``) are migrated on open: each key is
recomputed from the event's stored bytes, in the same transaction as the version change.

One server per file: an open store holds an exclusive ``flock`` on its database
(:func:`~rpc.eventer.dbfile.lock`) until :meth:`Store.close`, so a second one fails at
:meth:`Store.open` (``in use by another process``). Version 0 files with tables (another
application's) are refused untouched. Pages are not checked at open (the cost of
``PRAGMA quick_check`` grows with the file): what touches a damaged page fails.

Result sizes: every query method stops reading once its rows exceed ``max_bytes`` (a
timeseries or server result is cut there and reports more; a latest result raises
:class:`ResultTooLarge`), so a query never holds more than one message's worth of rows.

The ``-wal`` file is kept under ``max_wal_bytes`` (:mod:`rpc.eventer.wal`).

Threads: :meth:`open`, :meth:`write`, :meth:`truncate_wal` and :meth:`close` use the writer
connection, one call at a time (the server runs them on its writer thread, tiny writes
inline on its loop); :meth:`checkpoint` runs on another thread (it must not overlap
:meth:`close`); the query
methods run on any thread, each with its own connection (WAL readers see committed data
only, so nothing uncommitted is ever read). A ``:memory:`` store has a single connection;
its caller must run queries on the writer thread too (see :attr:`single_connection`).
"""

from __future__ import annotations

import heapq
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from rpc.eventer import dbfile, wal
from rpc.eventer.common import EventId, EventType
from rpc.eventer.schema import SCHEMA_VERSION, create_tables, migrate_source_keys

log = logging.getLogger("peerwire.eventer.store")

MERGE_MAX_TYPES = 32
"""Up to this many queried types, a timeseries query merges one index range per type
(fast for rare types in a large table); past it, one scan of the time index filters types."""

_INSERT_EVENT = "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)"
# the reference's natural order: same server -> by id (later rows always win, ids only
# grow), other server -> the later timestamp wins, a tie keeps the row already there
_UPSERT_LATEST = """
INSERT INTO latest (type_id, server, session, instance, ts) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (type_id) DO UPDATE SET
    server = excluded.server, session = excluded.session,
    instance = excluded.instance, ts = excluded.ts
WHERE latest.server = excluded.server OR latest.ts < excluded.ts
"""

Row = tuple[int, int, int, int, int, bytes | None, bytes]
"""(server, session, instance, type_id, ts, source_ts, data)"""
LatestRow = tuple[int, int, int, int, int]
"""(type_id, server, session, instance, ts)"""

_type_encoder = msgspec.json.Encoder()
_type_decoder = msgspec.json.Decoder(list[str])


class StoreError(Exception):
    """The database cannot be used (cannot be opened, wrong schema version, not an eventer
    database); the message names the path."""


class ResultTooLarge(Exception):
    """A result that cannot be cut holds more than ``max_bytes`` of events."""

    def __init__(self, what: str, max_bytes: int) -> None:
        super().__init__(f"{what} holds more than {max_bytes} bytes of events")
        self.max_bytes = max_bytes


def type_text(event_type: EventType) -> str:
    return _type_encoder.encode(event_type).decode()


@dataclass(slots=True)
class StoreState:
    """What the server needs from disk to carry on where it stopped."""

    types: list[tuple[int, EventType]]
    last_session: int
    last_ts: int | None


@dataclass(slots=True, frozen=True)
class TimeseriesQuery:
    by_source: bool
    descending: bool
    t_from: int | None
    t_to: int | None
    """Bounds on ``ts`` in microseconds."""
    source_t_from: bytes | None
    source_t_to: bytes | None
    """Bounds on ``source_ts`` as timestamp keys."""
    type_ids: list[int] | None
    """None: every type."""
    last_event_id: EventId | None
    limit: int
    max_bytes: int


class Store:
    def __init__(
        self, path: str | Path, *, sync: str = "full", max_wal_bytes: int = wal.MAX_WAL_BYTES
    ) -> None:
        self.path = str(path)
        self.sync = sync.upper()
        if self.sync not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"sync must be full, normal or extra, not {sync!r}")
        if "\0" in self.path:
            raise ValueError("the database path holds a NUL character")
        self.max_wal_bytes = max_wal_bytes
        """The size the ``-wal`` file is kept under (:mod:`rpc.eventer.wal`)."""
        self.single_connection = self.path == ":memory:"
        self._writer: sqlite3.Connection | None = None
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._checkpointer: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        """Holds the database's flock from :meth:`open` to :meth:`close` (not ``:memory:``)."""

    # --- writer thread -----------------------------------------------------------------

    def open(self, server_id: int) -> StoreState:
        """Open (or create) the database and lock it (``flock``, held until :meth:`close`;
        the kernel drops it when the process dies). Raises :class:`StoreError` naming the
        path and the reason when it cannot be opened, is in use by another process or is
        not an eventer database (left untouched)."""
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            reason = dbfile.open_failure(self.path, exc)
            raise StoreError(f"cannot open database {self.path}: {reason}") from exc
        try:
            if not self.single_connection:
                self._lock_fd = self._flock()
            state = self._prepare(conn, server_id)
        except BaseException as exc:
            conn.close()
            self._unlock()
            if isinstance(exc, sqlite3.DatabaseError):
                reason = dbfile.write_failure(self.path, exc)
                raise StoreError(f"cannot open database {self.path}: {reason}") from exc
            raise
        self._writer = conn
        return state

    def _prepare(self, conn: sqlite3.Connection, server_id: int) -> StoreState:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, 1, SCHEMA_VERSION):
            raise StoreError(
                f"cannot open database {self.path}: schema version {version}, "
                f"expected {SCHEMA_VERSION}"
            )
        if version == 0 and conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone():
            # another application's file (a new one has no tables): never write into it
            raise StoreError(
                f"cannot open database {self.path}: not an Eventer database "
                "(schema version 0 with tables of its own)"
            )
        if not self.single_connection:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(
                    f"cannot open database {self.path}: cannot switch to WAL mode ({mode})"
                )
            wal.configure(conn, self.max_wal_bytes)  # checkpoints: off the commit path
        conn.execute(f"PRAGMA synchronous={self.sync}")
        conn.execute("PRAGMA cache_size=-65536")
        conn.execute("PRAGMA temp_store=MEMORY")
        # one transaction: tables, indexes and the version appear together or not at all
        conn.execute("BEGIN IMMEDIATE")
        try:
            if version == 1:
                migrate_source_keys(conn)
            create_tables(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        types = [
            (type_id, tuple(_type_decoder.decode(text)))
            for type_id, text in conn.execute("SELECT id, type FROM event_types ORDER BY id")
        ]
        last = conn.execute(
            "SELECT session, ts FROM events WHERE server = ? "
            "ORDER BY session DESC, instance DESC LIMIT 1",
            (server_id,),
        ).fetchone()
        return StoreState(types, last[0] if last else 0, last[1] if last else None)

    def _flock(self) -> int:
        """One server per database: it hands out session and type ids from what it read
        at open, so a second one on the same file would hand out the same."""
        try:
            return dbfile.lock(self.path)
        except BlockingIOError:
            reason = "in use by another process"
        except OSError as exc:
            reason = f"cannot lock it ({exc.strerror})"
        raise StoreError(f"cannot open database {self.path}: {reason}")

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # drops the flock
            self._lock_fd = None

    def write(
        self, types: list[tuple[int, EventType]], rows: list[Row], latest: list[LatestRow]
    ) -> None:
        """Write one batch of sessions in one transaction; returns once it is committed."""
        conn = self._writer
        if conn is None:
            raise StoreError("store is closed")
        conn.execute("BEGIN IMMEDIATE")
        try:
            if types:
                conn.executemany(
                    "INSERT OR IGNORE INTO event_types (id, type) VALUES (?, ?)",
                    [(type_id, type_text(t)) for type_id, t in types],
                )
            conn.executemany(_INSERT_EVENT, rows)
            conn.executemany(_UPSERT_LATEST, latest)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def checkpoint(self) -> bool:
        """Copy committed WAL pages into the database (PASSIVE, on a thread of its own:
        blocks neither the writer nor readers); True when the whole log was copied."""
        if self.single_connection:
            return True
        conn = self._checkpointer
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA synchronous={self.sync}")
            self._checkpointer = conn
        return wal.checkpoint(conn)

    def truncate_wal(self) -> bool:
        """Empty the ``-wal`` file between commits (:func:`rpc.eventer.wal.truncate`);
        False when older readers did not end in time."""
        conn = self._writer
        if conn is None:
            raise StoreError("store is closed")
        return self.single_connection or wal.truncate(conn)

    def wal_size(self) -> int:
        """Bytes of the ``-wal`` file on disk."""
        return 0 if self.single_connection else wal.size(self.path)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        with self._lock:
            readers, self._readers = self._readers, []
        for reader in readers:
            reader.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._unlock()

    # --- readers -----------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        if self.single_connection:
            if self._writer is None:
                raise StoreError("store is closed")
            return self._writer
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only=ON")
            conn.execute("PRAGMA cache_size=-16384")
            conn.execute("PRAGMA mmap_size=268435456")
            self._local.conn = conn
            with self._lock:
                self._readers.append(conn)
        return conn

    def query_latest(self, type_ids: list[int] | None, max_bytes: int) -> list[bytes]:
        """Latest event of each type (``None``: of every type), in first-registered order;
        raises :class:`ResultTooLarge` past ``max_bytes``."""
        sql = (
            "SELECT e.data FROM latest l JOIN events e ON e.server = l.server "
            "AND e.session = l.session AND e.instance = l.instance"
        )
        conn = self._reader()
        if type_ids is None:
            rows = conn.execute(sql + " ORDER BY l.type_id")
        else:
            if not type_ids:
                return []
            rows = conn.execute(
                sql + " WHERE l.type_id IN (SELECT value FROM json_each(?)) ORDER BY l.type_id",
                (_type_encoder.encode(type_ids).decode(),),
            )
        try:
            blobs, more = _take((r[0] for r in rows), -1, max_bytes)
        finally:
            rows.close()  # a cut read must not keep its snapshot open
        if more:
            raise ResultTooLarge("the latest result", max_bytes)
        return blobs

    def query_server(
        self, server_id: int, last_event_id: EventId | None, limit: int, max_bytes: int
    ) -> tuple[list[bytes], bool]:
        """Events of ``server_id`` after ``last_event_id`` in natural order: at most
        ``limit`` of them and ``max_bytes`` of their bytes (ResultTooLarge if the first
        alone is larger)."""
        conn = self._reader()
        if last_event_id is None:
            rows = conn.execute(
                "SELECT data FROM events WHERE server = ? ORDER BY session, instance LIMIT ?",
                (server_id, _one_past(limit)),
            )
        else:
            rows = conn.execute(
                "SELECT data FROM events WHERE server = ? AND session >= ? "
                "AND (session > ? OR instance > ?) ORDER BY session, instance LIMIT ?",
                (
                    server_id,
                    last_event_id.session,
                    last_event_id.session,
                    last_event_id.instance,
                    _one_past(limit),
                ),
            )
        try:
            return _take((r[0] for r in rows), limit, max_bytes)
        finally:
            rows.close()

    def query_timeseries(self, q: TimeseriesQuery) -> tuple[list[bytes], bool]:
        """Events in [from, to] ordered by (timestamp or source timestamp, event id), cut
        at ``limit`` events or ``max_bytes`` (ResultTooLarge if the first alone is larger).

        ``last_event_id`` is the reference's sentinel: events up to and including it in
        this order are skipped; a sentinel that is not in the ordered range (unknown, or its
        ordering timestamp is missing or out of range) leaves nothing to return.
        """
        if q.type_ids is not None and not q.type_ids:
            return [], False
        col = "source_ts" if q.by_source else "ts"
        where: list[str] = []
        params: dict[str, Any] = {"limit": _one_past(q.limit)}
        if q.by_source:
            where.append("source_ts IS NOT NULL")
        for name, column, op in (
            ("t_from", "ts", ">="),
            ("t_to", "ts", "<="),
            ("source_t_from", "source_ts", ">="),
            ("source_t_to", "source_ts", "<="),
        ):
            value = getattr(q, name)
            if value is not None:
                where.append(f"{column} {op} :{name}")
                params[name] = value
        conn = self._reader()
        if q.last_event_id is not None:
            sentinel = conn.execute(
                f"SELECT {col} FROM events WHERE server = ? AND session = ? AND instance = ?",
                tuple(q.last_event_id),
            ).fetchone()
            lo = q.source_t_from if q.by_source else q.t_from
            hi = q.source_t_to if q.by_source else q.t_to
            if (
                sentinel is None
                or sentinel[0] is None
                or (lo is not None and sentinel[0] < lo)
                or (hi is not None and sentinel[0] > hi)
            ):
                return [], False
            cmp = "<" if q.descending else ">"
            where.append(
                f"{col} {cmp}= :sc AND ({col} {cmp} :sc OR "
                f"(server, session, instance) {cmp} (:ss, :se, :si))"
            )
            params.update(
                sc=sentinel[0],
                ss=q.last_event_id.server,
                se=q.last_event_id.session,
                si=q.last_event_id.instance,
            )
        direction = "DESC" if q.descending else "ASC"
        order = (
            f"ORDER BY {col} {direction}, server {direction}, "
            f"session {direction}, instance {direction} LIMIT :limit"
        )
        if q.type_ids is not None and len(q.type_ids) <= MERGE_MAX_TYPES:
            return self._merge_types(conn, q, q.type_ids, col, where, params, order)
        if q.type_ids is not None:
            # "+type_id": filter only, so the planner walks the time index in order
            where.append("+type_id IN (SELECT value FROM json_each(:types))")
            params["types"] = _type_encoder.encode(q.type_ids).decode()
        sql = "SELECT data FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        cursor = conn.execute(f"{sql} {order}", params)
        try:
            return _take((r[0] for r in cursor), q.limit, q.max_bytes)
        finally:
            cursor.close()

    @staticmethod
    def _merge_types(
        conn: sqlite3.Connection,
        q: TimeseriesQuery,
        type_ids: list[int],
        col: str,
        where: list[str],
        params: dict[str, Any],
        order: str,
    ) -> tuple[list[bytes], bool]:
        """One ordered index range per type, merged lazily: reads at most limit + 1 rows
        past the sentinel from each type, whatever the table size."""
        sql = (
            f"SELECT {col}, server, session, instance, data FROM events "
            f"WHERE {' AND '.join([*where, 'type_id = :type_id'])} {order}"
        )
        cursors: list[Iterator[Any]] = [
            conn.execute(sql, {**params, "type_id": type_id}) for type_id in type_ids
        ]
        merged = heapq.merge(*cursors, key=lambda r: r[:4], reverse=q.descending)
        try:
            return _take((r[4] for r in merged), q.limit, q.max_bytes)
        finally:
            for cursor in cursors:
                cursor.close()  # type: ignore[attr-defined]


def _one_past(limit: int) -> int:
    """The SQL ``LIMIT`` that reads one row past ``limit`` (to tell whether more follow),
    within SQLite's int64: a limit of 2**63 - 1 reads them all anyway."""
    return min(limit + 1, 2**63 - 1)


def _take(blobs: Iterator[bytes], limit: int, max_bytes: int) -> tuple[list[bytes], bool]:
    """Up to ``limit`` (-1: any number of) blobs totalling at most ``max_bytes``, and
    whether any is left; reads at most one blob past the cut."""
    taken: list[bytes] = []
    size = 0
    for blob in blobs:
        size += len(blob)
        if len(taken) == limit or size > max_bytes:
            if not taken and limit != 0:
                raise ResultTooLarge(f"an event of {len(blob)} bytes", max_bytes)
            return taken, True
        taken.append(blob)
    return taken, False
