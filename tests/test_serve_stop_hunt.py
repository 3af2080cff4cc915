"""``peerwire serve`` stopping as a service manager or an operator stops it: a second signal
with ``--workers``, a storm of signals while it cleans up, gauges of dead workers in a
``PROMETHEUS_MULTIPROC_DIR`` of the user's, a stdout nobody can read. Real processes and
sockets on 127.0.0.1, bounded by their own waits (a line, an exit), not by fixed sleeps.

Every test here failed on the code it was written against (see each docstring).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, multiprocess

import rpc
from rpc.workers import KILL_GRACE
from tests.test_metrics_workers import one_connection_per_worker
from tests.test_service_hunt import stubborn
from tests.test_service_hunt import write_module as service_module
from tests.test_workers import Running

PEERWIRE = [sys.executable, "-m", "rpc.cli"]
DRAIN = 0.5  # --drain-timeout: a worker stuck past it is killed KILL_GRACE (5 s) later

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and fork"),
]


def write_module(directory: Path, body: str) -> Path:
    """test_service_hunt's module, with a ``pid`` handler."""
    return service_module(directory, "registry.handle('pid')(lambda _: os.getpid())\n\n" + body)


def serve(module: Path, *options: str, env: dict[str, str] | None = None) -> Running:
    return Running(
        [
            *PEERWIRE,
            "serve",
            str(module),
            f"--drain-timeout={DRAIN}",
            "--listen=tcp+gotalk://127.0.0.1:0",
            *options,
        ],
        env=env,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_second_signal_kills_the_workers_at_once(tmp_path: Path) -> None:
    """With ``--workers``, the parent waited the whole kill grace (drain + 5 s) for a
    worker whose handler ignores cancellation, however many SIGTERMs came, where a
    single-process ``serve`` exits at the second signal."""
    module = write_module(tmp_path, stubborn("print('started', os.getpid(), flush=True)"))
    server = serve(module, "--workers=2")
    try:
        [url] = await asyncio.to_thread(server.urls, 1)
        peer = await rpc.connect(url, reconnect=False)
        call = asyncio.ensure_future(peer.request("stubborn", None, timeout=60))
        [line] = await asyncio.to_thread(server.wait_lines, "stdout", "started")
        stuck = int(line.split()[-1])
        server.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(5):
            await peer.closed  # the worker's drain ended: the parent waits for it now
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        server.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(server.exit_code, KILL_GRACE / 2)
        assert code == 0, f"exit {code} after the second SIGTERM: {server.output('stderr')}"
        server.kill()
        assert not alive(stuck)
        assert f"(pid {stuck}) killed at once" in server.output("stderr")
    finally:
        server.kill()


def test_signals_while_cleaning_up_leave_no_metrics_directory(tmp_path: Path) -> None:
    """SIGTERMs that kept coming (an operator's loop of ``kill``, a supervisor's retries)
    once the workers were gone met the start-up handler again, which raised SystemExit at
    each: one in the middle of the removal of the ``--metrics`` multiprocess directory cut
    it short, and the directory stayed. The directory is padded with files here so that
    its removal takes long enough for the storm to hit it (about 1 ms otherwise)."""
    module = write_module(tmp_path, "print('dir', os.environ['PROMETHEUS_MULTIPROC_DIR'])\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    server = serve(module, "--workers=2", "--metrics=127.0.0.1:0", env=env)
    try:
        directory = Path(server.wait_lines("stdout", "dir ")[0].split()[-1])
        server.urls(1)
        for i in range(500):
            (directory / f"padding-{i}").touch()
        end = time.monotonic() + 15
        while server.process.poll() is None and time.monotonic() < end:
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.001)  # the storm's pace, not a wait for anything
        code = server.exit_code(5)
        # a signal after the clean-up, as the process exits, may end it by its default
        assert code in (0, -signal.SIGTERM), server.output("stderr")
        assert not directory.exists(), f"left behind: {len(os.listdir(directory))} files"
        assert list(temp.iterdir()) == []
    finally:
        server.kill()


def gauge_total(directory: Path, name: str) -> float:
    """``name`` as an exporter of ``directory`` would show it (live workers summed)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    return registry.get_sample_value(name) or 0.0


async def test_dead_workers_leave_no_gauges_in_the_users_directory(tmp_path: Path) -> None:
    """With ``PROMETHEUS_MULTIPROC_DIR`` set by the user (who serves the metrics, or runs
    the served module's own gauges), a worker that crashed and was started again kept its
    live gauge in the scrape for good, and every worker's stayed after the stop: the
    parent marked workers dead only with ``--metrics`` and only on a crash."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    module = write_module(
        tmp_path,
        "from prometheus_client import Gauge\n\n"
        "UP = Gauge('stop_app_up', 'up', multiprocess_mode='livesum')\n\n"
        "@registry.handle('up')\n"
        "def up(_):\n"
        "    UP.set(1)\n"
        "    return os.getpid()\n",
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    server = serve(module, "--workers=2", env=env)
    held: dict[int, rpc.Peer] = {}
    try:
        [url] = await asyncio.to_thread(server.urls, 1)
        held, _ = await one_connection_per_worker(url, 2)
        for peer in held.values():
            await peer.request("up", timeout=10)
        assert gauge_total(directory, "stop_app_up") == 2
        victim = min(held)
        os.kill(victim, signal.SIGKILL)
        await asyncio.to_thread(server.wait_lines, "stderr", f"(pid {victim}) exited")
        assert gauge_total(directory, "stop_app_up") == 1  # the survivor's
        assert await held[max(held)].request("up", timeout=10) == max(held)
    finally:
        for peer in held.values():
            await peer.close()
        code = await asyncio.to_thread(server.stop)
        server.kill()
    assert code == 0, server.output("stderr")
    assert gauge_total(directory, "stop_app_up") == 0
    assert directory.is_dir()  # the user's: used, not removed


STDOUT_GONE = {
    # fd 1 closed, as `peerwire serve ... >&-`
    "closed": "import os, sys; os.close(1); os.execv(sys.executable, sys.argv[1:])",
    # a pipe whose reader went away before anything was printed
    "reader gone": "import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); "
    "os.close(w); os.execv(sys.executable, sys.argv[1:])",
}


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("stdout", list(STDOUT_GONE))
async def test_serve_goes_on_without_its_stdout(tmp_path: Path, stdout: str, workers: int) -> None:
    """With a stdout it cannot write, ``serve`` ended at its first line: exit 1 and no
    word (one process), or "cannot serve ...: Broken pipe", exit 3 (``--workers``); with
    fd 1 closed, the loop's epoll or a listening socket took fd 1 (uvloop then aborted at
    the exit, 134) and ``listening on`` was printed nowhere. A service manager's log
    stream can go away: the server must go on, its lines on stderr after a warning."""
    module = write_module(tmp_path, "")
    args = [*PEERWIRE[1:], "serve", str(module), f"--drain-timeout={DRAIN}"]
    args += ["--listen=tcp+gotalk://127.0.0.1:0", f"--workers={workers}"]
    server = Running([sys.executable, "-c", STDOUT_GONE[stdout], sys.executable, *args])
    try:
        [line] = await asyncio.to_thread(server.wait_lines, "stderr", "listening on ", 1, 10)
        assert "cannot write to stdout" in server.output("stderr")
        async with rpc.connect(line.split()[-1], reconnect=False, connect_timeout=5) as peer:
            assert isinstance(await peer.request("pid", timeout=5), int)
        assert await asyncio.to_thread(server.stop) == 0, server.output("stderr")
    finally:
        server.kill()


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_second_signal_during_the_interpreters_exit_exits_0(
    tmp_path: Path, workers: int
) -> None:
    """docs/cli.md: a second signal during the stop, the interpreter's exit included (an
    atexit handler of the served module), ends it at once, exit 0. Before, SIGTERM was back
    at its default once the loop closed (one process) or serving ended (--workers): -15."""
    module = tmp_path / "exit_app.py"
    module.write_text(
        "import atexit, sys, time\nimport rpc\nregistry = rpc.Registry()\n"
        "registry.handle('echo')(lambda v: v)\n"
        "def slow():\n"
        "    print('in atexit', file=sys.stderr, flush=True)\n"
        "    end = time.monotonic() + 30\n"
        "    while time.monotonic() < end:\n"
        "        time.sleep(0.05)\n"
        "atexit.register(slow)\n"
    )
    server = Running(
        [
            sys.executable,
            "-m",
            "rpc.cli",
            "serve",
            str(module),
            "--drain-timeout=0.5",
            "--listen=tcp+gotalk://127.0.0.1:0",
            f"--workers={workers}",
        ]
    )
    try:
        await asyncio.to_thread(server.urls, 1)
        server.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(server.wait_lines, "stderr", "in atexit")
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(server.wait, 40)
        assert code == 0, (code, server.output("stderr"))
        assert time.monotonic() - signalled < 15  # at once, not at the handler's end (30 s)
    finally:
        server.kill()
