"""``peerwire serve --workers N`` whose parent is killed (SIGKILL): its workers drain, then end
by themselves :data:`rpc.workers.KILL_GRACE` past the drain, as the parent would have killed
them, even when what a handler left running holds their exit. Real processes on 127.0.0.1;
the grace is made short by the served module (``rpc.workers.KILL_GRACE``, read when serving
starts).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.test_workers import SERVE_MODULE as SERVE
from tests.test_workers import Running, answering_pids, is_running

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sys.platform == "win32", reason="worker processes need fork (POSIX)"),
]

URL = "tcp+gotalk://127.0.0.1:0"

HELD_EXIT = """
import os
import threading
import time

import rpc.workers

from tests.peers.worker_app import registry  # answers "pid"

rpc.workers.KILL_GRACE = 0.3  # the test's: a worker stuck past its drain ends 0.3 s later


def hold_the_exit() -> None:  # what a handler may leave: a thread the process's end joins
    threading.Thread(target=time.sleep, args=(60,), daemon=False).start()


os.register_at_fork(after_in_child=hold_the_exit)
"""


async def test_workers_of_a_killed_parent_end_after_drain_and_grace(tmp_path: Path) -> None:
    """Before, each worker drained, then waited on the thread (60 s here; for good with a
    task that ignores cancellation): an orphan nobody would kill."""
    module = tmp_path / "held_exit.py"
    module.write_text(HELD_EXIT)
    server = Running([*SERVE, str(module), "--workers=2", "--drain-timeout=0.1", f"--listen={URL}"])
    pids: set[int] = set()
    try:
        [url] = await asyncio.to_thread(server.urls, 1)
        pids = await answering_pids(url, lambda pids: len(pids) == 2)
        server.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.to_thread(server.process.wait)
        # the pipes reach EOF once every worker, which inherited them, has exited
        for pump in server.pumps:
            await asyncio.to_thread(pump.join, 5)
        assert not [pump for pump in server.pumps if pump.is_alive()], "a worker lives on"
        assert time.monotonic() - killed < 5
        stderr = server.output("stderr")
        assert stderr.count("still running 0.4 s after its parent died: exiting") == 2, stderr
    finally:
        for pid in pids:  # an orphan left by a failure
            if is_running(pid):
                os.kill(pid, signal.SIGKILL)
        server.kill()
