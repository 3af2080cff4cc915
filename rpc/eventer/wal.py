"""The Eventer database's write-ahead log, kept to a bounded size on disk.

SQLite's own checkpoints are off (``wal_autocheckpoint=0``: they would run inside commits).
Instead :func:`checkpoint` copies the log into the database on a connection and thread of
its own (PASSIVE, blocking nobody), and ``journal_size_limit`` (a quarter of
``max_wal_bytes``) makes the commit that restarts the log (after a complete checkpoint, once
no reader uses the log) cut the file back: without it the file keeps its high-water size for
good. While readers keep overlapping (or commits keep coming during the copy), a PASSIVE
checkpoint never completes and the log never restarts, so it would grow without bound:
:func:`truncate` then copies the rest and empties the file, waiting for older readers up to
:data:`TRUNCATE_ATTEMPTS` times :data:`TRUNCATE_WAIT_MS`. When each runs is the writer's
choice (:mod:`rpc.eventer.writer`)."""

from __future__ import annotations

import os
import sqlite3

MAX_WAL_BYTES = 64 * 1024 * 1024
"""Default ``max_wal_bytes``: the size the ``-wal`` file is kept under."""
TRUNCATE_WAIT_MS = 100
"""Milliseconds each try of :func:`truncate` waits for readers on older snapshots to end
(commits wait meanwhile)."""
TRUNCATE_ATTEMPTS = 2
"""Tries of :func:`truncate` before it gives up, to be tried again later."""


def configure(conn: sqlite3.Connection, max_wal_bytes: int) -> None:
    """The writer connection's WAL settings (it never checkpoints inside a commit)."""
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(f"PRAGMA journal_size_limit={max_wal_bytes // 4}")


def checkpoint(conn: sqlite3.Connection) -> bool:
    """A PASSIVE checkpoint on ``conn`` (not the writer's): True when the whole log was
    copied (the next commit then restarts it), False when a reader's older snapshot, or
    commits made meanwhile, kept part of it."""
    _, log_frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return bool(log_frames == copied)


def truncate(conn: sqlite3.Connection) -> bool:
    """A TRUNCATE checkpoint on the writer connection, between commits: copies what is
    left of the log and empties the file. Up to :data:`TRUNCATE_ATTEMPTS` tries, each
    waiting up to :data:`TRUNCATE_WAIT_MS` for readers on older snapshots (a try that
    gives up has usually copied the log meanwhile, and the next one only waits for the
    readers to move on). False when they did not (nothing is lost: the log stays)."""
    busy_ms = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    conn.execute(f"PRAGMA busy_timeout={TRUNCATE_WAIT_MS}")
    try:
        for _ in range(TRUNCATE_ATTEMPTS):
            if not conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
                return True
        return False
    finally:
        conn.execute(f"PRAGMA busy_timeout={busy_ms}")


def size(path: str) -> int:
    """Bytes of the ``-wal`` file beside the database ``path``: 0 without one, or when it
    cannot be looked at (the next commit looks again; the writer must not stop for it)."""
    try:
        return os.stat(path + "-wal").st_size
    except OSError:
        return 0
