"""The Eventer under the conditions of real deployments (found by helper-113): a second
server started on the same database, config values the server cannot use, start-up errors
that must be one line naming what failed, a database it cannot write, another
application's database. (A database whose pages are corrupt is not checked at start: see
docs/eventer.md.)"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rpc.eventer import EventerServer
from rpc.eventer.common import QueryServerParams, QueryTimeseriesParams
from rpc.eventer.config import ConfigError, config_from_dict
from rpc.eventer.store import StoreError
from tests.peers.eventer_helpers import json_event, server_config

ROOT = Path(__file__).resolve().parents[1]
HIGH_WATER = 256 * 1024
"""The core's default ``high_water`` (docs/limits.md)."""


def run_cli(config: Path, *, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [*prefix, sys.executable, "-m", "rpc.eventer", "serve", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr without the server's own INFO log lines."""
    return [line for line in result.stderr.splitlines() if not line.startswith("INFO ")]


# --- one database, one server -------------------------------------------------------------


async def test_a_second_server_on_the_same_database_is_refused(tmp_path: Path) -> None:
    """The server owns its database (``--workers`` must be 1 for that reason): it assigns
    session and type ids from what it read at open. A second server on the same file
    (a restart overlapping the old process, two units pointing at one path) used to start,
    and then each server's sessions collided with the other's: the first one's
    registrations failed (``UNIQUE constraint failed``) while the second one's went in."""
    config = server_config(tmp_path)
    async with EventerServer(config) as first:
        second = EventerServer(config)
        try:
            with pytest.raises(StoreError, match=r"events\.db"):
                await second.start()
        finally:
            await second.close()
        registered = await first.register([json_event(("still", "mine"), 1)])
        assert registered is not None, "the first server's registrations fail"
    async with EventerServer(config) as third:  # closed: the database is free again
        assert await third.register([json_event(("next",), 1)]) is not None


async def test_a_server_killed_with_sigkill_leaves_the_database_free(tmp_path: Path) -> None:
    """The lock is the kernel's (flock): a server killed without its stop (SIGKILL, OOM
    killer, power loss) must not keep the next one from starting."""
    config = tmp_path / "c.toml"
    config.write_text('listen = "tcp+sbs://127.0.0.1:0"\ndatabase = "events.db"\n')
    for _ in range(2):
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "rpc.eventer", "serve", "--config", str(config)),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        if not line:
            pytest.fail((await proc.stderr.read()).decode()[-2000:])
        assert line.startswith("listening on "), line
        proc.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(proc.wait(), 20) == -signal.SIGKILL


# --- config values the server cannot use --------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        # SBS Integer is an int64: the STARTED event cannot be encoded (a traceback)
        ("server_id", 2**63),
        # every events_ack notification fails (``int(nan * 1000)``): none is ever sent
        ("ack_timeout", math.nan),
        # every query without max_results fails: SQLite cannot take LIMIT 2**63 + 1
        ("max_query_results", 2**63),
    ],
)
def test_config_values_the_server_cannot_use_are_refused(key: str, value: Any) -> None:
    data = {"listen": "tcp+sbs://127.0.0.1:0", "database": ":memory:", key: value}
    with pytest.raises(ConfigError, match=key):
        config_from_dict(data)


async def test_the_largest_max_query_results_is_usable(tmp_path: Path) -> None:
    """The largest value the config takes (int64) must work: the store reads one row past
    the limit, and ``LIMIT 2**63`` overflowed SQLite's integer (every query failed)."""
    config = server_config(tmp_path, max_query_results=2**63 - 1)
    async with EventerServer(config) as server:
        await server.register([json_event(("a",), 1)])
        result = await server.query(QueryTimeseriesParams(event_types=[("a",)]))
        assert [event.type for event in result.events] == [("a",)]
        result = await server.query(QueryServerParams(config.server_id))
        assert len(result.events) == 2 and not result.more_follows  # STARTED and ("a",)


def test_a_server_id_beyond_int64_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(
        'listen = "tcp+sbs://127.0.0.1:0"\ndatabase = ":memory:"\nserver_id = 9223372036854775808\n'
    )
    result = run_cli(tmp_path / "c.toml")
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(error_lines(result)) == 1 and "server_id" in result.stderr


# --- start-up errors: one line that names what failed -------------------------------------


def test_a_certificate_that_cannot_be_loaded_is_named(tmp_path: Path) -> None:
    """Before: ``peerwire eventer: [SSL] PEM lib (_ssl.c:3905)``, no file named."""
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    (tmp_path / "c.toml").write_text(
        'listen = "ssl+sbs://127.0.0.1:0"\ndatabase = ":memory:"\n[tls]\ncert = "bad.pem"\n'
    )
    result = run_cli(tmp_path / "c.toml")
    assert result.returncode in (2, 3), result.stderr[-2000:]
    [line] = error_lines(result)
    assert line.startswith("peerwire eventer: ") and "bad.pem" in line, line


def test_an_address_it_cannot_resolve_is_named(tmp_path: Path) -> None:
    """Before: ``peerwire eventer: [Errno -2] Name or service not known``."""
    (tmp_path / "c.toml").write_text(
        'listen = "tcp+sbs://no-such-host.invalid:0"\ndatabase = ":memory:"\n'
    )
    result = run_cli(tmp_path / "c.toml")
    assert result.returncode == 3, result.stderr[-2000:]
    [line] = error_lines(result)
    assert "no-such-host.invalid" in line, line


def test_a_database_path_with_a_nul_is_one_line(tmp_path: Path) -> None:
    """Before: a ValueError traceback (``embedded null character``), exit 1."""
    (tmp_path / "c.json").write_text(
        json.dumps({"listen": "tcp+sbs://127.0.0.1:0", "database": "ev\u0000.db"})
    )
    result = run_cli(tmp_path / "c.json")
    assert result.returncode in (2, 3), result.stderr[-2000:]
    assert len(error_lines(result)) == 1, result.stderr[-2000:]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder another user can reach (pytest's tmp_path is private to its user)."""
    path = Path(tempfile.mkdtemp(prefix="eventer-hunt-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        path.chmod(0o755)
        shutil.rmtree(path)


def test_a_database_in_a_folder_it_cannot_write_names_the_folder(shared_dir: Path) -> None:
    """A writable database file in a folder the server cannot write: SQLite (WAL mode)
    cannot create ``-wal``/``-shm`` beside it. Before: ``.../ev.db: attempt to write a
    readonly database``, which blames the file (writable) rather than the folder."""
    database = shared_dir / "ev.db"
    sqlite3.connect(database).close()
    database.chmod(0o666)
    config = shared_dir / "c.json"
    config.write_text(json.dumps({"listen": "tcp+sbs://127.0.0.1:0", "database": "ev.db"}))
    config.chmod(0o644)
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:  # root writes anywhere: run the server as nobody
        setpriv = shutil.which("setpriv")
        assert setpriv is not None, "needs setpriv (util-linux) when run as root"
        prefix = (setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups")
    else:
        shared_dir.chmod(0o555)
    result = run_cli(config, prefix=prefix)
    assert result.returncode == 3, result.stderr[-2000:]
    [line] = error_lines(result)
    assert line.startswith(f"peerwire eventer: cannot open database {database}: "), line
    assert str(shared_dir) in line.removeprefix(
        f"peerwire eventer: cannot open database {database}"
    )


async def test_a_database_of_another_application_is_refused_and_left_alone(
    tmp_path: Path,
) -> None:
    """``database`` pointing at another program's SQLite file (a typo, a shared folder):
    only a version-0 file with a table named ``events`` was refused; any other was taken,
    the Eventer's tables written into it and its ``user_version`` set to 2."""
    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('alice')")
    conn.close()
    server = EventerServer(server_config(tmp_path, database=str(foreign)))
    try:
        with pytest.raises(StoreError, match=r"app\.db"):
            await server.start()
    finally:
        await server.close()
    conn = sqlite3.connect(foreign)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()
    assert (tables, version) == ({"users"}, 0)
