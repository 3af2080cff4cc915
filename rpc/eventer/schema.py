"""The Eventer database's tables (``PRAGMA user_version`` = :data:`SCHEMA_VERSION`) and the
migration of older versions; :mod:`rpc.eventer.store` describes the layout and runs both in
one transaction when it opens a file."""

from __future__ import annotations

import logging
import sqlite3

from rpc.eventer import common

log = logging.getLogger("peerwire.eventer.store")

SCHEMA_VERSION = 2
"""The layout this code writes; version 1 files are migrated on open, version 0 ones are new."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS event_types (
    id INTEGER PRIMARY KEY,
    type TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS events (
    server INTEGER NOT NULL,
    session INTEGER NOT NULL,
    instance INTEGER NOT NULL,
    type_id INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    source_ts BLOB,
    data BLOB NOT NULL,
    PRIMARY KEY (server, session, instance)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
CREATE INDEX IF NOT EXISTS events_source_ts ON events (source_ts) WHERE source_ts IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_type_ts ON events (type_id, ts);
CREATE INDEX IF NOT EXISTS events_type_source_ts ON events (type_id, source_ts)
    WHERE source_ts IS NOT NULL;
CREATE TABLE IF NOT EXISTS latest (
    type_id INTEGER PRIMARY KEY,
    server INTEGER NOT NULL,
    session INTEGER NOT NULL,
    instance INTEGER NOT NULL,
    ts INTEGER NOT NULL
);
"""


def create_tables(conn: sqlite3.Connection) -> None:
    """Create what is missing of the layout and set the version. Runs inside the caller's
    transaction."""
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def migrate_source_keys(conn: sqlite3.Connection) -> None:
    """Version 1 -> 2: integer (clamped) source timestamps become exact timestamp keys,
    recomputed from each event's stored bytes. Runs inside the caller's transaction."""
    rows = conn.execute(
        "SELECT server, session, instance, data FROM events WHERE source_ts IS NOT NULL"
    ).fetchall()
    updates = []
    for server, session, instance, data in rows:
        source = common.decode("HatEventer.Event", data)["sourceTimestamp"][1]
        key = common.timestamp_key(source["s"], source["us"])
        updates.append((key, server, session, instance))
    conn.executemany(
        "UPDATE events SET source_ts = ? WHERE server = ? AND session = ? AND instance = ?",
        updates,
    )
    log.info("migrated %d source timestamps to schema version %d", len(updates), SCHEMA_VERSION)
