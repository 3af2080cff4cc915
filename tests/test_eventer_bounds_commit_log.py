"""A failing disk fails every commit of the Eventer server: each used to log a full
traceback, with no limit (a registration per commit, a traceback per registration). The
writer logs the first in full, counts the others, and says when commits succeed again."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from rpc import eventer
from rpc.eventer import EventerServer
from tests.peers.eventer_helpers import json_event, server_config, url_of

FAILURES = 30


async def test_failed_commits_log_one_traceback_and_a_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="peerwire.eventer.server")
    config = server_config(tmp_path, system_events=False)
    async with EventerServer(config) as server:
        async with await eventer.connect(url_of(server), "disk") as client:
            assert await client.register([json_event(("d",), 0)], with_response=True)
            # another connection to the same file makes every insert fail, as a dying
            # disk would (the server's own connections are left alone)
            with sqlite3.connect(tmp_path / "events.db") as db:
                db.execute(
                    "CREATE TRIGGER fail BEFORE INSERT ON events "
                    "BEGIN SELECT RAISE(ABORT, 'disk I/O error, simulated'); END"
                )
            for i in range(FAILURES):
                assert await client.register([json_event(("d",), i)], with_response=True) is None
            with sqlite3.connect(tmp_path / "events.db") as db:
                db.execute("DROP TRIGGER fail")
            assert await client.register([json_event(("d",), "back")], with_response=True)
    failures = [r for r in caplog.records if "commit of" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert failures[0].exc_info is not None, "the first failure keeps its traceback"
    assert "simulated" in caplog.text
    assert f"commits succeed again, after {FAILURES} failed" in caplog.text
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1
