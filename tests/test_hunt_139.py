"""Hunt 139: ``peerwire serve --workers N`` and the TLS transport against real processes
and sockets on 127.0.0.1.

A SIGTERM to the parent while a worker was starting (between its fork and its own signal
set-up) went to the parent's own handler, inherited by the child, which only counted it:
the worker then served on, and the stop waited ``drain_timeout`` + 5 s to kill it."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from tests.test_workers import Running, is_running

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sys.platform == "win32", reason="worker processes need fork (POSIX)"),
]

SLOW_FORK_APP = """
import os
import time

import rpc

registry = rpc.Registry()


@registry.handle("pid")
def pid(value):
    return os.getpid()


def slow_start():  # a library's at-fork hook that takes a while, in every worker
    print(f"forked {os.getpid()}", flush=True)
    time.sleep(2.0)


os.register_at_fork(after_in_child=slow_start)
"""


async def test_sigterm_while_workers_start_stops_them_at_once(tmp_path: Path) -> None:
    """The parent is told to stop while its workers are still in their start (here an
    at-fork hook of 2 s): each worker ends as soon as its start is over, and the parent
    with them, well before the 10 s (drain + kill grace) after which it kills them."""
    module = tmp_path / "slow_fork_app.py"
    module.write_text(SLOW_FORK_APP)
    serve = [sys.executable, "-m", "rpc.cli", "serve", str(module)]
    server = Running([*serve, "--workers=2", "--listen=tcp+gotalk://127.0.0.1:0"])
    try:
        lines = await asyncio.to_thread(server.wait_lines, "stdout", "forked ", 2)
        pids = [int(line.split()[-1]) for line in lines]
        server.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(server.exit_code, 6)
        assert code == 0, server.output("stderr")  # None: still running (was 10 s)
        assert "did not stop in time" not in server.output("stderr")
        assert "listening on" not in server.output("stdout")
        assert not [pid for pid in pids if is_running(pid)]
    finally:
        server.kill()
