"""Hunt 139: ``peerwire serve --workers N`` and the TLS transport against real processes
and sockets on 127.0.0.1.

A SIGTERM to the parent while a worker was starting (between its fork and its own signal
set-up) went to the parent's own handler, inherited by the child, which only counted it:
the worker then served on, and the stop waited ``drain_timeout`` + 5 s to kill it.

A second ``--workers`` server started on the port of one already serving started too, and
the kernel spread connections over both (an old and a new version of an app, say): every
socket there has ``SO_REUSEPORT``, which lets any process of the same user join the port."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from rpc import workers_sockets
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
    os.write(1, b"forked %d\\n" % os.getpid())  # one write: the workers share the pipe
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


def test_a_port_another_workers_server_holds_is_not_shared() -> None:
    """``bind_listeners`` refuses a port held by another worker server: its parent's
    reservation (bound with ``SO_REUSEPORT``, not listening), or a worker's listening
    ``SO_REUSEPORT`` socket; as a plain server's listening socket is refused."""
    first = workers_sockets.bind_listeners(["tcp+gotalk://127.0.0.1:0"])
    try:
        url = f"tcp+gotalk://127.0.0.1:{first[0].url.port}"
        with pytest.raises(OSError, match="in use"):  # the parent's reservation
            workers_sockets.close_listeners(workers_sockets.bind_listeners([url]))
        [worker] = workers_sockets.worker_sockets(first[0], workers_sockets.REUSE_PORT)
        try:
            with pytest.raises(OSError, match="in use"):  # a worker listening alone
                workers_sockets.close_listeners(workers_sockets.bind_listeners([url]))
        finally:
            worker.close()
    finally:
        workers_sockets.close_listeners(first)


async def test_a_second_workers_server_on_a_served_port_exits_3(tmp_path: Path) -> None:
    module = tmp_path / "app.py"
    module.write_text("import rpc\nregistry = rpc.Registry()\nregistry.handle('up')(lambda _: 1)\n")
    serve = [sys.executable, "-m", "rpc.cli", "serve", str(module), "--workers=2"]
    first = Running([*serve, "--listen=tcp+gotalk://127.0.0.1:0"])
    second = None
    try:
        [url] = await asyncio.to_thread(first.urls, 1)
        second = Running([*serve, f"--listen={url}"])
        assert await asyncio.to_thread(second.exit_code, 10) == 3, second.output("stdout")
        assert "address already in use" in second.output("stderr").lower()
        assert "listening on" not in second.output("stdout")
    finally:
        first.kill()
        if second is not None:
            second.kill()
