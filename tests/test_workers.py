"""``peerwire serve --workers N`` and :func:`rpc.workers.serve_workers` as a user runs them:
real processes on 127.0.0.1, port 0 resolved once by the parent, clients in this process.

Every worker answers ``pid`` with its process id (``tests/peers/worker_app.py``), so a test
sees which worker served each new connection.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import rpc
from rpc import workers

ROOT = Path(__file__).resolve().parent.parent
APP = "tests/peers/worker_app.py"
SERVE_MODULE = [sys.executable, "-m", "rpc.cli", "serve"]
"""``peerwire serve``, then the module to serve."""
SERVE = [*SERVE_MODULE, APP]
API = [sys.executable, APP]

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(sys.platform == "win32", reason="worker processes need fork (POSIX)"),
]


class Running:
    """A process whose stdout and stderr lines threads collect, so no read can hang."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.changed = threading.Condition()
        self.pumps = [
            threading.Thread(target=self._pump, args=(name, stream), daemon=True)
            for name, stream in (("stdout", self.process.stdout), ("stderr", self.process.stderr))
        ]
        for pump in self.pumps:
            pump.start()

    def _pump(self, name: str, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self.changed:
                self.lines[name].append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_lines(
        self, name: str, containing: str, count: int = 1, timeout: float = 20
    ) -> list[str]:
        """The first ``count`` lines of stream ``name`` that contain ``containing``."""

        def found() -> list[str]:
            return [line for line in self.lines[name] if containing in line]

        with self.changed:
            if not self.changed.wait_for(
                lambda: len(found()) >= count or self.process.poll() is not None, timeout
            ):
                raise AssertionError(f"no {count} x {containing!r} in {name} within {timeout} s")
            if len(found()) < count:
                raise AssertionError(f"exited {self.process.poll()}: {self.output('stderr')}")
            return found()[:count]

    def urls(self, count: int) -> list[str]:
        return [line.split()[-1] for line in self.wait_lines("stdout", "listening on ", count)]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Signal the process and wait for it and its output; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.wait(timeout)

    def exit_code(self, timeout: float) -> int | None:
        """The exit code, or None if the process still runs ``timeout`` s from now."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float = 20) -> int:
        """Wait for the process to exit by itself and for its output; its exit code."""
        code = self.process.wait(timeout)
        for pump in self.pumps:
            pump.join(timeout)
        return code

    def output(self, name: str) -> str:
        with self.changed:
            return "\n".join(self.lines[name])

    def kill(self) -> None:
        """For a ``finally``: the process killed if it still runs, reaped, and its pipes
        closed once their readers are done (left to the GC, they warn)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        streams = (self.process.stdout, self.process.stderr)
        for pump, stream in zip(self.pumps, streams, strict=True):
            pump.join(10)  # EOF once every worker, which inherits the pipes, is gone
            if not pump.is_alive() and stream is not None:
                stream.close()


async def ask(url: str, op: str, value: object = None) -> object:
    """One request on a new connection (so the kernel may pick another worker)."""
    async with rpc.connect(url, connect_timeout=5) as peer:
        return await peer.request(op, value, timeout=10)


async def answering_pids(
    url: str, done: Callable[[set[int]], bool], timeout: float = 20
) -> set[int]:
    """Pids answering ``pid`` on new connections, until ``done(pids)`` or ``timeout``."""
    pids: set[int] = set()
    deadline = time.monotonic() + timeout
    while not done(pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"only pids {pids} answered {url} within {timeout} s")
        pid = await ask(url, "pid")
        assert isinstance(pid, int)
        pids.add(pid)
    return pids


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def loop_module(loop: str) -> str:
    return "uvloop" if loop == "uvloop" else "asyncio.unix_events"


# --- serving -------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_cli_serves_gotalk_and_hatchatter_on_each_loop(loop: str, count: int) -> None:
    server = Running(
        [
            *SERVE,
            f"--workers={count}",
            f"--loop={loop}",
            "--listen=tcp+gotalk://127.0.0.1:0",
            "--listen=tcp+sbs://127.0.0.1:0",
        ]
    )
    try:
        gotalk, sbs = await asyncio.to_thread(server.urls, 2)
        for url in (gotalk, f"{sbs}?dialect=HatChatter"):
            pids = await answering_pids(url, lambda pids: len(pids) == count)
            answers = await asyncio.gather(*(ask(url, "loop") for _ in range(4)))
            assert {module for _, module in answers} == {loop_module(loop)}  # type: ignore[misc]
            assert {pid for pid, _ in answers} <= pids  # type: ignore[misc]
            # one worker: this very process serves; more: forked workers, not the parent
            assert (server.process.pid in pids) == (count == 1)
        assert await asyncio.to_thread(server.stop) == 0, server.output("stderr")
        # the bound URLs were printed once, by the parent, not by each worker
        assert server.output("stdout").count("listening on ") == 2
    finally:
        server.kill()


async def test_api_with_the_parents_socket_shared() -> None:
    """``reuse_port=False``: the workers accept from the parent's listening socket (the
    path taken where SO_REUSEPORT does not spread connections), on a WebSocket URL too."""
    server = Running([*API, "--shared-socket", "tcp+gotalk://127.0.0.1:0", "ws+sbs://127.0.0.1:0"])
    try:
        tcp, ws = await asyncio.to_thread(server.urls, 2)
        assert rpc.parse_url(ws).path == "/gotalk/"
        for url in (tcp, ws):
            pids = await answering_pids(url, lambda pids: len(pids) == 2)
            assert server.process.pid not in pids
        assert await asyncio.to_thread(server.stop) == 0, server.output("stderr")
        assert server.output("stdout").count("listening on ") == 2
    finally:
        server.kill()


# --- shutdown and restarts -----------------------------------------------------------------


async def slow_request_in_flight(
    server: Running,
) -> tuple[set[int], rpc.Peer[Any], asyncio.Future[Any], int]:
    """Once both workers of ``server`` answer, a ``slow`` request (1 s) in flight on one:
    the workers' pids, the request's connection and future, and the pid serving it."""
    [url] = await asyncio.to_thread(server.urls, 1)
    pids = await answering_pids(url, lambda pids: len(pids) == 2)
    peer = await rpc.connect(url, reconnect=False)
    request = asyncio.ensure_future(peer.request("slow", 1.0, timeout=20))
    [started] = await asyncio.to_thread(server.wait_lines, "stdout", "slow started")
    return pids, peer, request, int(started.split()[-1])


@pytest.mark.parametrize("shared", [False, True], ids=["reuse-port", "shared-socket"])
async def test_sigterm_stops_every_worker_after_requests_in_flight(shared: bool) -> None:
    args = [*API, "--shared-socket"] if shared else [*SERVE, "--workers=2", "--listen"]
    server = Running([*args, "tcp+gotalk://127.0.0.1:0"])
    try:
        pids, peer, request, serving = await slow_request_in_flight(server)
        server.process.send_signal(signal.SIGTERM)
        # the request in flight completes: the worker drains before it closes
        assert await request == serving
        async with asyncio.timeout(10):
            await peer.closed  # then the worker closed our connection
        # and the parent exits by itself: a second SIGTERM here could find it past its own
        # handlers (restored as serve_workers returns), where the default action kills it
        assert await asyncio.to_thread(server.wait) == 0, server.output("stderr")
        assert not [pid for pid in pids if is_running(pid)]  # every worker stopped and reaped
        assert "did not stop in time" not in server.output("stderr")
    finally:
        server.kill()


async def test_a_killed_worker_is_replaced() -> None:
    server = Running([*SERVE, "--workers=2", "--listen=tcp+gotalk://127.0.0.1:0"])
    try:
        [url] = await asyncio.to_thread(server.urls, 1)
        first = await answering_pids(url, lambda pids: len(pids) == 2)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        # once the parent saw it die (connections the victim had queued are lost with it),
        # the survivor keeps answering, and soon a new worker answers beside it
        await asyncio.to_thread(
            server.wait_lines, "stderr", f"(pid {victim}) exited with signal SIGKILL"
        )
        later = await answering_pids(url, lambda pids: bool(pids - first))
        assert victim not in later
        assert await asyncio.to_thread(server.stop) == 0, server.output("stderr")
        assert server.output("stdout").count("listening on ") == 1
    finally:
        server.kill()


async def test_a_worker_failing_at_start_is_restarted_with_back_off() -> None:
    server = Running([*API, "--workers=1", "--crash-at-start", "tcp+gotalk://127.0.0.1:0"])
    try:
        lines = await asyncio.to_thread(server.wait_lines, "stderr", "restarting in", 4)
        delays = [float(re.findall(r"restarting in ([\d.]+) s", line)[0]) for line in lines]
        assert delays == [0.1, 0.2, 0.4, 0.8]
        # SIGTERM during a back-off ends the parent at once, and it never claimed to serve
        assert await asyncio.to_thread(server.stop, signal.SIGTERM, 10) == 0
        assert "listening on" not in server.output("stdout")
    finally:
        server.kill()


# --- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*SERVE, "--workers=0", "--listen=tcp+gotalk://127.0.0.1:0"], "at least 1"),
        (
            [sys.executable, "-m", "rpc.cli", "eventer", "serve", "--config=x.toml", "--workers=2"],
            "runs in one process",
        ),
    ],
    ids=["zero", "eventer"],
)
def test_bad_worker_counts_exit_2(args: list[str], message: str) -> None:
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert message in done.stderr


def test_bind_listeners_resolves_port_zero_once_and_holds_it() -> None:
    [listener] = workers.bind_listeners(["tcp+gotalk://127.0.0.1:0"], reuse_port=workers.REUSE_PORT)
    try:
        port = listener.url.port
        assert port > 0
        assert [address[1] for _, address in listener.addresses] == [port]
        with pytest.raises(OSError):  # reserved: an ordinary server cannot take the port
            socket.create_server(("127.0.0.1", port)).close()
    finally:
        workers.close_listeners([listener])


def test_serve_workers_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        workers.serve_workers("tcp+gotalk://127.0.0.1:0", workers=0)
    with pytest.raises(ValueError, match="needs an ssl="):
        workers.serve_workers("ssl+gotalk://127.0.0.1:0", workers=2)
    with pytest.raises(ValueError, match="unknown event loop"):
        workers.serve_workers("tcp+gotalk://127.0.0.1:0", workers=2, loop="trio")
