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
choice (:mod:`rpc.eventer.writer`), its thresholds and when the file's size is read at all
:class:`Watch`'s."""

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


FRAME_BYTES = 4096 + 24
"""A page of the log: SQLite's default page size (the store keeps it) and a frame header."""


def log_bound(rows: int, size: int) -> int:
    """Log bytes a commit of ``rows`` events of ``size`` bytes writes at most, with margin:
    8 pages an event (a leaf in each of its 6 b-trees, an overflow page, a split), twice its
    bytes and 16 pages a commit. Measured: 0.08 to 0.45 of it over a run of commits, 0.75
    for one commit that splits pages (a single small event, 30 KiB of log)."""
    return FRAME_BYTES * (16 + 8 * rows) + 2 * size


class Watch:
    """When the writer acts on the ``-wal`` file, from ``max_wal_bytes`` (M), and when it
    must look at the file's size at all.

    The file only grows by what commits write, so its size is at most the last one read
    plus :func:`log_bound` of each commit since: the size is read only once that could pass
    the truncation threshold, or pass the checkpoint threshold and M/32 more was written
    (so a file left at M/4 by a restart is not read after every commit). Past the
    checkpoint threshold that starts a checkpoint up to M/32 late; truncation is not late
    while commits write no more than :func:`log_bound`.
    """

    __slots__ = ("_read", "_size", "_written", "checkpoint_at", "max_bytes", "step", "truncate_at")

    def __init__(self, max_wal_bytes: int) -> None:
        self.max_bytes = max_wal_bytes
        self.step = max_wal_bytes // 8
        """Log bytes a group commit is cut at, and how much further the file may grow
        before a checkpoint or truncation that did not complete is tried again."""
        self.checkpoint_at = 2 * self.step
        """Size past which the next PASSIVE checkpoint starts (M/4 after a complete one)."""
        self.truncate_at = 4 * self.step
        """Size from which the writer truncates the file (M/2 after a truncation)."""
        self._read = max_wal_bytes // 32
        self._size = 0
        self._written: int | None = None
        """Log bytes written since the size was read, at most; None: never read."""

    def wrote(self, log_bytes: int) -> None:
        """A commit (done or failed) that wrote up to ``log_bytes`` of log."""
        if self._written is not None:
            self._written += log_bytes

    def due(self, can_checkpoint: bool) -> bool:
        """Whether the size must be read: it may have reached a threshold."""
        if self._written is None:
            return True
        most = self._size + self._written
        if most >= self.truncate_at:
            return True
        return can_checkpoint and most > self.checkpoint_at and self._written >= self._read

    def fits(self, log_bytes: int) -> bool:
        """Whether a commit of ``log_bytes`` cannot take the file to M (no need to read
        its size before it): False only for a large commit, or before the first read."""
        written = self._written
        return written is not None and self._size + written + log_bytes < self.max_bytes

    def measured(self, size: int) -> None:
        """The size just read (or known: 0 after a truncation)."""
        self._size, self._written = size, 0

    def checkpointed(self, complete: bool, size: int) -> None:
        """A checkpoint ended: the next starts at M/4 (the next commit restarts the log
        and cuts the file back to it) or, when part of the log is left, M/8 further."""
        self.checkpoint_at = 2 * self.step if complete else size + self.step

    def truncated(self, done: bool, size: int) -> None:
        """A truncation ended: thresholds back to M/4 and M/2, or tried again M/8 later."""
        if done:
            self.checkpoint_at, self.truncate_at = 2 * self.step, 4 * self.step
            self.measured(0)
        else:
            self.truncate_at = size + self.step


def configure(conn: sqlite3.Connection, max_wal_bytes: int) -> None:
    """The writer connection's WAL settings (it never checkpoints inside a commit); a
    restarted log is cut back to the checkpoint threshold (:class:`Watch`)."""
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(f"PRAGMA journal_size_limit={Watch(max_wal_bytes).checkpoint_at}")


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
