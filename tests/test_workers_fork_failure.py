"""The workers' supervisor when a fork fails while it restarts a worker.

fork() fails for real when the machine is short of processes or memory (EAGAIN, ENOMEM);
this machine's tests run as root, which RLIMIT_NPROC does not bound, so the failure is
produced by a process context whose ``Process.start`` raises as fork would. Everything
else (the supervisor's loop, its pipes, its back-off) is the real one.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from typing import Any

import pytest

from rpc import workers

pytestmark = pytest.mark.timeout(30)


class ForkFails:
    """A process context whose processes fail to start, as fork() would on EAGAIN; the
    ``attempts``-th attempt stops the supervisor instead (so that its loop returns)."""

    def __init__(self, supervisor: Any, attempts: int) -> None:
        self.supervisor = supervisor
        self.left = attempts
        self.tried_at: list[float] = []

    def Process(self, **_kwargs: Any) -> ForkFails:
        return self

    def start(self) -> None:
        self.tried_at.append(time.monotonic())
        self.left -= 1
        if not self.left:
            self.supervisor.stopping = True
        raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))


def test_a_restart_whose_fork_fails_is_tried_again_after_the_back_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, the OSError of a failed fork at a restart went out of the supervisor's loop:
    every other worker was stopped and ``serve_workers`` raised (``peerwire serve`` said
    "cannot listen on ...", exit 3), hours after it started listening."""
    [listener] = workers.bind_listeners(["tcp+gotalk://127.0.0.1:0"])
    fds = [*os.pipe(), *os.pipe(), *os.pipe()]
    try:
        supervisor = workers._Supervisor([listener], 1, workers.WorkerConfig(), None)
        forks = ForkFails(supervisor, attempts=3)
        supervisor._mp = forks  # type: ignore[assignment]
        [slot] = supervisor.slots
        slot.restart_at = time.monotonic()  # due now: a worker that just exited
        pipes = workers.WorkerPipes(fds[1], fds[2], ())
        with caplog.at_level(logging.WARNING, logger="peerwire.workers"):
            supervisor._supervise(fds[0], fds[4], pipes)
        assert len(forks.tried_at) == 3
        waits = [b - a for a, b in zip(forks.tried_at, forks.tried_at[1:], strict=False)]
        assert waits[0] >= workers.BACKOFF_FIRST * 0.9  # 0.1 s, then 0.2 s: the back-off
        assert waits[1] >= 2 * workers.BACKOFF_FIRST * 0.9
        assert slot.process is None and slot.quick_exits == 3 and slot.restart_at is not None
        assert "worker 0 could not be started" in caplog.text
    finally:
        for fd in fds:
            os.close(fd)
        workers.close_listeners([listener])
