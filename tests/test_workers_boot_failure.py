"""A worker that exits before it ever served (:data:`rpc.workers.BOOT_ATTEMPTS` times in a
row) ends :func:`rpc.workers.serve_workers` and ``peerwire serve --workers N``; one that
crashes after it served is still restarted. Real processes on 127.0.0.1; the back-off's
first step is made short through :data:`rpc.workers.BACKOFF_FIRST` (read at each exit): in
this process by monkeypatch, in ``peerwire serve`` by the served module, imported before
the workers start.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from rpc import workers
from tests.test_workers import SERVE_MODULE as SERVE
from tests.test_workers import Running, answering_pids, is_running

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sys.platform == "win32", reason="worker processes need fork (POSIX)"),
]

URL = "tcp+gotalk://127.0.0.1:0"

QUICK_BACKOFF = """
import rpc.workers

from tests.peers.worker_app import registry  # answers "pid"

rpc.workers.BACKOFF_FIRST = 0.001  # the test's: attempts 1 ms, 2 ms, 4 ms, ... apart
"""

ONLY_FIRST_FORK_SERVES = """
import os


def first_child_only() -> None:  # a start-up hook that fails in every worker but the first
    try:
        fd = os.open({marker!r}, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        os._exit(3)
    os.write(fd, b"%d" % os.getpid())
    os.close(fd)


os.register_at_fork(after_in_child=first_child_only)
"""


def test_serve_workers_raises_when_a_worker_never_serves(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the worker was started again forever (every 30 s in the end) and
    ``serve_workers`` never returned: the SIGTERM below (a bound) ended it, no error."""
    monkeypatch.setattr(workers, "BACKOFF_FIRST", 0.01)
    bound = threading.Timer(10, os.kill, (os.getpid(), signal.SIGTERM))  # counted by it
    began = time.monotonic()
    bound.start()
    try:
        with (
            caplog.at_level(logging.INFO, logger="peerwire.workers"),
            pytest.raises(workers.WorkerBootFailed) as failed,
        ):
            # rpc.serve refuses the options in the worker, before it can serve
            workers.serve_workers(URL, workers=1, options="not an rpc.Options")
    finally:
        bound.cancel()
    assert time.monotonic() - began < 5
    error = failed.value
    assert (error.worker, error.attempts, error.exitcode) == (0, workers.BOOT_ATTEMPTS, 1)
    assert str(error) == (
        "worker 0 exited before it served, 5 times in a row (the last with code 1): given up"
    )
    pids = [int(pid) for pid in re.findall(r"worker 0 started: pid (\d+)", caplog.text)]
    assert len(pids) == workers.BOOT_ATTEMPTS  # no sixth start
    assert not multiprocessing.active_children()
    assert not [pid for pid in pids if is_running(pid)]


def test_cli_exits_1_and_stops_the_serving_worker(tmp_path: Path) -> None:
    """Worker 0 or 1 (the first forked) serves; the other exits with code 3 at each start.
    Before, ``peerwire serve`` kept retrying and never exited."""
    marker = tmp_path / "serving-pid"
    module = tmp_path / "boot_fails.py"
    module.write_text(QUICK_BACKOFF + ONLY_FIRST_FORK_SERVES.format(marker=str(marker)))
    server = Running([*SERVE, str(module), "--workers=2", f"--listen={URL}"])
    try:
        code = server.exit_code(10)
        assert code == 1, server.output("stderr")
        server.wait()
        stderr = server.output("stderr")
        [line] = [line for line in stderr.splitlines() if line.startswith("peerwire:")]
        assert re.fullmatch(
            rf"peerwire: cannot serve {re.escape(URL)}: worker [01] exited before it served, "
            r"5 times in a row \(the last with code 3\): given up",
            line,
        ), line
        assert "listening on" not in server.output("stdout")  # it never served as a whole
        failed = [int(pid) for pid in re.findall(r"\(pid (\d+)\) exited with code 3", stderr)]
        assert len(failed) == workers.BOOT_ATTEMPTS
        serving = int(marker.read_text())
        # stopped as on SIGTERM: exit 0 (nothing logged for it), not killed
        assert f"(pid {serving})" not in stderr
        assert not [pid for pid in [serving, *failed] if is_running(pid)]
    finally:
        server.kill()


async def test_a_worker_that_crashes_after_serving_is_always_restarted(tmp_path: Path) -> None:
    """One slot's worker killed after it answered, more times than
    :data:`rpc.workers.BOOT_ATTEMPTS`: it served each time, so it is started again each time."""
    module = tmp_path / "quick_backoff.py"
    module.write_text(QUICK_BACKOFF)
    server = Running([*SERVE, str(module), "--workers=2", f"--listen={URL}"])
    try:
        [url] = await asyncio.to_thread(server.urls, 1)
        seen = await answering_pids(url, lambda pids: len(pids) == 2)
        victim = min(seen)  # then always its slot's new worker
        for _ in range(workers.BOOT_ATTEMPTS + 1):
            os.kill(victim, signal.SIGKILL)
            await asyncio.to_thread(
                server.wait_lines, "stderr", f"(pid {victim}) exited with signal SIGKILL"
            )
            [victim] = await answering_pids(url, lambda pids: bool(pids - seen)) - seen
            seen.add(victim)
        assert server.process.poll() is None
        assert await asyncio.to_thread(server.stop) == 0, server.output("stderr")
        assert "before it served" not in server.output("stderr")
    finally:
        server.kill()
