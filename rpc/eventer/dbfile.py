"""The Eventer's database file as the operating system sees it: the lock that keeps a
second server off it, and why SQLite could not open or write it (SQLite's own text says
only "unable to open" or "attempt to write a readonly database", naming neither the file
nor the folder at fault)."""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path


def lock(path: str) -> int:
    """An exclusive ``flock`` on the (existing) file ``path``: its descriptor, which holds
    the lock until it is closed; the kernel drops it when the process dies, however it
    dies. Independent of SQLite's own (POSIX, byte-range) locks. Raises OSError:
    BlockingIOError while another descriptor holds it (another server, in this process
    or another)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_failure(path: str, exc: sqlite3.Error) -> str:
    """Why SQLite could not open ``path``."""
    target = Path(path)
    if target.is_dir():
        return "it is a directory"
    if not target.parent.is_dir():
        return f"no such directory {target.parent}"
    if target.exists() and not os.access(target, os.R_OK | os.W_OK):
        return "permission denied"
    if not target.exists() and not os.access(target.parent, os.W_OK | os.X_OK):
        return f"permission denied to create it in {target.parent}"
    return str(exc)


def write_failure(path: str, exc: sqlite3.Error) -> str:
    """Why SQLite could not write ``path`` once open: the file, or a folder it cannot
    create the ``-wal``/``-shm`` files in (WAL mode needs them beside the file); else
    SQLite's own text (a file that is no database, say)."""
    if exc.sqlite_errorname.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
        folder = Path(path).parent
        if not os.access(path, os.R_OK | os.W_OK):
            return "permission denied"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"cannot create {path}-wal in {folder} (permission denied)"
    return str(exc)
