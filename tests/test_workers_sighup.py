"""SIGHUP to ``peerwire serve --workers N``: a rolling restart of every worker while the
parent keeps the port, and clients calling throughout. Real processes on 127.0.0.1.

Before, the parent died by SIGHUP's default action (its metrics directory left behind),
its workers stopping on their own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import wait_until as until
from tests.test_workers import (
    API,
    SERVE,
    Running,
    answering_pids,
    is_running,
    slow_request_in_flight,
)

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sys.platform == "win32", reason="worker processes need fork (POSIX)"),
]


class Callers:
    """Two reconnecting clients calling ``pid`` in a loop until :meth:`stop`: ``steady`` on
    one client, ``fresh`` on a new client (connection) per call. Every call is
    ``idempotent``: one whose connection an old worker closes in its drain before it
    answers (it may accept a connection whose request has not come yet) is sent again on
    the client's next connection, as a stop's drain requires too."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.steady: list[Any] = []  # a pid, or the exception a call raised
        self.fresh: list[Any] = []
        self.done = asyncio.Event()
        self.tasks = [asyncio.ensure_future(self._steady()), asyncio.ensure_future(self._fresh())]

    async def _steady(self) -> None:
        async with rpc.connect(self.url, connect_timeout=5) as peer:
            while not self.done.is_set():
                try:
                    self.steady.append(await peer.request("pid", idempotent=True, timeout=10))
                except Exception as exc:  # counted: the test asserts none
                    self.steady.append(exc)

    async def _fresh(self) -> None:
        while not self.done.is_set():
            try:
                async with rpc.connect(self.url, connect_timeout=5) as peer:
                    self.fresh.append(await peer.request("pid", idempotent=True, timeout=10))
            except Exception as exc:
                self.fresh.append(exc)

    async def stop(self) -> None:
        self.done.set()
        await asyncio.gather(*self.tasks)


@pytest.mark.parametrize("shared", [False, True], ids=["reuse-port", "shared-socket"])
async def test_sighup_restarts_every_worker_while_serving(tmp_path: Path, shared: bool) -> None:
    """``peerwire serve`` with ``--metrics`` (SO_REUSEPORT: a socket per worker), and
    ``serve_workers(reuse_port=False)`` (every worker accepts from the parent's socket)."""
    env = ["env", f"TMPDIR={tmp_path}"]
    if shared:
        args = [*API, "--shared-socket", "tcp+gotalk://127.0.0.1:0"]
    else:
        args = [*SERVE, "--workers=2", "--listen=tcp+gotalk://127.0.0.1:0",
                "--metrics=127.0.0.1:0", "--drain-timeout=2"]  # fmt: skip
    server = Running([*env, *args])
    callers: Callers | None = None
    new: set[int] = set()
    try:
        [url] = await asyncio.to_thread(server.urls, 1)
        if not shared:
            assert [p.name for p in tmp_path.iterdir() if p.name.endswith("-peerwire-metrics")]
        old = await answering_pids(url, lambda pids: len(pids) == 2)

        # SIGHUP to a worker itself does not end it: it answers on its connection after
        held = await rpc.connect(url, connect_timeout=5, reconnect=False)
        worker = await held.request("pid", timeout=10)
        os.kill(worker, signal.SIGHUP)
        assert await held.request("pid", timeout=10) == worker

        callers = Callers(url)
        await until(lambda: len(callers.steady) >= 5 and len(callers.fresh) >= 5, 10)
        server.process.send_signal(signal.SIGHUP)
        # the old workers drain (closing our held connection) and are reaped by the parent
        await asyncio.wait_for(held.closed, 10)
        await until(lambda: not any(is_running(pid) for pid in old), 10)
        new = await answering_pids(url, lambda pids: len(pids) == 2, timeout=10)
        assert not new & old
        await until(  # each client is served by a new worker too
            lambda: set(callers.steady[-3:]) <= new and set(callers.fresh[-3:]) <= new, 10
        )
        await callers.stop()
        assert server.process.poll() is None, server.output("stderr")  # the parent lives on
        # no call failed (one cut by a drain is sent again on its client's next connection)
        assert [r for r in callers.steady if not isinstance(r, int)] == []
        assert [r for r in callers.fresh if not isinstance(r, int)] == []
        assert set(callers.steady) & old and set(callers.fresh) & old  # served before, too
    finally:
        if callers is not None and not callers.done.is_set():
            await callers.stop()
        code = await asyncio.to_thread(server.stop)
        server.kill()
    assert code == 0, server.output("stderr")
    assert not [pid for pid in new if is_running(pid)]
    assert list(tmp_path.iterdir()) == []  # the parent removed its multiprocess directory
    stderr = server.output("stderr")
    assert "exited with" not in stderr and "restarting in" not in stderr, stderr


async def test_sighup_while_stopping_is_ignored() -> None:
    server = Running([*SERVE, "-v", "--workers=2", "--listen=tcp+gotalk://127.0.0.1:0"])
    try:
        pids, peer, request, serving = await slow_request_in_flight(server)
        server.process.send_signal(signal.SIGTERM)
        server.process.send_signal(signal.SIGHUP)  # during the drain: no restart, no kill
        assert await request == serving  # drained as on a plain SIGTERM
        begun = time.monotonic()
        assert await asyncio.to_thread(server.wait) == 0, server.output("stderr")
        assert time.monotonic() - begun < 5
        assert not [pid for pid in pids if is_running(pid)]
        stderr = server.output("stderr")
        assert "SIGHUP" not in stderr and stderr.count(" started: pid") == 2, stderr
        await peer.close()
    finally:
        server.kill()
