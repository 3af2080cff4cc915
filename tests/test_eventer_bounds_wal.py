"""The Eventer server keeps its SQLite ``-wal`` file under ``max_wal_bytes``.

Before, SQLite's checkpoints were off and a background PASSIVE one ran every 5,000 rows: a
commit per registration writes about 20 KiB of log (the pages of the row and its four
indexes), so 1,000 registrations made a 20 MB file before the first checkpoint, and the
file kept that size for good; while readers overlapped, PASSIVE checkpoints could not
complete and it grew without bound. On that code the 400 registrations of each test below
left an 8.0 MB file (the bound they set is 2 MiB; ``max_wal_bytes`` did not exist)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rpc import eventer
from rpc.eventer import EventerServer
from tests.peers.eventer_helpers import json_event, server_config, url_of

MIB = 1024 * 1024


def wal_bytes(tmp_path: Path) -> int:
    wal = tmp_path / "events.db-wal"
    return wal.stat().st_size if wal.exists() else 0


async def register_one_by_one(
    tmp_path: Path, count: int, started: Callable[[], None] = lambda: None, **config: object
) -> list[int]:
    """``count`` registrations, each waiting for its answer (a commit each); the ``-wal``
    file's size after each. ``started`` runs once the server is."""
    sizes: list[int] = []
    cfg = server_config(tmp_path, system_events=False, **config)
    async with EventerServer(cfg) as server:
        started()
        async with await eventer.connect(url_of(server), "w") as client:
            for i in range(count):
                event = json_event(("w", str(i % 20)), "x" * 200)
                assert await client.register([event], with_response=True)
                sizes.append(wal_bytes(tmp_path))
            result = await client.query(eventer.QueryServerParams(1, max_results=count + 1))
            assert len(result.events) == count
    return sizes


async def test_the_wal_stays_under_max_wal_bytes_with_a_commit_per_registration(
    tmp_path: Path,
) -> None:
    limit = 2 * MIB
    sizes = await register_one_by_one(
        tmp_path, 400, max_wal_bytes=limit, max_message_size=limit // 4
    )
    assert max(sizes) < limit, f"the -wal file reached {max(sizes)} bytes"
    # checkpoints ran and the log restarted: the file does not just keep growing
    assert sizes[-1] <= limit // 2, sizes[-1]


OVERLAPPING_READERS = """
import sqlite3, sys, time
readers = [sqlite3.connect(sys.argv[1], isolation_level=None) for _ in range(2)]
print("ready", flush=True)
while True:  # until killed
    for reader in readers:  # each opens a snapshot while the other still holds one
        if reader.in_transaction:
            reader.execute("COMMIT")
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM event_types").fetchone()
        time.sleep(0.002)  # a reader's work: its snapshot is held meanwhile
"""


async def test_the_wal_stays_under_max_wal_bytes_while_readers_overlap(tmp_path: Path) -> None:
    """Readers of the database file that always overlap (another process's, a backup's)
    keep every PASSIVE checkpoint from completing: the writer truncates the log."""
    limit = 2 * MIB
    readers: list[subprocess.Popen[str]] = []

    def start_readers() -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c", OVERLAPPING_READERS, str(tmp_path / "events.db")],
            stdout=subprocess.PIPE,
            text=True,
        )
        readers.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"

    try:
        sizes = await register_one_by_one(
            tmp_path, 400, start_readers, max_wal_bytes=limit, max_message_size=limit // 4
        )
    finally:
        for proc in readers:
            proc.kill()
            proc.wait()
    assert readers and readers[0].returncode == -9, "the readers did not run to the end"
    assert max(sizes) < limit, f"the -wal file reached {max(sizes)} bytes"


def test_max_wal_bytes_defaults_to_64_mib_and_is_at_least_1_mib() -> None:
    config = eventer.ServerConfig(listen=["tcp+sbs://127.0.0.1:0"])
    assert config.max_wal_bytes == 64 * MIB
    with pytest.raises(eventer.ConfigError, match="max_wal_bytes must be from 1048576"):
        eventer.ServerConfig(listen=["tcp+sbs://127.0.0.1:0"], max_wal_bytes=MIB - 1)
